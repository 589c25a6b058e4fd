"""Benchmark: tokenizing N short records (default 200k) the first time, and the same data again from the
tokenized-data cache (`roctune.data.cache`), through the path `roctune train` takes (`session.tokenize_splits`).

    python scripts/bench_tokenize.py [--records 200000] [--model NAME]

Writes the records and the cache under a temporary folder (removed afterwards) and prints the seconds of each run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_records(path: str, n: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"instruction": f"What is {i} plus {i % 7}?", "output": f"{i + i % 7}."}) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()

    from roctune.data.records import load_records
    from roctune.data.render import RenderOptions, iter_tokenized, tokenize_records
    from roctune.models import load_tokenizer
    from roctune.training.session import tokenize_splits

    tok = load_tokenizer(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ROCTUNE_HOME"] = tmp  # the cache goes to $ROCTUNE_HOME/cache/tokenized (tokenizer loaded already)
        data = os.path.join(tmp, "records.jsonl")
        write_records(data, args.records)
        t = time.perf_counter()
        records = load_records(data)
        read_s = time.perf_counter() - t
        cfg = SimpleNamespace(data=[data], eval_data=[], max_length=128, eval_ratio=0.0, seed=0, data_cache=True)
        settings = {"recipe": "sft", **vars(RenderOptions())}
        times, lines = [], []
        for _ in range(2):
            t = time.perf_counter()
            items, _ = tokenize_splits(tokenize_records, tok, records, [], cfg, lines.append, "example", (settings, iter_tokenized))
            times.append(time.perf_counter() - t)
        n_tok = sum(len(e.input_ids) for e in items)
    hit = any("read from the cache" in s for s in lines)
    print(f"{args.records} records ({n_tok} tokens): read {read_s:.1f}s; tokenize (first run) {times[0]:.1f}s; "
          f"from the cache {times[1]:.1f}s (cache hit: {hit})")
    return 0 if hit else 1


if __name__ == "__main__":
    raise SystemExit(main())
