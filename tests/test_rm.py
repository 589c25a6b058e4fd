"""--stage rm (reward model): the Bradley-Terry loss and its gradients against TRL's RewardTrainer.compute_loss on the
same inputs and model, training end to end on a tiny model (lora and full), exact resume, the run's held-out pairwise
accuracy through `roctune eval`, its use as GRPO's reward (`--reward-model RUN`), and bad input refused in one line
before any model loads."""
import copy
import functools
import json
import os
import shutil
import types
from collections import defaultdict

import pytest

from conftest import cpu_train_cfg, resume_after_a_kill
from conftest import read_metrics as metrics
from conftest import run_train as run
from conftest import write_jsonl
from roctune.cli import main
from roctune.config import TrainConfig
from roctune.errors import ConfigError


def pair_rows(n: int = 12, margin: bool = False) -> list[dict]:
    rows = [{"prompt": f"What is {i} plus one?", "chosen": f"It is {i + 1}.", "rejected": "No."} for i in range(n)]
    if margin:
        for i, r in enumerate(rows):
            r["margin"] = 0.25 * (i % 3)
    return rows


make_cfg = functools.partial(cpu_train_cfg, stage="rm", max_steps=4, batch_size=4, lr=1e-2)


# ------------------------------------------------------------------------------------------- TRL's loss
def _tiny_classifier(tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    return LlamaForSequenceClassification(cfg)


def _trl_loss(model, input_ids, lengths, margin):
    """TRL's RewardTrainer.compute_loss, on a stand-in trainer (its own method, bound to plain attributes)."""
    import torch
    from trl import RewardTrainer

    acc = types.SimpleNamespace(gather=lambda t: t, gather_for_metrics=lambda t: t)
    trainer = types.SimpleNamespace(model=types.SimpleNamespace(training=True), accelerator=acc,
                                    args=types.SimpleNamespace(center_rewards_coefficient=None), _tp_size=1,
                                    _total_train_tokens=0, _metrics=defaultdict(lambda: defaultdict(list)))
    # TRL's collator: ones over each sequence's own tokens (EOS is the pad token here: it occurs inside them too)
    mask = (torch.arange(input_ids.shape[1])[None] < torch.tensor(lengths)[:, None]).long()
    inputs = {"input_ids": input_ids, "attention_mask": mask}
    if margin is not None:
        inputs["margin"] = margin
    return RewardTrainer.compute_loss(trainer, model, inputs), trainer._metrics["train"]["accuracy"][0]


@pytest.mark.parametrize("with_margin", [False, True])
def test_loss_and_gradients_equal_trl(tokenizer, with_margin):
    """Ours (rm.pair_scores + rm.pair_losses, the loop's mean over pairs) vs TRL on the same padded batch (chosen rows
    then rejected rows, answers of different lengths) and a copy of the same model: loss and every gradient."""
    pytest.importorskip("trl", reason="TRL is in the test extra")
    import torch

    from roctune.data.preference import to_pair
    from roctune.recipes import rm
    from roctune.training.batching import collate

    rows = [dict(r, chosen=r["chosen"] + " Indeed" * i) for i, r in enumerate(pair_rows(4, margin=with_margin))]
    items, _ = rm.tokenize_items(tokenizer, [to_pair(r, f"row {i}") for i, r in enumerate(rows)], 64)
    mine = _tiny_classifier(tokenizer)
    theirs = copy.deepcopy(mine)
    ch, rj = rm.pair_scores(mine, items, tokenizer.pad_token_id, "cpu")
    margin = torch.tensor([x.margin for x in items]) if with_margin else None
    ours = rm.pair_losses(ch, rj, margin).sum() / len(items)
    rows = [x.chosen for x in items] + [x.rejected for x in items]
    ids = collate(rows, tokenizer.pad_token_id, False, "cpu")
    trl, trl_acc = _trl_loss(theirs, ids.input_ids, [len(x.input_ids) for x in rows], margin)
    ours.backward()
    trl.backward()
    ours, trl = ours.detach(), trl.detach()
    assert abs(float(ours) - float(trl)) < 1e-5 and float(trl) > 0, (float(ours), float(trl))
    assert trl_acc == pytest.approx(float((ch > rj).float().mean()))
    if with_margin:  # the margin changes the loss: the test would see a dropped margin
        assert abs(float(rm.pair_losses(ch, rj).mean()) - float(ours)) > 1e-4
    for (name, a), b in zip(mine.named_parameters(), theirs.parameters()):
        assert a.grad is not None and torch.allclose(a.grad, b.grad, atol=1e-5), name
    assert float(mine.score.weight.grad.abs().sum()) > 0


# ------------------------------------------------------------------------------------------- training
@pytest.mark.parametrize("method", ["lora", "full"])
def test_rm_run_learns_the_pairs_and_eval_reports_accuracy(tiny_model_dir, tmp_path, capsys, method):
    from safetensors import safe_open

    from roctune import rundir

    data = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(12))
    held = write_jsonl(tmp_path / "held.jsonl", pair_rows(16)[12:])
    out = tmp_path / "run"
    summary, lines = run(make_cfg(data, out, tiny_model_dir, method=method, max_steps=6,
                                  lr=1e-2 if method == "lora" else 1e-3, eval_data=[held], eval_steps=6))
    assert summary["steps"] == 6
    assert rundir.read_run(str(out))["config"]["stage"] == "rm"
    rows = metrics(out)
    assert {"rewards_chosen", "rewards_rejected", "accuracy", "reward_margin"} <= set(rows[0])
    assert rows[-1]["loss"] < rows[0]["loss"]
    if method == "lora":  # the head is saved with the adapter, in safetensors
        with safe_open(str(out / rundir.ADAPTER_WEIGHTS), "pt") as f:
            assert any(k.endswith("score.weight") for k in f.keys())
    else:
        assert os.path.isfile(out / "model.safetensors") and not list(out.glob("*.bin"))
    assert main(["eval", "--adapter", str(out), "--data", held, "--json", "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n"] == 4 and result["accuracy"] == 1.0 and result["margin"] > 0
    logged = [r for r in rows if "eval_accuracy" in r][-1]
    assert result["accuracy"] == logged["eval_accuracy"]
    assert result["margin"] == pytest.approx(logged["eval_reward_margin"], abs=1e-3)
    # the answer-comparison report's options are refused in one line
    assert main(["eval", "--adapter", str(out), "--data", held, "--tasks", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--stage rm run" in err[0], err


def test_rm_resume_gives_the_uninterrupted_run(tiny_model_dir, tmp_path):
    """--save-steps 2 then --resume: the same losses and the same final head as one uninterrupted run."""
    from safetensors.torch import load_file

    data = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(16, margin=True))
    kw = dict(max_steps=4, lora_dropout=0.1, batch_size=2)
    straight, out = tmp_path / "straight", tmp_path / "resumed"
    run(make_cfg(data, straight, tiny_model_dir, **kw))
    resume_after_a_kill(lambda output, **more: make_cfg(data, output, tiny_model_dir, **kw, **more), straight, out)
    a, b = load_file(str(out / "adapter_model.safetensors")), load_file(str(straight / "adapter_model.safetensors"))
    head = next(k for k in a if k.endswith("score.weight"))
    assert (a[head] - b[head]).abs().max() < 1e-6


def test_rm_continues_an_sft_adapter_with_a_trainable_head(tiny_model_dir, tmp_path):
    """--adapter SFT_RUN: the SFT run's LoRA weights are the start, and the new score head trains and is saved."""
    from safetensors.torch import load_file

    sft = write_jsonl(tmp_path / "sft.jsonl", [{"instruction": f"Q{i}", "output": f"A{i}"} for i in range(4)])
    run(TrainConfig(data=[sft], output=str(tmp_path / "sft"), model=tiny_model_dir, max_steps=1, batch_size=2,
                    device="cpu", lr=1e-2))
    data = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(8))
    out = tmp_path / "rm"
    run(make_cfg(data, out, None, adapter=str(tmp_path / "sft"), max_steps=3))
    before, after = load_file(str(tmp_path / "sft" / "adapter_model.safetensors")), load_file(str(out / "adapter_model.safetensors"))
    assert any(k.endswith("score.weight") for k in after) and not any(k.endswith("score.weight") for k in before)
    lora = next(k for k in before if "lora_B" in k)
    assert float(before[lora].abs().sum()) > 0 and not (after[lora] == before[lora]).all()
    assert metrics(out)[-1]["loss"] < metrics(out)[0]["loss"]


# ------------------------------------------------------------------------------------------- as a reward
@pytest.fixture
def rm_run(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(8))
    out = tmp_path / "rm"
    run(make_cfg(data, out, tiny_model_dir, max_steps=2))
    return str(out)


def test_reward_model_scores_grpo_completions(tiny_model_dir, tmp_path, rm_run):
    from roctune.eval import reward_model, rewards

    cfg = TrainConfig(data=["x"], output="y", stage="grpo", reward_model=rm_run, device="cpu").validate()
    funcs = rewards.build(cfg, [])
    assert [f.name for f in funcs] == ["reward_model"]
    prompts = ["What is 3 plus one?", [{"role": "user", "content": "What is 3 plus one?"}]]
    completions = ["It is 4.", [{"role": "assistant", "content": "It is 4."}]]
    values = rewards.score(funcs, prompts, completions, [[1], [1]], {})[0]
    assert values[0] == pytest.approx(values[1], abs=1e-5)  # TRL's text and conversational formats agree
    rm = reward_model.load(rm_run, "cpu")
    direct = reward_model.score_conversations(rm, [[{"role": "user", "content": "What is 3 plus one?"},
                                                    {"role": "assistant", "content": "It is 4."}]])
    assert values[0] == pytest.approx(direct[0], abs=1e-5)
    # a GRPO step trains with it
    prompts_file = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"What is {i} plus one?"} for i in range(2)])
    out = tmp_path / "grpo"
    summary, _ = run(TrainConfig(data=[prompts_file], output=str(out), model=tiny_model_dir, stage="grpo",
                                 reward_model=rm_run, device="cpu", max_steps=1, batch_size=2, num_generations=2,
                                 max_completion_length=6))
    row = metrics(out)[0]
    assert summary["steps"] == 1 and "reward_reward_model" in row, row


