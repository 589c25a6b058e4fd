"""Load test for `roctune serve`: the same greedy requests sent one after another, then all at once by
concurrent clients; prints each phase's aggregate completion tokens/s, their ratio, and whether every
concurrent answer equals its sequential one.

Loopback only. Without --url it starts `python -m roctune serve` itself on a free 127.0.0.1 port and stops it
at the end. Bounded: --requests requests per phase (at most 64), --max-tokens per request (at most 256) and
--timeout seconds overall.

    python scripts/load_serve.py --requests 8 --concurrency 8 --max-tokens 48 --threads 1
    python scripts/load_serve.py --adapter fruit=runs/fruit --adapter peak=runs/peak --mix  # mixed adapters
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works.",
    "Describe a walk through a forest in autumn.",
    "Tell me about the history of bread.",
    "Write a letter to a friend about a trip to the sea.",
    "Explain why the sky is blue.",
    "Describe your favourite city and why.",
    "Write a poem about the moon and the tides.",
]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, key: str | None, timeout: float) -> dict:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def wait_healthy(url: str, proc, deadline: float, key: str | None) -> list[str]:
    """The server's model names, once it answers /health (which names them only to the key holder)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            sys.exit(f"load_serve: the server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url + "/health", headers=headers), timeout=5) as r:
                h = json.load(r)
                if "model" not in h:
                    sys.exit("load_serve: /health did not name the models: pass the server's key with --api-key")
                return [h["model"]] + h["adapters"]
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.5)
    sys.exit("load_serve: the server did not become healthy in time")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running server on this machine (default: start one)")
    ap.add_argument("--api-key", default=os.environ.get("ROCTUNE_API_KEY"))
    ap.add_argument("--model", help="base model for the server this script starts")
    ap.add_argument("--adapter", action="append", default=[], metavar="NAME=DIR", help="passed to roctune serve")
    ap.add_argument("--mix", action="store_true", help="spread the requests over the base and every adapter")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="--threads for the server (0: torch's default)")
    ap.add_argument("--timeout", type=float, default=900, help="overall limit in seconds")
    args = ap.parse_args()
    if not 1 <= args.requests <= 64 or not 1 <= args.max_tokens <= 256 or not 1 <= args.concurrency <= 64:
        sys.exit("load_serve: keep --requests and --concurrency in 1..64 and --max-tokens in 1..256")
    deadline = time.monotonic() + args.timeout
    proc = None
    url = args.url
    if url:
        if urlparse(url).hostname not in LOOPBACK:
            sys.exit("load_serve: --url must be a loopback address (127.0.0.1, localhost or ::1)")
        url = url.rstrip("/").removesuffix("/v1")
    else:
        port = free_port()
        cmd = [sys.executable, "-m", "roctune", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--max-batch", str(args.max_batch), "--log-level", "warning", "--threads", str(args.threads)]
        if args.model:
            cmd += ["--model", args.model]
        for a in args.adapter:
            cmd += ["--adapter", a]
        env = dict(os.environ)
        if args.api_key:
            env["ROCTUNE_API_KEY"] = args.api_key
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
    try:
        models = wait_healthy(url, proc, deadline, args.api_key)
        chosen = models if args.mix else models[:1]
        jobs = [(chosen[i % len(chosen)], PROMPTS[i % len(PROMPTS)]) for i in range(args.requests)]

        def one(job):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("load_serve: --timeout reached")
            r = post(url, {"model": job[0], "messages": [{"role": "user", "content": job[1]}], "temperature": 0,
                           "max_tokens": args.max_tokens}, args.api_key, left)
            return r["choices"][0]["message"]["content"], r["usage"]["completion_tokens"]

        one(jobs[0])  # warm-up
        t = time.perf_counter()
        seq = [one(j) for j in jobs]
        seq_s = time.perf_counter() - t
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            conc = list(pool.map(one, jobs))
        conc_s = time.perf_counter() - t
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    seq_tok, conc_tok = sum(n for _, n in seq), sum(n for _, n in conc)
    same = sum(a[0] == b[0] for a, b in zip(seq, conc))
    seq_rate, conc_rate = seq_tok / seq_s, conc_tok / conc_s
    print(f"models: {', '.join(sorted({m for m, _ in jobs}))}; {args.requests} requests, greedy, "
          f"max_tokens {args.max_tokens}")
    print(f"sequential:    {seq_tok:5d} tokens in {seq_s:7.2f} s = {seq_rate:7.1f} tokens/s")
    print(f"{args.concurrency:2d} concurrent: {conc_tok:5d} tokens in {conc_s:7.2f} s = {conc_rate:7.1f} tokens/s")
    print(f"speed-up: {conc_rate / seq_rate:.2f}x; identical answers: {same}/{len(jobs)}")
    return 0 if same == len(jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
