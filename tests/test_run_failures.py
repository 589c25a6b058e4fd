"""A run that breaks numerically ends as failed, never as done (issue 46): settings that scale or shift a loss are
bounded below fp32's overflow, a data margin too, and a loss, gradient norm or trainable weight that is not a finite
number stops the run with one line, exit 1, status.json `failed` and no final adapter."""
from __future__ import annotations

import json
import os

import pytest

from roctune import rundir
from roctune.cli import main

from conftest import write_jsonl

KTO = [{"prompt": "Name a fruit.", "completion": "A pear.", "label": True},
       {"prompt": "Say hello.", "completion": "Go away.", "label": False}]


def train_args(model, data, out, *more):
    return ["train", "--data", str(data), "--output", str(out), "--model", model, "--device", "cpu",
            "--batch-size", "2", "--grad-accum", "1", "--max-length", "64", *more]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("flags, named", [
    (["--stage", "kto", "--desirable-weight", "1e308"], "--desirable-weight"),
    (["--stage", "kto", "--undesirable-weight", "1e30"], "--undesirable-weight"),
    (["--stage", "dpo", "--beta", "1e308"], "--beta"),
])
def test_a_loss_scale_past_fp32_is_refused_before_anything_loads(tiny_model_dir, tmp_path, capsys, flags, named):
    data = write_jsonl(tmp_path / "k.jsonl", KTO)
    out = tmp_path / "run"
    code = main(train_args(tiny_model_dir, data, out, *flags))
    line = one_line(capsys)
    assert code == 2 and named in line and "<= 10000" in line, line
    assert not out.exists()


def test_a_reward_margin_past_fp32_is_refused_with_its_line(tiny_model_dir, tmp_path, capsys):
    pairs = [{"prompt": "Q", "chosen": "good", "rejected": "bad", "margin": 1.0},
             {"prompt": "Q2", "chosen": "good", "rejected": "bad", "margin": 1e308}]
    data = write_jsonl(tmp_path / "p.jsonl", pairs)
    out = tmp_path / "run"
    code = main(train_args(tiny_model_dir, data, out, "--stage", "rm"))
    line = one_line(capsys)
    assert code == 2 and "p.jsonl" in line and "p.jsonl:2:" in line and "'margin'" in line, line
    assert not out.exists()


def _ended_failed(out, capsys, code, wanted: str) -> dict:
    line = one_line(capsys)
    assert code == 1 and wanted in line, line
    status = json.load(open(os.path.join(out, rundir.STATUS_FILE)))
    assert status["phase"] == "failed" and wanted in status["error"]
    assert not os.path.exists(os.path.join(out, rundir.ADAPTER_WEIGHTS))  # nothing broken is saved as the model
    assert rundir.run_state(str(out)) == "failed"
    return status


def test_weights_that_overflow_in_the_last_update_fail_the_run(tiny_model_dir, alpaca_file, tmp_path, capsys):
    """An lr of 1e308 gives a finite loss and gradient norm at step 1, and infinite LoRA weights after its update:
    the final save refuses them."""
    out = tmp_path / "run"
    code = main(train_args(tiny_model_dir, alpaca_file, out, "--lr", "1e308", "--max-steps", "1"))
    _ended_failed(out, capsys, code, "hold NaN or infinite values")


def test_a_loss_that_is_not_finite_stops_the_run_at_its_step(tiny_model_dir, alpaca_file, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(train_args(tiny_model_dir, alpaca_file, out, "--lr", "1e308", "--max-steps", "3"))
    status = _ended_failed(out, capsys, code, "step 2: the loss is nan")
    rows = [json.loads(x) for x in open(os.path.join(out, rundir.METRICS_FILE))]
    assert [r["step"] for r in rows] == [1]  # the broken step is not logged as trained
    assert status.get("step", 1) == 1