# ------------------------------------------------------------------------------------------- bad input
def cli(args, capsys):
    code = main(["train", "--device", "cpu", *args])
    return code, capsys.readouterr().err.strip().splitlines()


def test_rm_needs_pairs_one_line_before_the_model_loads(tmp_path, capsys):
    data = write_jsonl(tmp_path / "sft.jsonl", [{"instruction": "Q", "output": "A"}])
    out = tmp_path / "run"
    code, err = cli(["--stage", "rm", "--data", data, "--output", str(out), "--model", str(tmp_path / "none")],
                    capsys)
    assert code == 2 and len(err) == 1, err
    assert "sft.jsonl:1" in err[0] and "'chosen'" in err[0] and "'rejected'" in err[0]
    assert not out.exists()


def test_bad_margin_is_one_line(tmp_path, capsys):
    data = write_jsonl(tmp_path / "pairs.jsonl", [dict(pair_rows(1)[0], margin="big")])
    code, err = cli(["--stage", "rm", "--data", data, "--output", str(tmp_path / "run")], capsys)
    assert code == 2 and len(err) == 1 and "pairs.jsonl:1" in err[0] and "'margin'" in err[0], err


def test_reward_model_must_be_an_rm_run(tmp_path, capsys, rm_run):
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Hi"}])
    other = tmp_path / "sft-run"
    shutil.copytree(rm_run, other)
    doc = (other / "run.yaml").read_text(encoding="utf-8").replace("stage: rm", "stage: sft")
    (other / "run.yaml").write_text(doc, encoding="utf-8")
    for bad, needle in ((tmp_path / "missing", "no such directory"), (tmp_path, "no run.yaml there"),
                        (other, "says --stage sft")):
        out = tmp_path / "out"
        code, err = cli(["--stage", "grpo", "--data", prompts, "--output", str(out), "--reward-model", str(bad)],
                        capsys)
        assert code == 2 and len(err) == 1 and f"--reward-model {bad}" in err[0] and needle in err[0], err
        assert not out.exists()
    with pytest.raises(ConfigError, match="--reward-model scores GRPO's completions"):
        TrainConfig(data=["x"], output="y", stage="sft", reward_model=rm_run).validate()
    assert main(["eval", "--adapter", rm_run, "--data", prompts, "--reward-model", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "says --stage sft" in err[0], err


def test_an_rm_run_does_not_answer(rm_run, tmp_path, capsys):
    """chat, generate, serve and the answer comparison of eval load runs to write answers: an rm run is refused."""
    from roctune.errors import RoctuneError
    from roctune.generate import load_for_inference

    with pytest.raises(RoctuneError, match=r"reward model \(--stage rm\) scores answers"):
        load_for_inference(rm_run, device="cpu")


def test_serve_and_train_adapter_refuse_an_rm_run_in_one_line(rm_run, tmp_path, capsys):
    """serve (its --adapter specs and the admin endpoint's load) and train --adapter take a run that writes text:
    an rm run is refused in one line naming it, before any model loads; an rm run does not start an SFT run."""
    from roctune.serve import parse_adapter_specs
    from roctune.serve.adapters import AdapterStack
    from roctune.serve.errors import ApiError

    with pytest.raises(ConfigError, match=r"--adapter 'rw=.*': a reward model \(--stage rm\) scores answers"):
        parse_adapter_specs([f"rw={rm_run}"])
    with pytest.raises(ApiError) as e:
        AdapterStack(None, "base", "base").load("rw", rm_run)
    assert e.value.status == 400 and "a reward model (--stage rm)" in e.value.message
    data = write_jsonl(tmp_path / "sft.jsonl", [{"instruction": "Q", "output": "A"}] * 4)
    out = tmp_path / "sft"
    code, err = cli(["--data", data, "--output", str(out), "--adapter", rm_run, "--max-steps", "1"], capsys)
    assert code == 2 and len(err) == 1 and f"--adapter {rm_run}: a reward model (--stage rm)" in err[0], err
    assert "roctune train --stage sft writes models that generate text" in err[0] and not out.exists()


@pytest.mark.parametrize("flag, value", [("--beta", "0.2"), ("--kl-beta", "0.1"), ("--num-generations", "4")])
def test_a_setting_rm_does_not_use_is_refused_naming_the_stages_that_do(tmp_path, capsys, flag, value):
    data = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(4))
    code, err = cli(["--stage", "rm", "--data", data, "--output", str(tmp_path / "run"), flag, value], capsys)
    users = {"--beta": "--stage dpo or kto"}.get(flag, "--stage grpo")
    assert code == 2 and len(err) == 1 and err[0].split(": error: ")[1].startswith(flag), err
    assert f"{users}; drop it for --stage rm" in err[0] and not (tmp_path / "run").exists()


def test_merge_and_export_refuse_an_rm_run_before_loading(rm_run, tmp_path, capsys, monkeypatch):
    """A reward model has a score head, not a language-model head: merge and export say so in one line, naming
    the run and what to use instead, before any model loads; nothing is written."""
    import roctune.generate
    import roctune.models
    from roctune.cli import main

    def no_load(*_, **__):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(roctune.generate, "load_for_inference", no_load)
    monkeypatch.setattr(roctune.models, "load_tokenizer", no_load)
    for argv in (["merge", "--adapter", rm_run, "--output", str(tmp_path / "merged")],
                 ["export", "--adapter", rm_run, "--output", str(tmp_path / "gguf")],
                 ["export", "--adapter", rm_run, "--format", "lora-gguf", "--output", str(tmp_path / "lora")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--adapter {rm_run}: a reward model (--stage rm)" in err[0], err
        assert f"roctune {argv[0]} writes models that generate text" in err[0]
        assert f"roctune eval --adapter {rm_run}" in err[0] and f"--reward-model {rm_run}" in err[0]
    assert not any((tmp_path / name).exists() for name in ("merged", "gguf", "lora"))


def test_web_ui_form_offers_rm_with_its_labels():
    from roctune.webui.train_form import form_specs

    specs = {s["name"]: s for s in form_specs()}
    assert "rm" in specs["stage"]["choices"]
    assert "rm (a reward model" in specs["stage"]["help"] and "rm（奖励模型" in specs["stage"]["help_zh"]
    assert "reward_model" in specs
