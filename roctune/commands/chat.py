"""`roctune chat`: talk to a fine-tuned model in the terminal, answers streamed as they are generated.
`--compare` answers each message with the base model too. Commands: /reset clears the history, /quit exits.
With --tools FILE.py / --environment FILE.py:Class the model is an agent: its tool calls run (in a tool process of
their own, with --tool-timeout and --tool-memory-mb) and their results come back to it, turn by turn, as in GRPO's
episodes (--max-new-tokens then bounds a whole answer, calls and results included)."""
from __future__ import annotations

import sys

from roctune import config
from roctune.commands.generate import add_inference_args, check_inference_args
from roctune.config.agents import TOOL_SETTINGS
from roctune.data.formats import check_text
from roctune.errors import DataError


def register(sub) -> None:
    p = sub.add_parser("chat", help="interactive chat with a fine-tuned adapter", description=__doc__)
    add_inference_args(p)
    config.add_flags(p, TOOL_SETTINGS)
    p.set_defaults(func=run)


def _messages(args, lineno: int = 0):
    """The user's messages from stdin, checked (yields the text; /quit and EOF end it)."""
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
        if not interactive and text != "/reset":
            print(f"you> {text}")
        yield text


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
        for text in _messages(args):
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


def run(args) -> int:
    from transformers import TextStreamer

    from roctune.generate import generate, load_for_inference

    check_inference_args(args)
    if getattr(args, "tools", None) or getattr(args, "environment", None):
        from roctune.agents.files import catalog_of, spec_of

        cfg = config.from_sources(flags={n: getattr(args, n) for n in TOOL_SETTINGS if hasattr(args, n)})
        catalog_of(spec_of(cfg))  # the files import and define tools, before the model loads
        loaded = load_for_inference(args.adapter, args.model, args.device, args.dtype, args.trust_remote_code)
        return run_agent(args, loaded)
    loaded = load_for_inference(args.adapter, args.model, args.device, args.dtype, args.trust_remote_code)
    history: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p)
    print("roctune chat: type a message; /reset clears the history, /quit exits.")
    for text in _messages(args):
        if text == "/reset":
            history = history[:1] if args.system else []
            print("(history cleared)")
            continue
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
