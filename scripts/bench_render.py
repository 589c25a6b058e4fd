"""Benchmark chat-template rendering on the data path (what `roctune train` and `data preview` run per example):
tokenize N records with the bundled model's tokenizer through `tokenize_records`, under its own template and
under roctune's qwen3 and llama3 rows, plus a multi-turn tool-calling set with a tools-aware template. Prints
seconds per run (best of --repeat) and microseconds per example. Run it on two checkouts to compare them:

    PYTHONPATH=. python scripts/bench_render.py [--records 2000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))


def records(n: int, tools: bool):
    from roctune.data.records import Record

    tool_list = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                   "parameters": {"type": "object", "properties": {
                                                       "city": {"type": "string"}}, "required": ["city"]}}}]
    out = []
    for i in range(n):
        if tools:
            messages = [{"role": "system", "content": "You help with the weather."},
                        {"role": "user", "content": f"What is the weather in city {i}?"},
                        {"role": "assistant", "content": "", "tool_calls": [
                            {"name": "get_weather", "arguments": {"city": f"city {i}"}}]},
                        {"role": "tool", "content": f"sunny, {i % 30} C"},
                        {"role": "assistant", "content": f"It is sunny and {i % 30} C in city {i}."}]
            out.append(Record(f"bench:{i}", messages, tools=tool_list))
        else:
            messages = [{"role": "user", "content": f"What is {i} plus {i % 7}?"},
                        {"role": "assistant", "content": f"{i + i % 7}."}]
            out.append(Record(f"bench:{i}", messages))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from roctune.data.render import tokenize_records
    from roctune.models import load_tokenizer

    from family_models import QWEN25 as tools_template  # Qwen2.5's structure: tools as JSON lines, tool_call blocks

    for label, template, tools in (("bundled (SmolLM2)", None, False), ("qwen3 row", "qwen3", False),
                                   ("llama3 row", "llama3", False), ("tools, Qwen2.5-style", "tools", True)):
        tok = load_tokenizer(None, template=None if template == "tools" else template)
        if template == "tools":
            tok.chat_template = tools_template
        data = records(args.records, tools)
        tokenize_records(tok, data[:20], 512)  # warm: compiled template, probes
        best = float("inf")
        for _ in range(args.repeat):
            t = time.perf_counter()
            tokenize_records(tok, data, 512)
            best = min(best, time.perf_counter() - t)
        print(f"{label:22s} {args.records} records: {best:.2f} s ({best / args.records * 1e6:.0f} us/example)",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
