"""The Chat panel: talk to a trained adapter, side by side with its base model, the answers streamed as they are
generated (transformers' TextIteratorStreamer); a system prompt, temperature, top-p and max new tokens as in
`roctune chat`. The last loaded model is kept between messages (`ModelCache`) and one generation runs at a time.

A vision-language model also takes a picture with a message (`roctune chat --image`): the upload is checked at the
border (roctune.data.images) and kept on the server, in the session's state, in the order of the history's
picture messages; the history the browser sends back names files, but the pictures the model sees are only those
the server checked and kept."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from roctune.errors import RoctuneError
from roctune.webui.html import box, guard, guard_stream, number_input
from roctune.webui.i18n import t


def message_text(content) -> str:
    """Text of a Chatbot message's content (a string, or a list of parts in Gradio's messages format)."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return str(content.get("text") or content.get("value") or "")
    if isinstance(content, (list, tuple)):
        return "".join(message_text(c) for c in content)
    return str(content or "")


def _is_file(content) -> bool:
    """A Chatbot message that shows a file (a picture sent with the next message)."""
    if isinstance(content, (list, tuple)):
        return bool(content) and all(_is_file(c) for c in content)
    return isinstance(content, dict) and ("path" in content or content.get("type") == "file" or "file" in content)


def history_messages(history: list, pictures: list | None = None) -> list[dict]:
    """The conversation of a Chatbot history for `generate`: a picture message joins the user message after it,
    the picture taken from `pictures` (the session's checked images, in order) and never from the browser's copy."""
    out, waiting, kept = [], [], iter(pictures or [])
    for m in history or []:
        if m.get("role") not in ("user", "assistant", "system"):
            continue
        if m["role"] == "user" and _is_file(m["content"]):
            waiting.append(next(kept, None))
            continue
        text = message_text(m["content"])
        if waiting and m["role"] == "user":
            if any(p is None for p in waiting):
                raise RoctuneError("the chat's pictures were lost (the page was reloaded?); press Clear and send again")
            out.append({"role": "user", "content": [{"type": "image", "image": p} for p in waiting]
                        + [{"type": "text", "text": text}]})
            waiting = []
        else:
            out.append({"role": m["role"], "content": text})
    return out


class ModelCache:
    """Keeps the last loaded model (base + adapter) between chat messages; one generation at a time."""

    def __init__(self):
        self.key = None
        self.loaded = None
        self.lock = threading.Lock()

    def get(self, adapter: str | None, model: str | None):
        from roctune.generate import load_for_inference

        key = (adapter, model)
        if self.key != key:
            self.loaded, self.key = None, None
            self.loaded = load_for_inference(adapter, model)
            self.key = key
        return self.loaded


def _layout(gr) -> SimpleNamespace:
    ui = SimpleNamespace()
    with gr.Row():
        ui.adapter = gr.Dropdown([], label="adapter (a run directory; empty: the base model alone)", scale=3,
                                 allow_custom_value=True, elem_id="rt-chat-adapter")
        ui.checkpoint = gr.Dropdown([], label="checkpoint", allow_custom_value=True, scale=2,
                                    elem_id="rt-chat-checkpoint")
        ui.model = gr.Dropdown([], label="base model (default: the one the adapter was trained on)", scale=2,
                               allow_custom_value=True, elem_id="rt-chat-model")
    with gr.Row():
        ui.compare = gr.Checkbox(label="side by side: base vs fine-tuned", value=True, elem_id="rt-compare")
        ui.max_new = gr.Number(label=SAMPLING[0][2], value=64, precision=0, elem_id="rt-max-new")
        ui.temp = gr.Number(label=SAMPLING[1][2], value=SAMPLING[1][4], elem_id="rt-temp")
        ui.top_p = gr.Number(label=SAMPLING[2][2], value=SAMPLING[2][4], elem_id="rt-top-p")
    ui.system = gr.Textbox(label="system prompt (empty: the chat template's own)", lines=1, elem_id="rt-chat-system")
    ui.status = gr.HTML(elem_id="rt-chat-status")
    with gr.Row():
        ui.base_bot = gr.Chatbot(label="base model", height=360, elem_id="rt-base-bot")
        ui.ft_bot = gr.Chatbot(label="fine-tuned", height=360, elem_id="rt-ft-bot")
    with gr.Row():
        ui.msg = gr.Textbox(show_label=False, placeholder="type a message and press Enter", scale=5,
                            elem_id="rt-chat-input")
        ui.image = gr.Image(label="picture (a vision-language model)", type="filepath", sources=["upload", "clipboard"],
                            height=110, scale=1, elem_id="rt-chat-image")
        ui.send = gr.Button("Send", variant="primary", scale=1, elem_id="rt-send")
        ui.clear = gr.Button("Clear", scale=0)
    ui.pictures = gr.State([])  # the session's checked pictures, in the order of the history's picture messages
    return ui


