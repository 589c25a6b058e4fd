"""Learning, offline, on the CPU: a vision-language model assembled from the bundled SmolLM2-135M-Instruct and a
freshly initialised SigLIP-shaped tower (`roctune models build-vlm`) learns the bundled synthetic image task
(examples/vision_shapes*.jsonl: the colour or the shape drawn in each picture).

It builds the model, answers the held-out questions with it (greedy, a few tokens), trains it with `roctune train
--train-vision-tower --train-projector` (LoRA on the language model; the tower and projector trained whole), answers
again with the adapter, and prints both accuracies, a few answers of each, and the training time. An answer counts
when its first word is the expected one. Run it alone (`flock /tmp/cpu.lock`): the time is a figure.

    flock /tmp/cpu.lock .venv/bin/python scripts/vision_learning.py [--work DIR] [--epochs N]
    # or in parts (the training phase took 11 minutes on 2 shared cores): --phase base, then train, then tuned
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # this checkout's roctune
TRAIN = os.path.join(REPO, "examples", "vision_shapes.jsonl")
HELDOUT = os.path.join(REPO, "examples", "vision_shapes_heldout.jsonl")


def roctune(*args: str) -> None:
    cmd = [sys.executable, "-m", "roctune", *args]
    print("$ roctune " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})


def answers(model_dir: str, adapter: str | None, records) -> list[str]:
    """The model's greedy answer (up to 4 tokens) to each record's question, with its image."""
    import torch

    from roctune.data.render import render_prompt
    from roctune.vision import load_image_text, load_model

    it = load_image_text(model_dir)
    model = load_model(model_dir)
    if adapter:
        from roctune.models import load_adapter

        model = load_adapter(model, adapter)
    model.eval()
    out = []
    with torch.no_grad():
        for r in records:
            text = render_prompt(it.tokenizer, r.messages[:-1])
            inputs = it.processor(text=[text], images=[it.pictures(r.images)], return_tensors="pt",
                                  add_special_tokens=False)
            ids = model.generate(**inputs, max_new_tokens=4, do_sample=False,
                                 pad_token_id=it.tokenizer.pad_token_id)
            out.append(it.tokenizer.decode(ids[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip())
    return out


def first_word(text: str) -> str:
    m = re.match(r"\W*(\w+)", text)
    return m.group(1).lower() if m else ""


def score(records, said: list[str]) -> dict:
    hits = {"colour": [0, 0], "shape": [0, 0]}
    for r, s in zip(records, said):
        want = first_word(r.messages[-1]["content"])
        kind = "shape" if want in ("circle", "square", "triangle") else "colour"
        hits[kind][0] += first_word(s) == want
        hits[kind][1] += 1
    total = sum(h[0] for h in hits.values()) / max(1, sum(h[1] for h in hits.values()))
    return {"accuracy": round(total, 4), **{k: f"{a}/{n}" for k, (a, n) in hits.items()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", help="folder for the model, the run and the answers (default: a temporary one)")
    p.add_argument("--phase", choices=("base", "train", "tuned", "all"), default="all",
                   help="one part only (for a shared machine's lock; the training is the long one, ~11 min); "
                        "the report is printed once the base and tuned answers are both in --work")
    p.add_argument("--epochs", default="3")
    p.add_argument("--lr", default="3e-4")
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="roctune-vision-")
    model, run = os.path.join(work, "vlm"), os.path.join(work, "run")
    from roctune.data.records import load_records

    heldout = load_records(HELDOUT)
    if not os.path.isdir(model):
        roctune("models", "build-vlm", "--output", model)
    if args.phase in ("base", "all"):
        save(work, "base", {"answers": answers(model, None, heldout)})
    if args.phase in ("train", "all"):
        start = time.time()
        roctune("train", "--model", model, "--data", TRAIN, "--output", run, "--overwrite", "--train-vision-tower",
                "--train-projector", "--epochs", args.epochs, "--lr", args.lr, "--batch-size", "8", "--grad-accum",
                "1", "--lora-r", "16", "--lora-alpha", "32", "--max-length", "96", "--eval-data", HELDOUT)
        save(work, "train", {"seconds": round(time.time() - start)})
    if args.phase in ("tuned", "all"):
        save(work, "tuned", {"answers": answers(model, run, heldout)})
    report(work, heldout)
    return 0


def save(work: str, name: str, value: dict) -> None:
    with open(os.path.join(work, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump(value, f)


def report(work: str, heldout) -> None:
    """Both accuracies and the first answers of each, once the phases have run."""
    got = {}
    for name in ("base", "train", "tuned"):
        path = os.path.join(work, f"{name}.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                got[name] = json.load(f)
    if "base" not in got or "tuned" not in got:
        print(f"done so far: {', '.join(got) or 'nothing'} (in {work})")
        return
    base, tuned = got["base"]["answers"], got["tuned"]["answers"]
    with open(TRAIN, encoding="utf-8") as f:
        n_train = sum(1 for _ in f)
    print(json.dumps({"base": score(heldout, base), "tuned": score(heldout, tuned),
                      "train_seconds": got.get("train", {}).get("seconds"),
                      "examples": {"train": n_train, "heldout": len(heldout)}}, indent=1))
    print("question | expected | base | tuned")
    for r, b, t in list(zip(heldout, base, tuned))[:8]:
        print(f"{r.messages[0]['content'].replace('<image>', '')} | {r.messages[-1]['content']} | {b!r} | {t!r}")


if __name__ == "__main__":
    sys.exit(main())
