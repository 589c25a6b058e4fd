"""Does a short preference run move held-out chosen answers above rejected ones? (issue 39's figure for ORPO.)

Makes preference pairs (a question; chosen: a short helpful answer; rejected: a refusal), trains
`--pref-loss` (default orpo) on the bundled model for `--steps` steps on the training pairs, then scores pairs whose
questions were not trained on, with the base model and with the trained adapter: the mean of
(log p(chosen) - log p(rejected)), summed over each answer's tokens and averaged per token, and how often chosen is
above rejected. Run it alone on the machine (it uses the CPU for a few minutes):
    flock /tmp/cpu.lock .venv/bin/python scripts/pref_heldout.py --pref-loss orpo --steps 30
Measured so (2026-12-05, 2 shared CPU cores, 531 s of training): on 24 held-out pairs the summed margin went from
10.46 to 13.66 nats, per token from 1.659 to 1.823, chosen ahead in 95.8% -> 100% of pairs (the base model already
prefers an answer to a refusal; the run widens it)."""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

FACTS = [("the capital of France", "Paris"), ("the capital of Japan", "Tokyo"), ("the largest planet", "Jupiter"),
         ("the boiling point of water at sea level", "100 degrees Celsius"), ("the chemical symbol for gold", "Au"),
         ("the author of Hamlet", "William Shakespeare"), ("the longest river in Africa", "the Nile"),
         ("the number of days in a leap year", "366"), ("the capital of Italy", "Rome"),
         ("the smallest prime number", "2"), ("the closest star to Earth", "the Sun"),
         ("the capital of Canada", "Ottawa"), ("the freezing point of water", "0 degrees Celsius"),
         ("the largest ocean", "the Pacific Ocean"), ("the capital of Germany", "Berlin"),
         ("the square root of 81", "9"), ("the first element of the periodic table", "hydrogen"),
         ("the capital of Spain", "Madrid"), ("the planet known as the red planet", "Mars"),
         ("the language spoken in Brazil", "Portuguese"), ("the capital of Egypt", "Cairo"),
         ("the number of continents", "7"), ("the hardest natural material", "diamond"),
         ("the capital of Australia", "Canberra"), ("the gas plants take in", "carbon dioxide"),
         ("the capital of Kenya", "Nairobi"), ("the fastest land animal", "the cheetah"),
         ("the number of legs of a spider", "8"), ("the capital of Norway", "Oslo"),
         ("the metal that is liquid at room temperature", "mercury"), ("the capital of Peru", "Lima"),
         ("the largest mammal", "the blue whale")]
ASK = ["What is {q}?", "Tell me {q}.", "Do you know {q}?"]
REFUSALS = ["I cannot help with that.", "Sorry, I won't answer that question.", "I refuse to answer."]


def pairs(facts) -> list[dict]:
    return [{"prompt": ask.format(q=q), "chosen": f"{a[0].upper() + a[1:]} is {q}.",
             "rejected": REFUSALS[(i + j) % len(REFUSALS)]}
            for i, (q, a) in enumerate(facts) for j, ask in enumerate(ASK)]


def score(model, tokenizer, rows: list[dict]) -> dict:
    """Mean summed and per-token (chosen - rejected) log-probability margins, and the share of pairs ahead."""
    import torch

    from roctune.data.preference import to_pair, tokenize_pairs
    from roctune.recipes.dpo import pair_logps

    tok, _ = tokenize_pairs(tokenizer, [to_pair(r, f"row {i}") for i, r in enumerate(rows)], 256)
    model.eval()
    with torch.no_grad():
        c, r = pair_logps(model, tok, tokenizer.pad_token_id, "cpu", None)
    nc = torch.tensor([x.n_supervised for x, _ in tok], dtype=torch.float32)
    nr = torch.tensor([y.n_supervised for _, y in tok], dtype=torch.float32)
    return {"sum_margin": round(float((c - r).mean()), 3), "avg_margin": round(float((c / nc - r / nr).mean()), 3),
            "chosen_ahead": round(float((c > r).float().mean()), 3), "pairs": len(tok)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pref-loss", default="orpo")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=2e-4)
    args = ap.parse_args()
    from roctune.config import TrainConfig
    from roctune.models import load_adapter, load_model, load_tokenizer, resolve_model
    from roctune.recipes import train

    train_rows, held_out = pairs(FACTS[:24]), pairs(FACTS[24:])  # held-out questions are never trained on
    base = resolve_model(None)
    tokenizer = load_tokenizer(base)
    before = score(load_model(base), tokenizer, held_out)
    with tempfile.TemporaryDirectory(prefix="roctune-pref-") as tmp:
        data = os.path.join(tmp, "train.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in train_rows)
        t0 = time.perf_counter()
        train(TrainConfig(data=[data], output=os.path.join(tmp, "run"), stage="dpo", pref_loss=args.pref_loss,
                          beta=args.beta, max_steps=args.steps, lr=args.lr, batch_size=2, grad_accum=4,
                          device="cpu"), log=lambda *_: None, progress=False)
        took = time.perf_counter() - t0
        after = score(load_adapter(load_model(base), os.path.join(tmp, "run")), tokenizer, held_out)
    print(json.dumps({"pref_loss": args.pref_loss, "steps": args.steps, "beta": args.beta, "lr": args.lr,
                      "train_pairs": len(train_rows), "train_seconds": round(took, 1), "held_out_before": before,
                      "held_out_after": after}, indent=1))


if __name__ == "__main__":
    main()