def stream_answer(loaded, messages: list[dict], kw: dict, use_adapter: bool = True):
    """Yield the answer to `messages` as it grows, then the answer as `generate` returns it (stop strings and
    special tokens removed). The generation runs in a thread feeding a TextIteratorStreamer; its error is raised
    here, after the streamer has been ended so that the loop stops."""
    from transformers import TextIteratorStreamer

    from roctune.generate import generate

    streamer = TextIteratorStreamer(loaded.tokenizer, skip_prompt=True, skip_special_tokens=True)
    result: dict = {}

    def work():
        try:
            result["text"] = generate(loaded, [messages], use_adapter=use_adapter, streamer=streamer, **kw)[0]
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread below
            result["error"] = e
            streamer.end()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    text = ""
    for piece in streamer:
        text += piece
        if text.strip():
            yield text.strip()
    thread.join()
    if "error" in result:
        raise result["error"]
    yield result["text"]


# The sampling inputs: (keyword of generate, the `roctune chat` flag, the box's label, type, default, bounds).
SAMPLING = (("max_new_tokens", "--max-new-tokens", "max new tokens", int, None, {"gt": 0}),
            ("temperature", "--temperature", "temperature (0: greedy)", float, 0.0, {"ge": 0}),
            ("top_p", "--top-p", "top-p", float, 1.0, {"gt": 0, "le": 1}))


def _check_sampling(*values) -> dict:
    """The sampling inputs (max new tokens, temperature, top-p) by `roctune chat`'s rules, each refused in one
    line naming its box (`number_input`)."""
    return {key: number_input(value, flag, label, typ, default, **bounds)
            for (key, flag, label, typ, default, bounds), value in zip(SAMPLING, values)}


def _picture(path: str | None, loaded):
    """The uploaded picture, checked at the border, for a model that takes pictures; None without one."""
    from roctune.data.images import open_image

    if not path:
        return None
    if loaded.processor is None:
        raise RoctuneError(f"picture: {loaded.base_model} is a text-only model (no vision tower); remove the picture "
                           "or pick a vision-language model")
    return open_image(path, "picture", pixels=loaded.image_pixels)  # scaled as the run trained


def send_handler(ws, models: ModelCache):
    @guard_stream("chat", 6, status_index=3)
    def on_send(msg, adapter, checkpoint, model, compare, max_new, temp, top_p, system, ft_hist, base_hist,
                image=None, pictures=None):
        text = (msg or "").strip()
        if not text:
            yield "", ft_hist, base_hist, box(t("type a message first"), "info"), gr_keep(), pictures
            return
        adapter = ws.adapter(checkpoint or adapter) if (checkpoint or adapter or "").strip() else None
        model = ws.model(model)
        compare = bool(compare and adapter)
        kw = _check_sampling(max_new, temp, top_p)
        head = [{"role": "system", "content": system.strip()}] if (system or "").strip() else []
        t0 = time.time()
        with models.lock:
            loaded = models.get(adapter, model)
            picture = _picture(image, loaded)
            pictures = list(pictures or []) + ([picture] if picture is not None else [])
            ft, base = list(ft_hist or []), list(base_hist or [])
            for hist, use_adapter in [(ft, True)] + ([(base, False)] if compare else []):
                if picture is not None:
                    hist.append({"role": "user", "content": {"path": image}})
                hist.append({"role": "user", "content": text})
                asked = head + history_messages(hist, pictures)
                hist.append({"role": "assistant", "content": ""})
                for answer in stream_answer(loaded, asked, kw, use_adapter):
                    hist[-1] = {"role": "assistant", "content": answer}
                    yield gr_keep(), ft, base, box(t("answering..."), "info"), gr_keep(), pictures
        who = f"{loaded.base_model}" + (f" + {adapter}" if adapter else "")
        yield "", ft, base, box(t("{who}: answered in {s}s", who=who, s=f"{time.time() - t0:.1f}"), "info"), None, \
            pictures

    return on_send


def gr_keep():
    """Leave a component as it is (the message box while the answer streams)."""
    import gradio as gr

    return gr.update()


def build(gr, ws, models: ModelCache, lang) -> SimpleNamespace:
    """The Chat tab (call inside gr.Tabs). Returns its components; `adapter` is filled in when a run ends; the
    checkpoint list follows the adapter picked (`lang`: the page's language state)."""
    from roctune.webui import picks

    with gr.Tab("Chat", id="chat"):
        ui = _layout(gr)
    on_send = send_handler(ws, models)
    outputs = [ui.msg, ui.ft_bot, ui.base_bot, ui.status, ui.image, ui.pictures]
    inputs = [ui.msg, ui.adapter, ui.checkpoint, ui.model, ui.compare, ui.max_new, ui.temp, ui.top_p, ui.system,
              ui.ft_bot, ui.base_bot, ui.image, ui.pictures, lang]
    ui.send.click(on_send, inputs, outputs)
    ui.msg.submit(on_send, inputs, outputs)
    ui.clear.click(lambda: ([], [], "", []), None, [ui.ft_bot, ui.base_bot, ui.status, ui.pictures])
    ui.compare.change(lambda on: gr.update(visible=bool(on)), ui.compare, ui.base_bot)

    @guard("chat", 1)
    def on_adapter(run):
        return gr.update(choices=picks.checkpoints(ws, (run or "").strip()), value=None)

    ui.adapter.change(on_adapter, [ui.adapter, lang], ui.checkpoint)
    return ui
