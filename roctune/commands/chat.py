"""`roctune chat`: talk to a fine-tuned model in the terminal, answers streamed as they are generated.
`--compare` answers each message with the base model too. `--image PATH` (a vision-language model) shows the model a
picture with the first message. Commands: /image PATH attaches a picture to the next message, /reset clears the
history, /quit exits.
With --tools FILE.py / --environment FILE.py:Class the model is an agent: its tool calls run (in a tool process of
their own, with --tool-timeout and --tool-memory-mb) and their results come back to it, turn by turn, as in GRPO's
episodes (--max-new-tokens then bounds a whole answer, calls and results included)."""
from __future__ import annotations

import sys

from roctune import config
from roctune.commands.generate import add_inference_args, check_inference_args
from roctune.config.agents import TOOL_SETTINGS
from roctune.data.formats import check_text
from roctune.errors import ConfigError, DataError


def register(sub) -> None:
    p = sub.add_parser("chat", help="interactive chat with a fine-tuned adapter", description=__doc__)
    add_inference_args(p)
    config.add_flags(p, TOOL_SETTINGS)
    p.add_argument("--image", metavar="PATH", action="append", default=[],
                   help="a picture shown with the first message (a vision-language model; repeat for several)")
    p.set_defaults(func=run)


def _messages(args, lineno: int = 0):
    """The user's messages from stdin, checked: (line number, text); /quit and EOF end them."""
    interactive = sys.stdin.isatty()
    while True:
        lineno += 1
        try:
            line = input("you> " if interactive else "")
        except EOFError:
            return
        except UnicodeDecodeError:
            raise DataError(f"stdin line {lineno}: not UTF-8 text; send messages as UTF-8") from None
        text = check_text(line.strip(), f"stdin line {lineno}")  # bytes that are not UTF-8 arrive as surrogates
        if not text:
            continue
        if text in ("/quit", "/exit"):
            return
        if not interactive and text != "/reset" and not text.startswith("/image"):
            print(f"you> {text}")
        yield lineno, text


def run_agent(args, loaded) -> int:
    """--tools/--environment: each message is answered by an agent episode, its calls and results shown."""
    from roctune.agents.conversation import Conversation
    from roctune.agents.episodes import transcript

    cfg = config.from_sources(flags={n: getattr(args, n) for n in TOOL_SETTINGS if hasattr(args, n)})
    cfg.max_completion_length = args.max_new_tokens
    conv = Conversation(loaded, cfg, args.temperature, args.top_p, args.adapter)
    history: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    print(f"roctune chat with tools {', '.join(conv.catalog.names)}: type a message; /reset clears the history, "
          "/quit exits.")
    sides = [("base", 1, False)] if args.compare else []
    sides.append(("fine-tuned" if args.compare else "assistant", 0, True))
    try:
        for _, text in _messages(args):
            if text == "/reset":
                history = history[:1] if args.system else []
                conv.restart()
                print("(history cleared)")
                continue
            history.append({"role": "user", "content": text})
            answers = {}
            for name, slot, use in sides:
                print(f"{name}>")
                done = [0]

                def show(e, done=done):
                    print(transcript(e.messages[done[0]:]), flush=True)
                    done[0] = len(e.messages)

                answers[name] = conv.answer(history, slot, use, show)
            history += answers[sides[-1][0]]
    finally:
        conv.close()
    return 0


def _user_turn(text: str, images: list) -> dict:
    if not images:
        return {"role": "user", "content": text}
    return {"role": "user", "content": [{"type": "image", "image": i} for i in images] + [{"type": "text",
                                                                                         "text": text}]}


def run(args) -> int:
    from transformers import TextStreamer

    from roctune.data.images import open_image
    from roctune.generate import generate, image_pixels, load_for_inference, require_vision

    check_inference_args(args)
    pixels = image_pixels(args.adapter) if args.image else None  # scaled as the run trained (run.yaml)
    images = [open_image(path, "--image", pixels=pixels) for path in args.image]  # checked before the model loads
    if images:
        require_vision(args.adapter, args.model, "--image")
    if getattr(args, "tools", None) or getattr(args, "environment", None):
        from roctune.agents.files import catalog_of, spec_of

        if images:
            raise ConfigError("--image: an agent chat (--tools, --environment) takes text only; drop one of them")
        cfg = config.from_sources(flags={n: getattr(args, n) for n in TOOL_SETTINGS if hasattr(args, n)})
        catalog_of(spec_of(cfg))  # the files import and define tools, before the model loads
        loaded = load_for_inference(args.adapter, args.model, args.device, args.dtype, args.trust_remote_code)
        return run_agent(args, loaded)
    loaded = load_for_inference(args.adapter, args.model, args.device, args.dtype, args.trust_remote_code)
    history: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p)
    vision = loaded.processor is not None
    print("roctune chat: type a message; " + ("/image PATH attaches a picture, " if vision else "")
          + "/reset clears the history, /quit exits.")
    for lineno, text in _messages(args):
        if text == "/reset":
            history = history[:1] if args.system else []
            print("(history cleared)")
            continue
        if text.startswith("/image"):
            images += _attach(text[len("/image"):].strip(), loaded, lineno)
            continue
        history.append(_user_turn(text, images))
        images = []
        if args.compare:
            print("base> ", end="", flush=True)
            generate(loaded, [history], use_adapter=False,
                     streamer=TextStreamer(loaded.tokenizer, skip_prompt=True, skip_special_tokens=True), **kw)
        print("assistant> " if not args.compare else "fine-tuned> ", end="", flush=True)
        answer = generate(loaded, [history], streamer=TextStreamer(loaded.tokenizer, skip_prompt=True,
                                                                   skip_special_tokens=True), **kw)[0]
        history.append({"role": "assistant", "content": answer})
    return 0


def _attach(path: str, loaded, lineno: int) -> list:
    """/image PATH: the picture for the next message (scaled as the run trained), or a line saying why not (the chat
    goes on)."""
    from roctune.data.images import open_image
    from roctune.errors import RoctuneError

    if loaded.processor is None:
        print("(this model is text-only: it cannot take images)")
        return []
    try:
        img = open_image(path, f"stdin line {lineno}: /image", pixels=loaded.image_pixels)
    except RoctuneError as e:
        print(f"({e})")
        return []
    print(f"(image attached to the next message: {img.size[0]} x {img.size[1]})")
    return [img]
