"""roctune train on a tiny model: outputs, speed options giving the same losses, resume, config layering and
every bad-input case (one clear error, exit code 2, nothing written)."""
import json
import os

import pytest

from roctune.cli import main
from roctune.config import TrainConfig
from roctune.recipes import train


def tiny_cfg(model_dir, data, out, **kw) -> TrainConfig:
    base = dict(data=[data], output=str(out), model=model_dir, max_steps=3, batch_size=2, grad_accum=2,
                max_length=64, lr=1e-2, lora_dropout=0.0, device="cpu")
    base.update(kw)
    return TrainConfig(**base)


def losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line)["loss"] for line in f]


def test_train_writes_a_complete_run(tiny_model_dir, alpaca_file, tmp_path):
    out = tmp_path / "run"
    summary = train(tiny_cfg(tiny_model_dir, alpaca_file, out), log=lambda s: None, progress=False)
    names = set(os.listdir(out))
    assert {"adapter_model.safetensors", "adapter_config.json", "run.yaml", "metrics.jsonl", "loss.png",
            "tokenizer.json", "tokenizer_config.json"} <= names
    assert not [n for n in names if n.startswith(".tmp")]
    import yaml

    run = yaml.safe_load(open(out / "run.yaml"))
    assert run["base_model"] == tiny_model_dir
    assert run["resolved"]["dtype"] == "fp32" and run["resolved"]["device"] == "cpu"
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["tokens_per_s"] > 0 and r["supervised_tokens"] > 0 for r in rows)
    assert summary["final_loss"] == pytest.approx(rows[-1]["loss"], abs=1e-6)
    cfg = json.load(open(out / "adapter_config.json"))
    assert cfg["r"] == 8 and cfg["lora_alpha"] == 16 and set(cfg["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}


@pytest.mark.parametrize("options", [
    {"packing": "on"},
    {"loss_on_supervised_only": False},
    {"packing": "on", "loss_on_supervised_only": False},
    {"grad_checkpointing": True},
])
def test_speed_options_match_the_plain_path(tiny_model_dir, alpaca_file, tmp_path, options):
    fast = losses(train(tiny_cfg(tiny_model_dir, alpaca_file, tmp_path / "fast"), log=lambda s: None,
                        progress=False)["output"])
    other = losses(train(tiny_cfg(tiny_model_dir, alpaca_file, tmp_path / "other", **options),
                         log=lambda s: None, progress=False)["output"])
    assert other == pytest.approx(fast, rel=1e-4, abs=1e-5)


def test_loss_goes_down_with_eval(tiny_model_dir, alpaca_file, tmp_path):
    cfg = tiny_cfg(tiny_model_dir, alpaca_file, tmp_path / "run", max_steps=8, eval_ratio=0.25, lora_r=16)
    summary = train(cfg, log=lambda s: None, progress=False)
    ls = losses(cfg.output)
    assert ls[-1] < ls[0]
    rows = [json.loads(line) for line in open(os.path.join(cfg.output, "metrics.jsonl"))]
    assert "eval_loss" in rows[-1] and summary["eval_loss"] == rows[-1]["eval_loss"]


def test_resume_continues_exactly(tiny_model_dir, alpaca_file, tmp_path):
    """Dropout on: the RNG state goes into the checkpoint and comes back, so the masks after the resume are the ones
    the uninterrupted run drew."""
    import shutil

    straight = losses(train(tiny_cfg(tiny_model_dir, alpaca_file, tmp_path / "a", max_steps=4, lora_dropout=0.1),
                            log=lambda s: None, progress=False)["output"])
    out = tmp_path / "b"
    train(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=4, save_steps=2, lora_dropout=0.1),
          log=lambda s: None, progress=False)
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")) == ["checkpoint-2", "checkpoint-4"]
    # pretend the run stopped after step 2: drop what came later, then resume
    lines = open(out / "metrics.jsonl").read().splitlines()[:2]
    open(out / "metrics.jsonl", "w").write("\n".join(lines) + "\n")
    os.unlink(out / "adapter_model.safetensors")
    shutil.rmtree(out / "checkpoint-4")
    train(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=4, save_steps=2, resume=True, lora_dropout=0.1),
          log=lambda s: None, progress=False)
    assert losses(out) == pytest.approx(straight, rel=1e-5)
    assert os.path.isfile(out / "adapter_model.safetensors")


