"""The Chat panel: talk to a trained adapter, side by side with its base model; the last loaded model is kept
between messages (`ModelCache`) and one generation runs at a time."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from roctune.webui.html import box, guard
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


def history_messages(history: list) -> list[dict]:
    return [{"role": m["role"], "content": message_text(m["content"])} for m in history or []
            if m.get("role") in ("user", "assistant", "system")]


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
        ui.max_new = gr.Number(label="max new tokens", value=64, precision=0, elem_id="rt-max-new")
        ui.temp = gr.Number(label="temperature (0: greedy)", value=0.0)
    ui.status = gr.HTML(elem_id="rt-chat-status")
    with gr.Row():
        ui.base_bot = gr.Chatbot(label="base model", height=360, elem_id="rt-base-bot")
        ui.ft_bot = gr.Chatbot(label="fine-tuned", height=360, elem_id="rt-ft-bot")
    with gr.Row():
        ui.msg = gr.Textbox(show_label=False, placeholder="type a message and press Enter", scale=5,
                            elem_id="rt-chat-input")
        ui.send = gr.Button("Send", variant="primary", scale=1, elem_id="rt-send")
        ui.clear = gr.Button("Clear", scale=0)
    return ui


def send_handler(ws, models: ModelCache):
    @guard("chat", 4, status_index=3)
    def on_send(msg, adapter, checkpoint, model, compare, max_new, temp, ft_hist, base_hist):
        from roctune.errors import ConfigError
        from roctune.generate import generate

        text = (msg or "").strip()
        if not text:
            return "", ft_hist, base_hist, box(t("type a message first"), "info")
        adapter = ws.adapter(checkpoint or adapter) if (checkpoint or adapter or "").strip() else None
        model = ws.model(model)
        compare = bool(compare and adapter)
        if max_new is None or max_new <= 0:
            raise ConfigError("--max-new-tokens must be > 0")
        kw = dict(max_new_tokens=int(max_new), temperature=float(temp or 0.0))
        t0 = time.time()
        with models.lock:
            loaded = models.get(adapter, model)
            ft_hist = list(ft_hist or []) + [{"role": "user", "content": text}]
            answer = generate(loaded, [history_messages(ft_hist)], **kw)[0]
            ft_hist.append({"role": "assistant", "content": answer})
            if compare:
                base_hist = list(base_hist or []) + [{"role": "user", "content": text}]
                base_answer = generate(loaded, [history_messages(base_hist)], use_adapter=False, **kw)[0]
                base_hist.append({"role": "assistant", "content": base_answer})
        who = f"{loaded.base_model}" + (f" + {adapter}" if adapter else "")
        return "", ft_hist, base_hist, box(t("{who}: answered in {s}s", who=who, s=f"{time.time() - t0:.1f}"), "info")

    return on_send


def build(gr, ws, models: ModelCache, lang) -> SimpleNamespace:
    """The Chat tab (call inside gr.Tabs). Returns its components; `adapter` is filled in when a run ends; the
    checkpoint list follows the adapter picked (`lang`: the page's language state)."""
    from roctune.webui import picks

    with gr.Tab("Chat", id="chat"):
        ui = _layout(gr)
    on_send = send_handler(ws, models)
    outputs = [ui.msg, ui.ft_bot, ui.base_bot, ui.status]
    inputs = [ui.msg, ui.adapter, ui.checkpoint, ui.model, ui.compare, ui.max_new, ui.temp, ui.ft_bot, ui.base_bot,
              lang]
    ui.send.click(on_send, inputs, outputs)
    ui.msg.submit(on_send, inputs, outputs)
    ui.clear.click(lambda: ([], [], ""), None, [ui.ft_bot, ui.base_bot, ui.status])
    ui.compare.change(lambda on: gr.update(visible=bool(on)), ui.compare, ui.base_bot)

    @guard("chat", 1)
    def on_adapter(run):
        return gr.update(choices=picks.checkpoints(ws, (run or "").strip()), value=None)

    ui.adapter.change(on_adapter, [ui.adapter, lang], ui.checkpoint)
    return ui
