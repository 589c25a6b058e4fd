"""Wall time of short DPO and SFT runs on the same prompts: work must follow what was asked (a few steps cost a
few pairs), not the size of the data set.

Makes a preference set shaped like LLaMA-Factory's dpo_en_demo (300 pairs, prompts and answers of one to a few
hundred tokens; generated here, since nothing is downloaded), then times, each as its own `roctune train`
process on the bundled model with batch 1 (x 4 accumulation, the default):
    dpo --max-steps 2, dpo --max-steps 8, sft --max-steps 2, sft --max-steps 8 (prompt + chosen answer).
Run it alone on the machine: `.venv/bin/python scripts/bench_dpo_cost.py`.
With `--data dpo_en_demo.json` (LLaMA-Factory's file, from its source distribution) it times that file instead,
and SFT trains on the same prompts with the chosen answer."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time

WORDS = ("model data train answer question river light stone garden number system value music paper window "
         "market engine letter planet winter summer forest ocean signal memory history").split()


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def make_sets(folder: str, n: int = 300) -> tuple[str, str]:
    rng = random.Random(0)
    pairs = [{"prompt": text(rng, rng.randint(20, 200)), "chosen": text(rng, rng.randint(20, 200)),
              "rejected": text(rng, rng.randint(20, 200))} for _ in range(n)]
    dpo, sft = os.path.join(folder, "dpo.jsonl"), os.path.join(folder, "sft.jsonl")
    with open(dpo, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(p) + "\n" for p in pairs)
    with open(sft, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"instruction": p["prompt"], "output": p["chosen"]}) + "\n" for p in pairs)
    return dpo, sft


def sets_from(path: str, folder: str) -> tuple[str, str]:
    """The given preference file, and an SFT file of its prompts with their chosen answers (ShareGPT shape)."""
    rows = json.load(open(path, encoding="utf-8"))
    sft = os.path.join(folder, "sft.jsonl")
    with open(sft, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"conversations": r["conversations"] + [r["chosen"]]}) + "\n" for r in rows)
    return path, sft


def timed(args: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "roctune", "train", *args], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"failed: roctune train {' '.join(args)}\n{r.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="roctune-dpo-cost-") as tmp:
        dpo, sft = sets_from(sys.argv[2], tmp) if sys.argv[1:2] == ["--data"] else make_sets(tmp)
        rows = []
        for stage, data in (("dpo", dpo), ("sft", sft)):
            for steps in (2, 8):
                out = os.path.join(tmp, f"{stage}-{steps}")
                s = timed(["--stage", stage, "--data", data, "--output", out, "--max-steps", str(steps),
                           "--batch-size", "1", "--device", "cpu"])
                rows.append((stage, steps, s))
                print(f"{stage} --max-steps {steps}: {s:.1f} s", flush=True)
    print("\n| run | wall time |\n| --- | ---: |")
    for stage, steps, s in rows:
        print(f"| {stage} --max-steps {steps} --batch-size 1 | {s:.1f} s |")


if __name__ == "__main__":
    main()