def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(tiny_model_dir, alpaca_file, tmp_path, caplog):
    straight = losses(train(tiny_cfg(tiny_model_dir, alpaca_file, tmp_path / "a", max_steps=4),
                            log=lambda s: None, progress=False)["output"])
    out = tmp_path / "b"
    train(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=4, save_steps=1), log=lambda s: None, progress=False)
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")) == ["checkpoint-3", "checkpoint-4"]
    # the newest checkpoint's weights were cut short (a killed copy, a full disk): resume takes checkpoint-3
    weights = out / "checkpoint-4" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    lines = []
    with caplog.at_level("WARNING"):
        train(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=4, save_steps=1, resume=True),
              log=lines.append, progress=False)
    assert "resumed from step 3" in lines
    assert any("checkpoint-4" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert losses(out) == pytest.approx(straight, rel=1e-5)
    # checkpoints hold no pickles: tensors in safetensors, the rest in JSON
    assert sorted(os.listdir(out / "checkpoint-3")) == sorted(
        ["adapter_config.json", "adapter_model.safetensors", "README.md", "trainer_state.json",
         "training_state.json", "training_state.safetensors"])


def test_config_file_flags_and_overrides(tmp_path, alpaca_file):
    from roctune.cli import build_parser
    from roctune.commands.train import config_from_args

    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("lr: 0.001\nlora-r: 4\nbatch_size: 8\ntarget_modules: [q_proj, v_proj]\n")
    args = build_parser().parse_args(["train", "--config", str(cfg_file), "--data", alpaca_file, "--output", "o",
                                      "--lora-r", "16", "max_length=128", "epochs=2"])
    cfg = config_from_args(args)
    assert (cfg.lr, cfg.lora_r, cfg.batch_size, cfg.max_length, cfg.epochs) == (0.001, 16, 8, 128, 2.0)
    assert cfg.target_modules == ["q_proj", "v_proj"]
    assert cfg.trust_remote_code is False


# ------------------------------------------------------------------------------------------- bad input
def run_cli(args, capsys):
    code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def assert_one_error(code, err, *needles):
    assert code == 2
    assert len(err) == 1 and err[0].startswith("roctune train: error:"), err
    for n in needles:
        assert n in err[0], err[0]


def assert_refused(capsys, out, args, *needles):
    """`roctune train --output OUT ARGS` stops with one error line naming the needles, and writes nothing."""
    code, err = run_cli(["train", "--output", str(out), *args], capsys)
    assert_one_error(code, err, *needles)
    assert not out.exists()


GOOD_ROW = '{"instruction": "a", "output": "b"}\n'


@pytest.mark.parametrize("name, text, needles", [
    ("nope.jsonl", None, ("nope.jsonl", "no such file")),
    ("bad.jsonl", GOOD_ROW + '{"instruction": "c", "output": \n', ("bad.jsonl:2", "invalid JSON")),
    ("bad.jsonl", GOOD_ROW + '{"instruction": "c"}\n', ("bad.jsonl:2", "'output'")),
    ("empty.jsonl", "", ("empty.jsonl", "empty")),
], ids=["missing_file", "invalid_json_names_the_line", "record_missing_field", "empty_dataset"])
def test_bad_dataset(tmp_path, capsys, tiny_model_dir, name, text, needles):
    data = tmp_path / name
    if text is not None:
        data.write_text(text)
    assert_refused(capsys, tmp_path / "out", ["--data", str(data), "--model", tiny_model_dir], *needles)


def test_unknown_model(tmp_path, capsys, alpaca_file):
    out = tmp_path / "out"
    assert_refused(capsys, out, ["--data", alpaca_file, "--model", "no-such-org/no-such-model"],
                   "no-such-org/no-such-model")
    assert_refused(capsys, out, ["--data", alpaca_file, "--model", str(tmp_path / "missing-dir")], "missing-dir")


def test_output_holding_another_run_is_refused(tmp_path, capsys, tiny_model_dir, alpaca_file):
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.yaml").write_text("base_model: x\n")
    (out / "adapter_model.safetensors").write_bytes(b"old")
    before = sorted(os.listdir(out))
    code, err = run_cli(["train", "--data", alpaca_file, "--output", str(out), "--model", tiny_model_dir,
                         "--max-steps", "1"], capsys)
    assert_one_error(code, err, "already holds a previous run", "--overwrite")
    assert sorted(os.listdir(out)) == before and (out / "adapter_model.safetensors").read_bytes() == b"old"
    code, _ = run_cli(["train", "--data", alpaca_file, "--output", str(out), "--model", tiny_model_dir,
                       "--max-steps", "1", "--batch-size", "2", "--grad-accum", "1", "--overwrite"], capsys)
    assert code == 0 and (out / "adapter_model.safetensors").read_bytes() != b"old"


def test_bad_flag_values(tmp_path, capsys, tiny_model_dir, alpaca_file):
    out = tmp_path / "out"
    assert_refused(capsys, out, ["--data", alpaca_file, "--batch-size", "0"], "batch-size")
    assert_refused(capsys, out, ["--data", alpaca_file, "lr=fast"], "lr")
    assert_refused(capsys, out, ["--data", alpaca_file, "--model", tiny_model_dir, "--target-modules", "c_attn"],
                   "c_attn", "q_proj")


# ------------------------------------------------------------------------------------------ out of memory
def inject_oom(monkeypatch, max_rows: int):
    """Make every micro-batch with more than `max_rows` examples fail as the GPU would."""
    import torch

    import roctune.recipes.sft as T

    real = T.token_loss_sum
    calls = {"oom": 0}

    def limited(model, batch, supervised_only):
        if batch.input_ids.shape[0] > max_rows:
            calls["oom"] += 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, batch, supervised_only)

    monkeypatch.setattr(T, "token_loss_sum", limited)
    return calls


