"""Benchmark `roctune data check` (no --model) and `roctune data scrub` on a generated JSONL file.

    .venv/bin/python scripts/bench_data.py            # 1 GB file (needs ~2.2 GB free in the temp dir)
    .venv/bin/python scripts/bench_data.py --mb 100   # quicker

Records mix alpaca and OpenAI-messages shapes, English and Chinese; 10% hold personal data (phone, ID card,
bank card, e-mail, IP, landline) and 20% hold look-alikes that must stay (order numbers, timestamps,
versions, prices, an ID with a wrong check digit, a card number failing Luhn).
The file is generated in a temporary directory (deleted afterwards unless --keep). Each command runs in its
own process so its peak RSS is measured alone; throughput is input bytes / wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = """
import resource, sys, time
from roctune.cli import main
t = time.perf_counter()
rc = main(sys.argv[1:])
dt = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_SELF)
print(f"BENCH rc={rc} seconds={dt:.3f} cpu_seconds={ru.ru_utime + ru.ru_stime:.3f} "
      f"peak_rss_mb={ru.ru_maxrss / 1024:.1f}", file=sys.stderr)
"""

_EN = ["How do I reset my password?", "Summarise the following paragraph in one sentence.",
       "Translate to French: the weather is nice today.", "Write a haiku about autumn leaves.",
       "Explain the difference between TCP and UDP.", "What is the capital of Australia?"]
_ZH = ["请帮我写一封请假邮件，时间是2024-03-15至2024-03-18。", "用一句话解释什么是机器学习。",
       "请把下面这段话翻译成英文：今天天气很好。", "推荐三本适合初学者的编程书。", "这道菜需要300克面粉和2个鸡蛋。"]
# Numbers that must not be redacted (order number, timestamp, version, price, wrong ID check digit, non-Luhn card).
_LOOKALIKE = ["我的订单号2023100112345678还没有发货，请帮忙查询。", "时间戳1696118400123对应哪一天？",
              "版本 1.2.3.4 的更新内容有哪些？价格是¥1388.00吗？", "编号110105194912310020有误。",
              "卡号6222021234567895无效。"]
_PII = ["如有问题请拨打13812345678或发邮件到zhang.san@example.com。", "服务器地址是192.168.10.25，端口8080。",
        "联系电话：010-62345678，身份证号11010519491231002X。", "Card 6222 0212 3456 7894 expires 12/27.",
        "call +86 139-1234-5678 after 6pm"]


def _b36(i: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        i, r = divmod(i, 36)
        out = digits[r] + out
        if not i:
            return out


def _record(i: int, rng: random.Random) -> dict:
    filler = " ".join(rng.choice(_EN) for _ in range(rng.randint(2, 8)))
    zh = "".join(rng.choice(_ZH) for _ in range(rng.randint(1, 4)))
    answer = (f"{filler} {zh}" + (f" {rng.choice(_PII)}" if i % 10 == 0 else "")
              + (f" {rng.choice(_LOOKALIKE)}" if i % 5 == 1 else "") + f" (ref {_b36(i)})")
    if i % 3 == 0:
        return {"id": i, "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                      {"role": "user", "content": f"{rng.choice(_ZH)} {rng.choice(_EN)} {_b36(i)}"},
                                      {"role": "assistant", "content": answer}]}
    return {"id": i, "instruction": f"{rng.choice(_EN)} {rng.choice(_ZH)} [{_b36(i)}]", "input": "", "output": answer,
            "score": round(rng.random(), 3)}


def _line(i: int) -> str:
    if i % 50 == 49:  # 2% exact duplicates of a recent record
        return json.dumps(_record(i - 20, random.Random(i - 20)), ensure_ascii=False) + "\n"
    rec = _record(i, random.Random(i))
    if i % 100 == 3:  # 1% near-duplicates: another record's text in different case and spacing
        rec = _record(i - 1, random.Random(i - 1))
        key = "instruction" if "instruction" in rec else "messages"
        if key == "instruction":
            rec["instruction"] = "  " + rec["instruction"].upper() + "!"
        else:
            rec["messages"][1]["content"] = rec["messages"][1]["content"].upper()
    return json.dumps(rec, ensure_ascii=False) + "\n"


def generate(path: str, size_mb: int) -> int:
    target = size_mb * 1024 * 1024
    written = n = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            lines = [_line(n + k) for k in range(2000)]
            n += len(lines)
            block = "".join(lines)
            f.write(block)
            written += len(block.encode("utf-8"))
    return n


def run(args: list[str], size: int) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-c", _CHILD, *args], env=env, capture_output=True, text=True)
    line = [x for x in p.stderr.splitlines() if x.startswith("BENCH ")]
    if not line:
        sys.exit(f"{' '.join(args)} failed:\n{p.stderr}")
    fields = dict(kv.split("=") for kv in line[-1].split()[1:])
    secs = float(fields["seconds"])
    return {"command": "roctune " + " ".join(a if "/" not in a else os.path.basename(a) for a in args),
            "rc": int(fields["rc"]), "seconds": secs, "mb_per_s": round(size / 1e6 / secs, 1),
            "cpu_mb_per_s": round(size / 1e6 / float(fields["cpu_seconds"]), 1),
            "peak_rss_mb": float(fields["peak_rss_mb"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=1024, help="size of the generated JSONL in MiB (default 1024)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--only", choices=["check", "scrub"], help="run one command only")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="roctune-bench-")
    try:
        src = os.path.join(tmp, "train.jsonl")
        t = time.perf_counter()
        n = generate(src, a.mb)
        size = os.path.getsize(src)
        print(f"generated {size / 1e6:.0f} MB, {n} records in {time.perf_counter() - t:.0f}s ({src})")
        results = []
        if a.only in (None, "check"):
            results.append(run(["data", "check", src, "--json"], size))
        if a.only in (None, "scrub"):
            results.append(run(["data", "scrub", src, os.path.join(tmp, "clean.jsonl")], size))
        for r in results:
            print(f"{r['command']}: {r['seconds']:.1f}s wall, {r['mb_per_s']} MB/s "
                  f"({r['cpu_mb_per_s']} MB/s of CPU time), peak RSS {r['peak_rss_mb']:.0f} MB (exit {r['rc']})")
        load = os.getloadavg()[0]
        print(f"load average {load:.1f} on {os.cpu_count()} CPUs"
              + (" (other work was running: wall-clock figures are lower than on an idle machine)"
                 if load > os.cpu_count() * 0.75 else ""))
        ok = all(r["mb_per_s"] >= 20 and r["peak_rss_mb"] < 500 for r in results)
        print("target (>= 20 MB/s, peak RSS < 500 MB):", "met" if ok else "NOT met")
        return 0 if ok else 1
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
