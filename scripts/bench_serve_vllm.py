"""Benchmark: `roctune serve` against `roctune serve --engine vllm` (vLLM's CPU build from `make vllm`) on this
machine, with two LoRA adapters on one base. For each engine the script starts the server, sends the same greedy
chat requests (alternating the two adapters, same prompts, same max_tokens) at 1, 8 and 32 concurrent clients,
and prints a table: completion tokens/s over the phase's wall time and the p50/p95 latency of one request. It
also counts the answers that differ between the engines (greedy, fp32 on both: expected 0).

Without --adapter it first trains two small demo-style runs (examples/identity.jsonl, two seeds and ranks) on
the bundled model into --work. Loopback only; the servers are stopped at the end.

    python scripts/bench_serve_vllm.py --max-tokens 32
    python scripts/bench_serve_vllm.py --adapter a=runs/a --adapter b=runs/b
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = [
    "Who are you?", "What is your name?", "Explain how a bicycle works.", "Tell me about the history of bread.",
    "Describe a walk through a forest in autumn.", "Why is the sky blue?", "Write a poem about the moon.",
    "Describe your favourite city and why.",
]
KEY = "bench-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat(url: str, model: str, prompt: str, max_tokens: int) -> tuple[float, int, str]:
    """(seconds, completion tokens, text) of one greedy chat request."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": max_tokens}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=900) as r:
        out = json.load(r)
    return time.perf_counter() - t, out["usage"]["completion_tokens"], out["choices"][0]["message"]["content"]


def wait_ready(url: str, proc, timeout: float = 900) -> None:
    req = urllib.request.Request(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"bench_serve_vllm: the server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(req, timeout=5):
                return
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(1)
    sys.exit("bench_serve_vllm: the server did not answer in time")


def train_two(work: str) -> list[str]:
    specs = []
    for name, seed, rank in (("ida", 1, 16), ("idb", 2, 8)):
        out = os.path.join(work, name)
        if not os.path.isfile(os.path.join(out, "adapter_config.json")):
            subprocess.run([sys.executable, "-m", "roctune", "train", "--data",
                            os.path.join(REPO, "examples", "identity.jsonl"), "--output", out, "--overwrite",
                            "--max-steps", "10", "--lr", "1e-3", "--lora-r", str(rank), "--lora-alpha",
                            str(2 * rank), "--max-length", "128", "--batch-size", "4", "--seed", str(seed),
                            "--device", "cpu"], check=True, stdout=subprocess.DEVNULL)
        specs.append(f"{name}={out}")
    return specs


def run_engine(engine: str, specs: list[str], args) -> tuple[list[dict], dict]:
    """The phases' figures for one engine, and its answers by (adapter, prompt)."""
    port = free_port()
    cmd = [sys.executable, "-m", "roctune", "serve", "--engine", engine, "--port", str(port), "--max-batch",
           str(max(args.concurrency))]
    for s in specs:
        cmd += ["--adapter", s]
    env = {**os.environ, "ROCTUNE_API_KEY": KEY}
    log = open(os.path.join(args.work, f"serve-{engine}.log"), "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url, names = f"http://127.0.0.1:{port}", [s.split("=", 1)[0] for s in specs]
    rows, answers = [], {}
    try:
        wait_ready(url, proc)
        chat(url, names[0], PROMPTS[0], args.max_tokens)  # warm-up
        for c in args.concurrency:
            n = max(c, args.min_requests)
            jobs = [(names[i % len(names)], PROMPTS[i % len(PROMPTS)]) for i in range(n)]
            t = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                results = list(pool.map(lambda j: chat(url, j[0], j[1], args.max_tokens), jobs))
            wall = time.perf_counter() - t
            lat = sorted(r[0] for r in results)
            tokens = sum(r[1] for r in results)
            rows.append({"engine": engine, "concurrency": c, "requests": n, "tokens": tokens,
                         "tok_s": tokens / wall, "p50": statistics.median(lat),
                         "p95": lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))]})
            answers.update({j: r[2] for j, r in zip(jobs, results)})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        log.close()
    return rows, answers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapter", action="append", default=[], metavar="NAME=DIR", help="two adapters (default: "
                    "train two demo runs)")
    ap.add_argument("--work", default=os.path.join(REPO, "runs", "bench-serve-vllm"), help="trained runs and logs")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--min-requests", type=int, default=8, help="requests per phase at least (default 8)")
    ap.add_argument("--engines", nargs="+", default=["roctune", "vllm"], choices=["roctune", "vllm"])
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    specs = args.adapter or train_two(args.work)
    rows, answers = [], {}
    for engine in args.engines:
        r, answers[engine] = run_engine(engine, specs, args)
        rows += r
    print(f"\n{len(specs)} adapters, greedy, max_tokens {args.max_tokens}, {os.cpu_count()} CPUs\n")
    print("| engine | concurrent | requests | tokens/s | p50 latency (s) | p95 latency (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['engine']} | {r['concurrency']} | {r['requests']} | {r['tok_s']:.1f} | {r['p50']:.2f} | "
              f"{r['p95']:.2f} |")
    if len(answers) == 2:
        a, b = answers.values()
        diff = sum(a[k] != b.get(k) for k in a)
        print(f"\nanswers that differ between the engines: {diff} of {len(a)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