def test_auto_batch_recovers_with_the_same_effective_batch(tiny_model_dir, alpaca_file, tmp_path, monkeypatch):
    kw = dict(batch_size=4, grad_accum=1, max_steps=3)
    plain = losses(train(tiny_cfg(tiny_model_dir, alpaca_file, tmp_path / "plain", **kw),
                         log=lambda s: None, progress=False)["output"])
    calls = inject_oom(monkeypatch, max_rows=1)
    messages = []
    out = train(tiny_cfg(tiny_model_dir, alpaca_file, tmp_path / "auto", auto_batch=True, **kw),
                log=messages.append, progress=False)["output"]
    assert calls["oom"] == 2  # 4 -> 2 -> 1 examples per micro-batch, then it fits
    assert any("retrying with 1 examples per micro-batch and 4x accumulation (same 4 examples" in m for m in messages)
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["micro_batch_size"] for r in rows] == [1, 1, 1]
    # the same examples per optimizer step, normalised by the same token count: the same losses
    assert [r["loss"] for r in rows] == pytest.approx(plain, rel=1e-4)


def test_out_of_memory_without_auto_batch_stops_with_options(tiny_model_dir, alpaca_file, tmp_path, monkeypatch, capsys):
    inject_oom(monkeypatch, max_rows=1)
    out = tmp_path / "run"
    code = main(["train", "--data", alpaca_file, "--output", str(out), "--model", tiny_model_dir, "--device", "cpu",
                 "--batch-size", "4", "--grad-accum", "1", "--max-steps", "4", "--save-steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and "out of memory at step 1 with 4 examples per micro-batch" in err[0]
    assert "estimated peak" in err[0] and "GiB" in err[0]
    assert "--auto-batch" in err[0] and "--batch-size 2 --grad-accum 2" in err[0] and "--grad-checkpointing" in err[0]
    leftovers = [n for n in os.listdir(out) if n.startswith((".tmp", "checkpoint-"))]
    assert leftovers == []  # no half-written checkpoint


def test_an_interrupt_in_the_last_evaluation_keeps_the_trained_adapter(tiny_model_dir, alpaca_file, tmp_path,
                                                                       monkeypatch):
    from roctune.training import loop

    calls = []

    def evaluate(self, model):
        calls.append(1)
        if len(calls) == 2:  # the evaluation after the last step
            raise KeyboardInterrupt
        return {"eval_loss": 1.0}

    monkeypatch.setattr(loop._State, "evaluate", evaluate)
    out = tmp_path / "run"
    lines = []
    with pytest.raises(KeyboardInterrupt):
        train(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=4, eval_steps=2, eval_ratio=0.25),
              log=lines.append, progress=False)
    assert "saving the final model before the last evaluation" in lines
    assert os.path.exists(out / "adapter_model.safetensors") and os.path.exists(out / "adapter_config.json")
    from roctune import rundir

    assert rundir.read_run(str(out))["data"]["total_steps"] == 4


def test_a_model_saved_before_the_last_evaluation_is_not_saved_twice(tiny_model_dir, alpaca_file, tmp_path,
                                                                     monkeypatch):
    from roctune.training import session

    saves = []
    real = session.save_final
    monkeypatch.setattr(session, "save_final", lambda *a: (saves.append(1), real(*a)))
    train(tiny_cfg(tiny_model_dir, alpaca_file, tmp_path / "run", max_steps=2, eval_ratio=0.25),
          log=lambda s: None, progress=False)
    assert len(saves) == 1 and os.path.exists(tmp_path / "run" / "loss.png")
