"""`roctune chat`: talk to a fine-tuned model in the terminal, answers streamed as they are generated.
`--compare` answers each message with the base model too. Commands: /reset clears the history, /quit exits."""
from __future__ import annotations

import sys

from roctune.commands.generate import add_inference_args, check_inference_args
from roctune.data.formats import check_text
from roctune.errors import DataError


def register(sub) -> None:
    p = sub.add_parser("chat", help="interactive chat with a fine-tuned adapter", description=__doc__)
    add_inference_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from transformers import TextStreamer

    from roctune.generate import generate, load_for_inference

    check_inference_args(args)
    loaded = load_for_inference(args.adapter, args.model, args.device, args.dtype, args.trust_remote_code)
    history: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p)
    interactive = sys.stdin.isatty()
    print("roctune chat: type a message; /reset clears the history, /quit exits.")
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
        if not interactive:
            print(f"you> {text}")
        history.append({"role": "user", "content": text})
        if args.compare:
            print("base> ", end="", flush=True)
            generate(loaded, [history], use_adapter=False,
                     streamer=TextStreamer(loaded.tokenizer, skip_prompt=True, skip_special_tokens=True), **kw)
        print("assistant> " if not args.compare else "fine-tuned> ", end="", flush=True)
        answer = generate(loaded, [history], streamer=TextStreamer(loaded.tokenizer, skip_prompt=True,
                                                                   skip_special_tokens=True), **kw)[0]
        history.append({"role": "assistant", "content": answer})
    return 0
