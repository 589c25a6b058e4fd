"""Does a short --stage rm run score held-out chosen answers above rejected ones? (issue 39's figure for rm.)

The preference pairs of scripts/pref_heldout.py (a question; chosen: a short helpful answer; rejected: a refusal),
the same train / held-out split by question. Trains a reward model (LoRA + the scalar head) on the bundled model for
`--steps` steps, then scores the held-out pairs with `roctune eval`'s own code (roctune.eval.reward_model.pairwise):
the share of pairs whose chosen answer scores higher, and the mean margin. "Before" is the reward model as training
starts (the base model and the new head as the run's seed initialises it; LoRA starts at zero). Run it alone on the
machine (it uses the CPU for a few minutes):
    flock /tmp/cpu.lock nice -n 19 .venv/bin/python scripts/rm_heldout.py --steps 20
Measured so (2026-12-05, 2 shared CPU cores, 58 s of training; LoRA r 16, lr 5e-4, 20 steps of 8 pairs): on the 24
held-out pairs, chosen scored above rejected in 41.7% of pairs before (mean margin -0.014) and 100% after (mean
margin 8.66: chosen 5.39, rejected -3.28); final training loss 0.0002. The pairs are easy (an answer against a
refusal): the figure shows the recipe and its eval working end to end, not a hard preference task."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pref_heldout import FACTS, pairs  # noqa: E402 - the same pairs and split as the DPO-loss figure


def before(base: str, rows: list[dict], seed: int) -> dict:
    """Accuracy and margin of the untrained reward model (the head as a run with `seed` initialises it)."""
    import torch

    from roctune.eval.reward_model import RewardModel, score_conversations
    from roctune.models import load_model, load_tokenizer

    torch.manual_seed(seed)
    tok = load_tokenizer(base)
    model = load_model(base, scalar_head=True)
    model.config.pad_token_id = tok.pad_token_id
    model.eval()
    convs = [[{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r[k]}]
             for r in rows for k in ("chosen", "rejected")]
    v = score_conversations(RewardModel(model, tok, "cpu"), convs)
    ch, rj = v[0::2], v[1::2]
    return {"n": len(rows), "accuracy": round(sum(c > r for c, r in zip(ch, rj)) / len(rows), 4),
            "margin": round(sum(c - r for c, r in zip(ch, rj)) / len(rows), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    from roctune.config import TrainConfig
    from roctune.eval.reward_model import pairwise
    from roctune.models import resolve_model
    from roctune.recipes import train

    train_rows, held_out = pairs(FACTS[:24]), pairs(FACTS[24:])  # held-out questions are never trained on
    base = resolve_model(None)
    start = before(base, held_out, args.seed)
    with tempfile.TemporaryDirectory(prefix="roctune-rm-") as tmp:
        data, held = os.path.join(tmp, "train.jsonl"), os.path.join(tmp, "held.jsonl")
        for path, rows in ((data, train_rows), (held, held_out)):
            with open(path, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        t0 = time.perf_counter()
        out = os.path.join(tmp, "run")
        summary = train(TrainConfig(data=[data], output=out, stage="rm", max_steps=args.steps, lr=args.lr,
                                    batch_size=4, grad_accum=2, lora_r=16, lora_alpha=32, seed=args.seed,
                                    device="cpu"), log=lambda *_: None, progress=False)
        took = time.perf_counter() - t0
        after = pairwise(out, [held], lambda *_: None, device="cpu")
    print(json.dumps({"steps": args.steps, "lr": args.lr, "train_pairs": len(train_rows),
                      "train_seconds": round(took, 1), "final_loss": summary["final_loss"],
                      "held_out_before": start, "held_out_after": after}, indent=1))


if __name__ == "__main__":
    main()
