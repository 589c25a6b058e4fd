"""`roctune chat`: talk to a fine-tuned model in the terminal, answers streamed as they are generated.
`--compare` answers each message with the base model too. `--image PATH` (a vision-language model) shows the model a
picture with the first message. Commands: /image PATH attaches a picture to the next message, /reset clears the
history, /quit exits."""
from __future__ import annotations

import sys

from roctune.commands.generate import add_inference_args, check_inference_args
from roctune.data.formats import check_text
from roctune.errors import DataError


def register(sub) -> None:
    p = sub.add_parser("chat", help="interactive chat with a fine-tuned adapter", description=__doc__)
    add_inference_args(p)
    p.add_argument("--image", metavar="PATH", action="append", default=[],
                   help="a picture shown with the first message (a vision-language model; repeat for several)")
    p.set_defaults(func=run)


def _user_turn(text: str, images: list) -> dict:
    if not images:
        return {"role": "user", "content": text}
    return {"role": "user", "content": [{"type": "image", "image": i} for i in images] + [{"type": "text",
                                                                                         "text": text}]}


def run(args) -> int:
    from transformers import TextStreamer

    from roctune.data.images import open_image
    from roctune.generate import generate, load_for_inference, require_vision

    check_inference_args(args)
    images = [open_image(path, "--image") for path in args.image]  # checked before the model loads
    if images:
        require_vision(args.adapter, args.model, "--image")
    loaded = load_for_inference(args.adapter, args.model, args.device, args.dtype, args.trust_remote_code)
    history: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p)
    interactive = sys.stdin.isatty()
    vision = loaded.processor is not None
    print("roctune chat: type a message; " + ("/image PATH attaches a picture, " if vision else "")
          + "/reset clears the history, /quit exits.")
    lineno = 0
    while True:
        lineno += 1
        try:
            line = input("you> " if interactive else "")
        except EOFError:
            break
        except UnicodeDecodeError:
            raise DataError(f"stdin line {lineno}: not UTF-8 text; send messages as UTF-8") from None
        text = check_text(line.strip(), f"stdin line {lineno}")  # bytes that are not UTF-8 arrive as surrogates
        if not text:
            continue
        if text in ("/quit", "/exit"):
            break
        if text == "/reset":
            history = history[:1] if args.system else []
            print("(history cleared)")
            continue
        if text.startswith("/image"):
            images += _attach(text[len("/image"):].strip(), vision, lineno)
            continue
        if not interactive:
            print(f"you> {text}")
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


def _attach(path: str, vision: bool, lineno: int) -> list:
    """/image PATH: the picture for the next message, or a line saying why not (the chat goes on)."""
    from roctune.data.images import open_image
    from roctune.errors import RoctuneError

    if not vision:
        print("(this model is text-only: it cannot take images)")
        return []
    try:
        img = open_image(path, f"stdin line {lineno}: /image")
    except RoctuneError as e:
        print(f"({e})")
        return []
    print(f"(image attached to the next message: {img.size[0]} x {img.size[1]})")
    return [img]
