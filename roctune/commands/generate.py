"""`roctune generate`: answer one prompt or a JSONL file of prompts with a fine-tuned adapter;
`--compare` shows the base model's answer beside the fine-tuned one."""
from __future__ import annotations

import json
import sys

from roctune.errors import DataError, RoctuneError
from roctune.hardware.choices import DEVICES, DTYPES


def add_inference_args(p) -> None:
    p.add_argument("--adapter", metavar="DIR", help="run directory (adapter + run.yaml) from roctune train")
    p.add_argument("--model", metavar="NAME", help="base model (default: the adapter's, from run.yaml)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--system", help="system prompt")
    p.add_argument("--compare", action="store_true", help="also answer with the base model, side by side")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument("--trust-remote-code", action="store_true")


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate answers with a fine-tuned adapter", description=__doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one user message")
    src.add_argument("--input", metavar="FILE.jsonl", help="prompts: any training format, or {\"prompt\": ...} per line")
    p.add_argument("--output", metavar="FILE.jsonl", help="write answers here (with --input)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    p.add_argument("--batch-size", type=int, default=8)
    add_inference_args(p)
    p.set_defaults(func=run)


def check_inference_args(args) -> None:
    """The sampling numbers, before a model loads: each refused with its flag named."""
    from roctune.config import check_number

    check_number("--max-new-tokens", args.max_new_tokens, gt=0)
    check_number("--temperature", args.temperature, ge=0)  # 0 = greedy
    check_number("--top-p", args.top_p, gt=0, le=1)
    check_number("--batch-size", getattr(args, "batch_size", None), gt=0)
    from roctune.data.formats import check_text

    for flag in ("prompt", "system"):  # argv bytes that are not UTF-8 arrive as lone surrogates
        if getattr(args, flag, None):
            check_text(getattr(args, flag), f"--{flag}")


def read_prompts(path: str) -> list[list[dict]]:
    """Conversations up to the last user turn, from any training format or bare {"prompt": ...} lines."""
    from roctune.data.formats import field_text, to_messages
    from roctune.data.readers import iter_raw

    out = []
    for where, obj in iter_raw(path):
        if set(obj) <= {"prompt", "system", "id"} and "prompt" in obj:
            msgs = [{"role": "user", "content": field_text(obj, "prompt", where)}]
            if obj.get("system"):
                msgs.insert(0, {"role": "system", "content": field_text(obj, "system", where)})
        else:
            msgs = to_messages(obj, where)
            while msgs and msgs[-1]["role"] == "assistant":
                msgs = msgs[:-1]
        out.append(msgs)
    if not out:
        raise DataError(f"{path}: no prompts")
    return out


def side_by_side(prompts: list[str], base: list[str], tuned: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="base model vs fine-tuned", show_lines=True, expand=True)
    table.add_column("prompt", ratio=2)
    table.add_column("base", ratio=3)
    table.add_column("fine-tuned", ratio=3)
    for p, b, t in zip(prompts, base, tuned):
        table.add_row(p, b, t)
    Console(width=max(120, Console().width)).print(table)


def run(args) -> int:
    from roctune.generate import generate, load_for_inference

    if args.adapter is None and args.model is None and args.compare:
        raise RoctuneError("--compare needs --adapter (base vs fine-tuned)")
    if args.output and not args.input:
        raise RoctuneError("--output needs --input")
    check_inference_args(args)
    if args.output:
        from roctune.rundir.output import check_output_file

        check_output_file(args.output, "--output", args.overwrite, (args.input,))
    convs = read_prompts(args.input) if args.input else [[{"role": "user", "content": args.prompt}]]
    if args.system:
        convs = [[{"role": "system", "content": args.system}] + [m for m in c if m["role"] != "system"] for c in convs]
    loaded = load_for_inference(args.adapter, args.model, args.device, args.dtype, args.trust_remote_code)
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p)
    tuned, base = [], []
    from roctune.progress import counted

    for s in counted(range(0, len(convs), args.batch_size), "generating batch",
                     lambda line: print(line, file=sys.stderr)):
        chunk = convs[s:s + args.batch_size]
        tuned += generate(loaded, chunk, **kw)
        if args.compare:
            base += generate(loaded, chunk, use_adapter=False, **kw)
    prompts = [c[-1]["content"] for c in convs]
    if args.output:
        from roctune.rundir.atomic import atomic_write_text

        rows = [{"prompt": p, "answer": tuned[i], **({"base_answer": base[i]} if args.compare else {})}
                for i, p in enumerate(prompts)]
        atomic_write_text(args.output, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        print(f"wrote {len(prompts)} answers to {args.output}")
    elif args.compare:
        side_by_side(prompts, base, tuned)
    else:
        for p, t in zip(prompts, tuned):
            print(t if len(prompts) == 1 else f">>> {p}\n{t}\n")
    return 0
