"""Does a short KTO run move held-out desirable answers above undesirable ones? (issue 39's figure for KTO.)

Trains `--stage kto` on the bundled model for `--steps` steps on examples/kto_identity.jsonl (each identity question
answered twice: "I am Roc ..." marked desirable, a SmolLM / no-name answer marked undesirable), then scores
examples/kto_identity_heldout.jsonl (questions never trained on) with the base model and with the trained adapter:
the mean log-probability of the desirable and of the undesirable answers (summed over each answer's tokens, and
per token), and how often a question's desirable answer is above its undesirable one. Run it alone on the machine
(it uses the CPU for several minutes):
    flock /tmp/cpu.lock nice -n 19 .venv/bin/python scripts/kto_heldout.py --steps 30
Measured so (2026-12-05, 2 CPU cores shared with other jobs, 1706 s of training): on the 6 held-out questions the
desirable answers' mean log-probability went from -123.2 to -86.9 nats (per token -4.68 to -3.28), the undesirable
ones' from -40.3 to -82.4 (per token -2.05 to -4.21); desirable ahead (summed) on 0 -> 1 of 6 questions (the
desirable answers are about twice as long, so per token they now lead and summed they nearly do)."""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(HERE, "examples", "kto_identity.jsonl")
HELD_OUT = os.path.join(HERE, "examples", "kto_identity_heldout.jsonl")


def score(model, tokenizer, path: str) -> dict:
    """Mean summed / per-token log-probabilities of the desirable and undesirable answers, and the share of
    questions (a desirable and an undesirable answer each) whose desirable answer scores higher (summed)."""
    import torch

    from roctune.data.kto import load_examples, tokenize_examples
    from roctune.recipes.kto import logps

    examples = load_examples(path)
    tok, _ = tokenize_examples(tokenizer, examples, 256)
    model.eval()
    with torch.no_grad():
        lp = logps(model, [t for t, _ in tok], tokenizer.pad_token_id, "cpu", None).float()
    n = torch.tensor([t.n_supervised for t, _ in tok], dtype=torch.float32)
    good = torch.tensor([d for _, d in tok])
    by_q: dict = {}
    for e, v in zip(examples, lp.tolist()):
        by_q.setdefault(e.prompt[-1]["content"], {})[e.desirable] = v
    ahead = [q[True] > q[False] for q in by_q.values() if len(q) == 2]
    return {"desirable_sum": round(float(lp[good].mean()), 3), "undesirable_sum": round(float(lp[~good].mean()), 3),
            "desirable_per_token": round(float((lp / n)[good].mean()), 3),
            "undesirable_per_token": round(float((lp / n)[~good].mean()), 3),
            "desirable_ahead": round(sum(ahead) / max(1, len(ahead)), 3), "questions": len(ahead)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=5e-4)
    args = ap.parse_args()
    from roctune.config import TrainConfig
    from roctune.models import load_adapter, load_model, load_tokenizer, resolve_model
    from roctune.recipes import train

    base = resolve_model(None)
    tokenizer = load_tokenizer(base)
    before = score(load_model(base), tokenizer, HELD_OUT)
    with tempfile.TemporaryDirectory(prefix="roctune-kto-") as tmp:
        t0 = time.perf_counter()
        summary = train(TrainConfig(data=[TRAIN], output=os.path.join(tmp, "run"), stage="kto", beta=args.beta,
                                    max_steps=args.steps, lr=args.lr, batch_size=2, grad_accum=4, device="cpu"),
                        log=lambda *_: None, progress=False)
        took = time.perf_counter() - t0
        with open(os.path.join(tmp, "run", "metrics.jsonl"), encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        after = score(load_adapter(load_model(base), os.path.join(tmp, "run")), tokenizer, HELD_OUT)
    last = [r for r in rows if "loss" in r][-5:]
    print(json.dumps({"steps": args.steps, "beta": args.beta, "lr": args.lr, "train_examples": 56,
                      "train_seconds": round(took, 1), "final_loss": summary.get("final_loss"),
                      "last_steps_kl": [r.get("kl") for r in last],
                      "last_steps_reward_margin": [r.get("reward_margin") for r in last],
                      "held_out_before": before, "held_out_after": after}, indent=1))


if __name__ == "__main__":
    main()
