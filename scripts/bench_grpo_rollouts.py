"""Benchmark GRPO's rollouts: completions per second of roctune's (roctune.decoding.sample_completions, the batched
KV-cache decoding serve uses, finished rows dropped) against TRL's GRPOTrainer (its `_generate_single_turn`:
transformers' generate on the whole batch), on the same model (the bundled SmolLM2-135M-Instruct with the same
LoRA adapter, unmerged), the same prompts (examples/grpo_arithmetic.jsonl) and the same settings (temperature,
top-p, completions per prompt, max completion length). Each side runs in its own process, a warm-up batch first,
then --repeats timed batches; peak resident memory (ru_maxrss) is the process's whole run, model included.

    python scripts/bench_grpo_rollouts.py [--prompts 8] [--generations 8] [--max-completion-length 64] [--repeats 2]

Run it alone: on a shared CPU other processes change the figures by several times."""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
DATA = os.path.join(REPO, "examples", "grpo_arithmetic.jsonl")


def _model_and_prompts(args):
    import torch
    from peft import LoraConfig, get_peft_model

    from roctune.data.prompts import load_prompts
    from roctune.data.render import render_prompt
    from roctune.models import load_model, load_tokenizer, resolve_model

    path = resolve_model(None)
    tok = load_tokenizer(path)
    torch.manual_seed(0)
    model = get_peft_model(load_model(path, "fp32", "cpu", "sdpa", False),
                           LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0))
    prompts = load_prompts(DATA)[:args.prompts]
    ids = [tok(render_prompt(tok, p.messages), add_special_tokens=False)["input_ids"] for p in prompts]
    return path, tok, model.eval(), [i for i in ids for _ in range(args.generations)]


def _roctune(args, tok, model, ids):
    import torch

    from roctune.decoding import sample_completions
    from roctune.models import stop_token_ids

    eos = set(stop_token_ids(model, tok))
    gen = torch.Generator().manual_seed(0)
    return lambda: sample_completions(model, ids, args.max_completion_length, args.temperature, 1.0, eos,
                                      tok.pad_token_id, gen, "cpu")


def _trl(args, tok, model, ids, path):
    import tempfile

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    cfg = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=len(ids),
                     num_generations=args.generations, max_completion_length=args.max_completion_length,
                     temperature=args.temperature, report_to="none", use_cpu=True, bf16=False)
    trainer = GRPOTrainer(model=model, args=cfg, processing_class=tok, reward_funcs=[lambda completions, **k: [0.0]],
                          train_dataset=Dataset.from_dict({"prompt": ["x"] * len(ids)}))
    trainer.model.eval()
    return lambda: trainer._generate_single_turn(ids, None, {}, args.generations)[0]


def one_side(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    path, tok, model, ids = _model_and_prompts(args)
    run = _roctune(args, tok, model, ids) if args.side == "roctune" else _trl(args, tok, model, ids, path)
    run()  # warm-up
    n = tokens = 0
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        comps = run()
        n, tokens = n + len(comps), tokens + sum(len(c) for c in comps)
    dt = time.perf_counter() - t0
    return {"side": args.side, "completions": n, "tokens": tokens, "seconds": round(dt, 2),
            "completions_per_s": round(n / dt, 2), "tokens_per_s": round(tokens / dt, 1),
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}


def side_flags(doc: str, prompts: int, max_completion_length: int) -> argparse.ArgumentParser:
    """The flags a rollout benchmark shares (its sizes, repeats, threads, and the side a child process runs)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--prompts", type=int, default=prompts)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--max-completion-length", type=int, default=max_completion_length)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    p.add_argument("--side", choices=["roctune", "trl"], help=argparse.SUPPRESS)
    return p


def main() -> None:
    p = side_flags(__doc__, 8, 64)
    p.add_argument("--temperature", type=float, default=1.0)
    args = p.parse_args()
    if args.side:
        print(json.dumps(one_side(args)))
        return
    rows = run_sides(__file__, sys.argv[1:])
    print(f"roctune / TRL completions per second: {rows[0]['completions_per_s'] / rows[1]['completions_per_s']:.2f}x")


def run_sides(script: str, argv: list[str]) -> list[dict]:
    """Run `script --side roctune` and `--side trl` (with `argv`) one after the other, each in its own process;
    print and return their result rows."""
    rows = []
    for side in ("roctune", "trl"):
        out = subprocess.run([sys.executable, script, "--side", side] + argv, capture_output=True,
                             text=True, env=dict(os.environ, PYTHONPATH=REPO, HF_HUB_OFFLINE="1"))
        if out.returncode:
            sys.exit(f"{side} failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for r in rows:
        print(json.dumps(r))
    return rows


if __name__ == "__main__":
    main()
