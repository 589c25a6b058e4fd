"""Training-side evaluation: --report-to trackers log what metrics.jsonl logs (TensorBoard read back with its own
EventAccumulator), early stopping stops at the expected evaluation, --load-best saves the best weights, and the
flags' mistakes are refused with one line before anything loads."""
from __future__ import annotations

import importlib.machinery
import json
import os
import sys
import types

import pytest

from conftest import read_metrics, run_train, write_jsonl


def _data(tmp_path):
    rows = [{"instruction": f"Say the word number {i}.", "input": "", "output": f"Word {i}: banana."} for i in range(8)]
    held = [{"instruction": f"Name fruit {i}.", "input": "", "output": f"Fruit {i}: cherry."} for i in range(4)]
    return write_jsonl(tmp_path / "train.jsonl", rows), write_jsonl(tmp_path / "eval.jsonl", held)


def _cfg(tmp_path, model, **kw):
    from roctune.config import TrainConfig

    train, held = _data(tmp_path)
    base = dict(data=[train], eval_data=[held], output=str(tmp_path / "run"), model=model, max_steps=6,
                batch_size=2, grad_accum=1, lr=1e-2, max_length=64, device="cpu", eval_steps=2, seed=3)
    base.update(kw)
    return TrainConfig(**base)


def test_tensorboard_events_match_metrics_jsonl(tmp_path, tiny_model_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = _cfg(tmp_path, tiny_model_dir, report_to=["tensorboard"])
    run_train(cfg)
    rows = read_metrics(cfg.output)
    acc = EventAccumulator(os.path.join(cfg.output, "tensorboard"))
    acc.Reload()
    train = acc.Scalars("train/loss")  # event files store float32
    assert [e.step for e in train] == [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [e.value for e in train] == pytest.approx([r["loss"] for r in rows], rel=1e-6)
    evals = acc.Scalars("eval/loss")
    assert [e.step for e in evals] == [r["step"] for r in rows if "eval_loss" in r] == [2, 4, 6]
    assert [e.value for e in evals] == pytest.approx([r["eval_loss"] for r in rows if "eval_loss" in r], rel=1e-6)
    tags = set(acc.Tags()["scalars"])
    assert {"train/lr", "train/grad_norm", "train/tokens_per_s", "train/peak_memory_gib"} <= tags
    assert all(r["peak_memory_gib"] > 0 for r in rows)


@pytest.mark.parametrize("tracker, name_key, in_run_dir", [("wandb", "name", True), ("trackio", "name", False),
                                                         ("swanlab", "experiment_name", False)])
def test_other_trackers_get_the_same_rows(tmp_path, tiny_model_dir, monkeypatch, tracker, name_key, in_run_dir):
    """wandb, trackio and swanlab are not installed here: a stand-in module records what roctune hands it."""
    logged, finished, started = [], [], []
    fake = types.ModuleType(tracker)
    fake.__spec__ = importlib.machinery.ModuleSpec(tracker, None)  # find_spec finds it in sys.modules
    fake.init = lambda **kw: started.append(kw)
    fake.log = lambda values, step: logged.append((step, values))
    fake.finish = lambda: finished.append(True)
    monkeypatch.setitem(sys.modules, tracker, fake)
    monkeypatch.delenv(f"{tracker.upper()}_PROJECT", raising=False)
    cfg = _cfg(tmp_path, tiny_model_dir, report_to=[tracker], max_steps=4)
    run_train(cfg)
    rows = read_metrics(cfg.output)
    assert [s for s, _ in logged] == [r["step"] for r in rows]
    assert [v["train/loss"] for _, v in logged] == pytest.approx([r["loss"] for r in rows])
    assert "eval/loss" in logged[-1][1] and finished == [True]
    (started,) = started
    assert started.pop("config")["max_steps"] == 4
    assert started == {"project": "roctune", name_key: "run", **({"dir": cfg.output} if in_run_dir else {})}


def test_missing_tracker_package_is_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys):
    from roctune.cli import main
    from roctune.training import trackers

    monkeypatch.setattr(trackers, "installed", lambda module: module != "mlflow")
    train, _ = _data(tmp_path)
    out = tmp_path / "run"
    code = main(["train", "--data", train, "--output", str(out), "--report-to", "tensorboard,mlflow"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and not out.exists()
    assert err == ("roctune train: error: --report-to mlflow needs the mlflow package: pip install mlflow "
                   "(or drop mlflow from --report-to)")


@pytest.mark.parametrize("flags, message", [
    (["--early-stopping-patience", "2", "--eval-steps", "2"], "--early-stopping-patience needs evaluation data"),
    (["--load-best"], "--load-best needs evaluation data"),
    (["--early-stopping-patience", "2", "--eval-ratio", "0.2"], "needs --eval-steps N"),
    (["--report-to", "none,tensorboard"], "'none' cannot be combined"),
    (["--report-to", "neptune"], "--report-to must be one of tensorboard, wandb"),
])
def test_bad_flags_are_refused(tmp_path, capsys, flags, message):
    from roctune.cli import main

    train, _ = _data(tmp_path)
    out = tmp_path / "run"
    assert main(["train", "--data", train, "--output", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def _scripted_eval(monkeypatch, losses):
    """Replace the eval pass by a list of eval losses, one per evaluation."""
    from roctune.training import loop

    seq = iter(losses)
    monkeypatch.setattr(loop, "evaluate", lambda *a, **k: {"eval_loss": next(seq)})


def test_early_stopping_stops_at_the_expected_evaluation_and_load_best_saves_the_best(tmp_path, tiny_model_dir,
                                                                                      monkeypatch):
    from safetensors.torch import load_file

    # evaluations at steps 1..; the best is at step 2 (0.8), then two without improvement: stop at step 4
    _scripted_eval(monkeypatch, [1.0, 0.8, 0.9, 0.85, 0.7, 0.6])
    cfg = _cfg(tmp_path, tiny_model_dir, max_steps=10, eval_steps=1, early_stopping_patience=2, load_best=True)
    summary, lines = run_train(cfg)
    rows = read_metrics(cfg.output)
    assert rows[-1]["step"] == 4 and summary["steps"] == 4 and summary["stopped_early"]
    assert [r["eval_loss"] for r in rows] == [1.0, 0.8, 0.9, 0.85]
    assert any("early stopping at step 4" in ln and "best 0.8000 at step 2" in ln for ln in lines), lines
    assert any("kept in" in ln and os.path.join(cfg.output, "best") in ln for ln in lines), lines
    best = os.path.join(cfg.output, "best")
    assert json.load(open(os.path.join(best, "best.json"))) == {"step": 2, "eval_loss": 0.8}
    final = load_file(os.path.join(cfg.output, "adapter_model.safetensors"))
    kept = load_file(os.path.join(best, "adapter_model.safetensors"))
    assert final.keys() == kept.keys() and all((final[k] == kept[k]).all() for k in final)

    # the same run without --load-best ends with the step-4 weights, which differ from the best
    _scripted_eval(monkeypatch, [1.0, 0.8, 0.9, 0.85])
    cfg2 = _cfg(tmp_path, tiny_model_dir, output=str(tmp_path / "run2"), max_steps=10, eval_steps=1,
                early_stopping_patience=2)
    run_train(cfg2)
    last = load_file(os.path.join(cfg2.output, "adapter_model.safetensors"))
    kept2 = load_file(os.path.join(cfg2.output, "best", "adapter_model.safetensors"))
    assert all((kept2[k] == kept[k]).all() for k in kept)  # same seed, same data: same best weights
    assert any(not (last[k] == kept[k]).all() for k in kept)


def test_train_form_picks_several_trackers(tmp_path):
    import gradio as gr

    from roctune.webui import Workspace, form_config
    from roctune.webui.train_form import component, form_specs

    spec = next(s for s in form_specs() if s["name"] == "report_to")
    box = component(gr, spec)
    assert box.multiselect and box.value == ["none"]
    assert {c[0] if isinstance(c, tuple) else c for c in box.choices} >= {"tensorboard", "wandb", "mlflow"}
    write_jsonl(tmp_path / "a.jsonl", [{"instruction": "Hi?", "input": "", "output": "Hello."}])
    cfg, _ = form_config({"data": "a.jsonl", "output": "runs/x", "report_to": ["tensorboard", "wandb"]},
                         Workspace(str(tmp_path)))
    assert cfg.report_to == ["tensorboard", "wandb"]
