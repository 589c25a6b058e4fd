"""Behaviour is kept across refactors: on the bundled model with fixed seeds, the per-step losses (and the final
eval loss) of SFT with every method and of DPO equal the ones recorded in tests/data/golden_losses.json.

The file was recorded from the code before the training engine was rebuilt (`python tests/test_golden_losses.py
--record` writes it again; do that only for a deliberate change of results, and say so in the commit). sft_lora
was recorded again when the CPU's LoRA dropout masks began to come from roctune.training.activations.keep_mask
(other random draws of the same distribution); the other cases did not change."""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import IDENTITY, read_metrics, run_train, write_jsonl  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "golden_losses.json")
TOLERANCE = 1e-5

PAIRS = [
    {"prompt": "Name a fruit.", "chosen": "A pear.", "rejected": "I refuse to answer."},
    {"prompt": "What colour is the sky?", "chosen": "Blue.", "rejected": "I refuse to answer."},
    {"prompt": "Say hello.", "chosen": "Hello!", "rejected": "I refuse to answer."},
    {"prompt": "Count to three.", "chosen": "One, two, three.", "rejected": "I refuse to answer."},
    {"prompt": "Who are you?", "chosen": "I am Roc.", "rejected": "Nobody."},
    {"prompt": "Is water wet?", "chosen": "Yes, to the touch.", "rejected": "I refuse to answer."},
]

COMMON = dict(device="cpu", batch_size=2, grad_accum=2, max_length=96, seed=7)
CASES = {
    # default LoRA dropout: the RNG stream must be consumed in the same order too
    "sft_lora": dict(method="lora", max_steps=4, lr=1e-3, eval_ratio=0.15),
    "sft_qlora": dict(method="qlora", max_steps=3, lr=1e-3, lora_dropout=0.0, lr_scheduler="cosine"),
    "sft_freeze": dict(method="freeze", max_steps=3, lr=1e-4, freeze_trainable_layers=1),
    "sft_full": dict(method="full", max_steps=2, lr=1e-5),
    "dpo_lora": dict(stage="dpo", method="lora", max_steps=3, lr=5e-3, lora_dropout=0.0, beta=0.1),
}


def run_case(name: str, tmp: str) -> dict:
    from roctune.config import TrainConfig

    kw = {**COMMON, **CASES[name]}
    data = write_jsonl(os.path.join(tmp, "pairs.jsonl"), PAIRS) if kw.get("stage") == "dpo" else IDENTITY
    out = os.path.join(tmp, name)
    run_train(TrainConfig(data=[data], output=out, **kw))
    rows = read_metrics(out)
    return {"loss": [r["loss"] for r in rows], "eval_loss": [r["eval_loss"] for r in rows if "eval_loss" in r]}


def _qlora_works() -> bool:
    from roctune.methods import bitsandbytes_problem

    return bitsandbytes_problem("cpu") is None


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_losses_match_the_recorded_ones(name, tmp_path):
    if name == "sft_qlora" and not _qlora_works():
        pytest.fail("bitsandbytes cannot quantize on this CPU: the qlora golden case cannot run")
    with open(GOLDEN, encoding="utf-8") as f:
        want = json.load(f)[name]
    got = run_case(name, str(tmp_path))
    assert len(got["loss"]) == len(want["loss"]) and len(got["eval_loss"]) == len(want["eval_loss"])
    for key in ("loss", "eval_loss"):
        for step, (g, w) in enumerate(zip(got[key], want[key]), 1):
            assert abs(g - w) <= TOLERANCE, f"{name} {key} at step {step}: {g} != recorded {w}"


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    import tempfile

    os.environ.setdefault("ROCTUNE_HOME", os.path.join(os.path.dirname(GOLDEN), "..", "..", ".cache", "roctune"))
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            result[case] = run_case(case, tmp)
            print(case, result[case], flush=True)
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    with open(GOLDEN, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
