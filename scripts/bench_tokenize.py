"""Benchmark the data path of `roctune train`:
1. tokenizing N short records (default 200k) the first time, and the same data again from the tokenized-data cache
   (`roctune.data.cache`), through `session.tokenize_splits`;
2. peak memory of a --streaming pass (check + count the records, tokenize them into the cache a chunk at a time, then
   read every example back memory-mapped, as sft does) over a file several times larger than the chunk bound, next
   to the in-memory path over the same file. Each pass runs in its own process; peak anonymous memory (RssAnon,
   what the process itself holds; mapped cache files are page cache the system can drop) is sampled every 20 ms.

    python scripts/bench_tokenize.py [--records 200000] [--stream-mb 100] [--skip-cache] [--skip-stream]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def write_short(path: str, n: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"instruction": f"What is {i} plus {i % 7}?", "output": f"{i + i % 7}."}) + "\n")


def write_long(path: str, megabytes: int) -> int:
    """Records of ~2.5 KB (a long answer) until the file holds `megabytes`; returns how many."""
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        while f.tell() < megabytes << 20:
            text = " ".join(words[(n + k) % len(words)] + str(k % 97) for k in range(300))
            f.write(json.dumps({"instruction": f"Write passage {n}.", "output": text}) + "\n")
            n += 1
    return n


def cache_bench(tok, n: int) -> None:
    from roctune.data.records import load_records
    from roctune.data.render import RenderOptions, iter_tokenized, tokenize_records
    from roctune.training.session import tokenize_splits

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ROCTUNE_HOME"] = tmp  # the cache goes to $ROCTUNE_HOME/cache/tokenized (tokenizer loaded already)
        data = os.path.join(tmp, "records.jsonl")
        write_short(data, n)
        t = time.perf_counter()
        records = load_records(data)
        read_s = time.perf_counter() - t
        cfg = SimpleNamespace(data=[data], eval_data=[], max_length=128, eval_ratio=0.0, seed=0, data_cache=True)
        cache_with = ({"recipe": "sft", **vars(RenderOptions())}, iter_tokenized)
        times, lines = [], []
        for _ in range(2):
            t = time.perf_counter()
            items, _ = tokenize_splits(tokenize_records, tok, records, [], cfg, lines.append, "example", cache_with)
            n_tok = sum(len(e.input_ids) for e in items)  # sft reads every example once (lengths, token counts)
            times.append(time.perf_counter() - t)
    hit = any("read from the cache" in s for s in lines)
    print(f"{n} records ({n_tok} tokens): read {read_s:.1f}s; tokenize (first run) {times[0]:.1f}s; "
          f"from the cache {times[1]:.1f}s (cache hit: {hit})", flush=True)


def _rss_anon_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0


def child(mode: str, data: str, home: str) -> None:
    """One pass in this process; prints its peak anonymous memory above the baseline (tokenizer loaded)."""
    from roctune.data import cache
    from roctune.data.records import StreamedRecords, load_records
    from roctune.data.render import iter_tokenized, tokenize_records
    from roctune.models import load_tokenizer

    tok = load_tokenizer(None)
    base = _rss_anon_mb()
    peak = [base]

    def sample():
        while True:
            peak[0] = max(peak[0], _rss_anon_mb())
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()
    t = time.perf_counter()
    if mode == "streamed":
        records = StreamedRecords(data)
        items, _, _ = cache.cached(os.path.join(home, "c"), "bench", lambda: iter_tokenized(tok, records, 4096))
    else:
        items, _ = tokenize_records(tok, load_records(data), 4096)
    n_tok = sum(len(e.input_ids) for e in items)
    peak[0] = max(peak[0], _rss_anon_mb())
    print(json.dumps({"mode": mode, "examples": len(items), "tokens": n_tok, "seconds": time.perf_counter() - t,
                      "baseline_mb": base, "peak_above_baseline_mb": peak[0] - base}), flush=True)


def stream_bench(megabytes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "long.jsonl")
        n = write_long(data, megabytes)
        size = os.path.getsize(data) / 2**20
        for mode in ("streamed", "in_memory"):
            out = subprocess.run([sys.executable, __file__, "--child", mode, data, tmp], capture_output=True,
                                 text=True, env={**os.environ, "PYTHONPATH": REPO})
            if out.returncode:
                print(out.stderr[-2000:])
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{mode}: {size:.0f} MB file, {n} records, {r['tokens']} tokens in {r['seconds']:.0f}s; peak memory "
                  f"{r['peak_above_baseline_mb']:.0f} MB above the {r['baseline_mb']:.0f} MB baseline", flush=True)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--stream-mb", type=int, default=100)
    ap.add_argument("--skip-cache", action="store_true")
    ap.add_argument("--skip-stream", action="store_true")
    args = ap.parse_args()
    if not args.skip_cache:
        from roctune.models import load_tokenizer

        cache_bench(load_tokenizer(None), args.records)
    if not args.skip_stream:
        stream_bench(args.stream_mb)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
