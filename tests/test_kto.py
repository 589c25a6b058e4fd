"""--stage kto: unpaired answers marked desirable/undesirable (label, kto_tag, LLaMA-Factory's column mapping), bad
rows refused in one line before the model loads, the KTO loss and gradients against TRL's KTOTrainer on fixed
inputs, the mismatched pairs of the KL estimate, and training on a tiny model that checkpoints and resumes exactly."""
import functools
import json
import os
import types
from collections import defaultdict

import pytest

from conftest import cpu_train_cfg, resume_after_a_kill
from conftest import read_metrics as metrics
from conftest import run_train as run
from conftest import write_jsonl
from roctune.cli import main
from roctune.config import TrainConfig
from roctune.errors import ConfigError, DataError
from roctune.training import kto_loss as kl

ROWS = [
    {"prompt": "Name a fruit.", "completion": "A pear.", "label": True},
    {"prompt": "Name a fruit.", "completion": "I refuse to answer.", "label": False},
    {"prompt": "What colour is the sky?", "completion": "Blue.", "label": True},
    {"prompt": "Say hello.", "completion": "Go away.", "label": False},
    {"prompt": "Count to three.", "completion": "One, two, three.", "label": True},
    {"prompt": "Say hello.", "completion": "Hello!", "label": True},
]


make_cfg = functools.partial(cpu_train_cfg, stage="kto", max_steps=4, batch_size=3, beta=0.1,
                             target_modules=["all-linear"])


# ---------------------------------------------------------------------------------------------- reading
def test_every_layout_and_both_mark_names(tmp_path):
    from roctune.data.kto import load_examples

    rows = [
        {"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"}], "label": True},
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"},
                           {"from": "human", "value": "Q2"}, {"from": "gpt", "value": "A2"}], "kto_tag": False},
        {"instruction": "Q3", "input": "ctx", "output": "A3", "label": "false"},
        {"prompt": "Q4", "completion": "A4", "label": 1, "system": "Be kind."},
    ]
    ex = load_examples(write_jsonl(tmp_path / "k.jsonl", rows))
    assert [(e.answer, e.desirable) for e in ex] == [("A1", True), ("A2", False), ("A3", False), ("A4", True)]
    assert ex[1].prompt[-1] == {"role": "user", "content": "Q2"} and len(ex[1].prompt) == 3
    assert ex[2].prompt == [{"role": "user", "content": "Q3\n\nctx"}]
    assert ex[3].prompt[0] == {"role": "system", "content": "Be kind."}

    # LLaMA-Factory: a sharegpt dataset whose dataset_info.json maps kto_tag to a column of another name
    d = tmp_path / "lf"
    d.mkdir()
    write_jsonl(d / "kto_en.jsonl", [{"messages": rows[1]["conversations"], "thumbs": True}])
    (d / "dataset_info.json").write_text(json.dumps({"kto_en": {
        "file_name": "kto_en.jsonl", "formatting": "sharegpt",
        "columns": {"messages": "messages", "kto_tag": "thumbs"}}}))
    lf = load_examples(f"{d}:kto_en")
    assert lf[0].prompt == ex[1].prompt and lf[0].answer == "A2" and lf[0].desirable is True


@pytest.mark.parametrize("row, needles", [
    ({"prompt": "Q", "completion": "A"}, ["k.jsonl:2", "missing field 'label'", "completion, prompt",
                                          "\"label\": true (desirable) or false (undesirable)"]),
    ({"prompt": "Q", "completion": "A", "label": "maybe"}, ["k.jsonl:2", "field 'label' is 'maybe'",
                                                            "write true (desirable) or false"]),
    ({"prompt": "Q", "chosen": "A", "rejected": "B"}, ["k.jsonl:2", "preference pair", "--stage dpo"]),
    ({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
                   {"role": "user", "content": "Q2"}], "label": True},
     ["k.jsonl:2", "messages", "must end with an assistant turn"]),
])
def test_bad_rows_are_one_line_naming_file_line_field_and_fix(tiny_model_dir, tmp_path, capsys, row, needles):
    data = write_jsonl(tmp_path / "k.jsonl", [ROWS[0], row])
    out = tmp_path / "run"
    code = main(["train", "--stage", "kto", "--device", "cpu", "--data", data, "--output", str(out),
                 "--model", tiny_model_dir])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("roctune train: error:"), err
    for n in needles:
        assert n in err[0], err[0]
    assert not out.exists()


def test_mismatched_pairs_take_another_prompts_answer(tokenizer):
    from roctune.data.kto import mismatched, tokenize_examples

    tok, dropped = tokenize_examples(tokenizer, [_example(r, i) for i, r in enumerate(ROWS)], 64)
    assert dropped == 0
    kl_seqs = mismatched([t for t, _ in tok], 64)
    answer = lambda t: tokenizer.decode([i for i, lab in zip(t.input_ids, t.labels) if lab != -100])  # noqa: E731
    prompt = lambda t: t.input_ids[:next(k for k, lab in enumerate(t.labels) if lab != -100)]  # noqa: E731
    # row 0 takes the last row's answer (TRL's rotation), row 1 skips row 0 (same question) and wraps to row 5's
    # answer, row 2 takes row 1's; every KL sequence keeps its own prompt
    assert [answer(k) for k in kl_seqs[:3]] == [answer(tok[5][0]), answer(tok[5][0]), answer(tok[1][0])]
    assert all(prompt(k) == prompt(t) for k, (t, _) in zip(kl_seqs, tok))


def _example(row, i):
    from roctune.data.kto import to_example
    from roctune.data.sources import Source

    return to_example(row, f"row {i}", Source("x.jsonl"))


# ------------------------------------------------------------------------------------------- loss vs TRL
B, T = 6, 9  # examples, tokens per sequence (1 prompt token + answer + padding)


def _trl_kto_loss(per_token, kl_per_token, mask, kl_mask, desirable, ref, ref_kl, s: kl.KTOSettings):
    """TRL's KTOTrainer._compute_loss on a stand-in trainer whose model's fused head returns `per_token` for the
    examples and `kl_per_token` for their mismatched (KL) sequences."""
    import torch
    from trl import KTOTrainer

    acc = types.SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda t: t)
    trainer = types.SimpleNamespace(
        model=types.SimpleNamespace(training=True), accelerator=acc, aux_loss_enabled=False, calculate_KL=True,
        precompute_ref_logps=True, loss_type="kto", beta=s.beta, desirable_weight=s.desirable_weight,
        undesirable_weight=s.undesirable_weight, _tp_size=1, _total_train_tokens=0,
        _metrics=defaultdict(lambda: defaultdict(list)))
    trainer._compute_kl_logps = types.MethodType(KTOTrainer._compute_kl_logps, trainer)
    zeros = torch.zeros(mask[:, 1:].shape)

    def model(input_ids, **kw):  # the KL sequences' ids are 2s, the examples' 1s
        lp = kl_per_token * kl_mask[:, 1:] if bool((input_ids == 2).all()) else per_token * mask[:, 1:]
        return types.SimpleNamespace(log_probs=lp, entropy=zeros, mean_logits=zeros)

    inputs = {"input_ids": torch.ones_like(mask), "attention_mask": torch.ones_like(mask), "completion_mask": mask,
              "KL_input_ids": torch.full_like(kl_mask, 2), "KL_attention_mask": torch.ones_like(kl_mask),
              "KL_completion_mask": kl_mask, "label": desirable, "ref_logps": ref, "ref_KL_logps": ref_kl}
    return KTOTrainer._compute_loss(trainer, model, inputs, False)


def _masks(g):
    import torch

    lens = torch.randint(2, T, (B,), generator=g)
    pos = torch.arange(T)[None]
    return ((pos >= 1) & (pos <= lens[:, None])).long()


@pytest.mark.parametrize("s, kl_shift", [(kl.KTOSettings(), 1.0), (kl.KTOSettings(beta=0.5), -1.0),
                                         (kl.KTOSettings(beta=0.3, desirable_weight=1.33, undesirable_weight=0.7),
                                          1.0)],
                         ids=["kl-positive", "kl-clamped-to-0", "weights"])
def test_kto_loss_and_gradients_equal_trl(s, kl_shift):
    import torch

    pytest.importorskip("trl", reason="TRL is in the test extra")
    g = torch.Generator().manual_seed(5)
    mask, kl_mask = _masks(g), _masks(g)
    base = -torch.rand(B, T - 1, generator=g) * 3  # the policy's per-token log-probs
    kl_base = -torch.rand(B, T - 1, generator=g) * 3
    ref = -torch.rand(B, generator=g) * 3 * mask.sum(1)
    kl_sums = (kl_base * kl_mask[:, 1:]).sum(1)
    ref_kl = kl_sums - kl_shift * (1 + torch.rand(B, generator=g))  # the policy above (or below) its reference
    desirable = torch.tensor([True, False, True, True, False, False])
    mine, theirs = base.clone().requires_grad_(), base.clone().requires_grad_()
    z = kl.kl_estimate(kl_sums, ref_kl)
    assert (float(z) > 0) == (kl_shift > 0)
    ours = kl.kto_losses((mine * mask[:, 1:]).sum(1), ref, desirable, z, s)[0].mean()
    trl = _trl_kto_loss(theirs, kl_base, mask, kl_mask, desirable, ref, ref_kl, s)
    ours.backward(), trl.backward()
    assert abs(float(ours) - float(trl)) < 1e-5 and float(trl) != 0.0, (float(ours), float(trl))
    assert float((mine.grad - theirs.grad).abs().max()) < 1e-5
    assert float(theirs.grad.abs().max()) > 0  # the inputs do reach the loss
    if kl_shift > 0:  # the reference point does move the loss
        without = kl.kto_losses((base * mask[:, 1:]).sum(1), ref, desirable, torch.tensor(0.0), s)[0].mean()
        assert abs(float(without) - float(ours)) > 1e-4


# ----------------------------------------------------------------------------------------- settings, web UI
@pytest.mark.parametrize("kw, says", [
    (dict(stage="dpo", desirable_weight=1.3), "--desirable-weight weighs the loss of --stage kto; drop it for "
                                              "--stage dpo"),
    (dict(undesirable_weight=0.0), "--undesirable-weight must be > 0"),
    (dict(pref_loss="ipo"), "--pref-loss sets the preference loss of --stage dpo; drop it for --stage kto"),
])
def test_settings_are_checked_in_one_line(kw, says):
    cfg = TrainConfig(**{**dict(data=["d.jsonl"], output="out", stage="kto"), **kw})
    with pytest.raises(ConfigError) as e:
        cfg.validate()
    assert says in str(e.value) and "\n" not in str(e.value)


def test_llama_factory_names():
    from roctune import config

    cfg = config.from_sources(flags={"data": ["d.jsonl"], "output": "o", "stage": "kto"},
                              overrides=["pref_beta=0.2", "kto_chosen_weight=1.2", "kto_rejected_weight=0.8"])
    assert (cfg.beta, cfg.desirable_weight, cfg.undesirable_weight) == (0.2, 1.2, 0.8)
    cfg.validate()


def test_compile_auto_treats_kto_as_a_full_sequence_recipe():
    """kto's step runs a forward without gradients (the KL pairs) and one with: --compile on gave eager's losses
    on the CPU (3 steps, tiny llama), so auto compiles it on a GPU like dpo."""
    from roctune.training.compiled import AUTO_MIN_STEPS, choose_compile

    assert choose_compile("auto", "cuda", AUTO_MIN_STEPS, "kto").value


def test_web_ui_form_offers_kto_with_its_labels():
    from roctune.webui.train_form import form_specs

    spec = {s["name"]: s for s in form_specs()}
    assert "kto" in spec["stage"]["choices"]
    assert "kto (single answers" in spec["stage"]["help"] and "kto（单个回答" in spec["stage"]["help_zh"]
    assert spec["desirable_weight"]["group"] == spec["beta"]["group"] and spec["desirable_weight"]["label_zh"]


# ------------------------------------------------------------------------------------------------ training
def test_kto_trains_checkpoints_and_resumes_exactly(tiny_model_dir, tmp_path):
    """4 steps (with eval); --save-steps 2 then --resume: the same losses and adapter as one uninterrupted run."""
    import math

    from safetensors.torch import load_file

    data = write_jsonl(tmp_path / "k.jsonl", ROWS)
    held = write_jsonl(tmp_path / "held.jsonl", ROWS[:2])
    kw = dict(lora_dropout=0.1, eval_data=[held], eval_steps=2)  # dropout: the RNG state is resumed too
    straight = tmp_path / "straight"
    summary, lines = run(make_cfg(data, straight, tiny_model_dir, **kw))
    rows = [r for r in metrics(straight) if "loss" in r]
    assert len(rows) == 4 and all(math.isfinite(r["loss"]) and r["kl"] >= 0 for r in rows)
    assert any("reward_margin" in r for r in rows)
    assert any("eval_reward_margin" in r and "eval_kl" in r for r in metrics(straight))
    assert any("kto: scoring" in line for line in lines) and "kto: 4 desirable and 2 undesirable" in "\n".join(lines)
    assert "stage: kto" in (straight / "run.yaml").read_text()
    out = tmp_path / "resumed"
    resume_after_a_kill(lambda output, **more: make_cfg(data, output, tiny_model_dir, **kw, **more), straight, out)
    a, b = load_file(str(out / "adapter_model.safetensors")), load_file(str(straight / "adapter_model.safetensors"))
    assert sorted(a) == sorted(b) and all(float((a[k] - b[k]).abs().max()) <= 1e-6 for k in a)
    with pytest.raises(ConfigError, match="--undesirable-weight"):  # another loss is another run
        run(make_cfg(data, out, tiny_model_dir, save_steps=2, resume=True, max_steps=6, undesirable_weight=2.0,
                     **kw))


@pytest.mark.parametrize("method", ["full", "freeze"])
def test_kto_trains_the_whole_model_without_a_second_copy(tiny_model_dir, tmp_path, method):
    data = write_jsonl(tmp_path / "k.jsonl", ROWS)
    out = tmp_path / method
    run(make_cfg(data, out, tiny_model_dir, method=method, max_steps=2, lr=1e-4))
    rows = [r for r in metrics(out) if "loss" in r]
    assert len(rows) == 2 and rows[0]["loss"] != rows[1]["loss"]


def test_one_example_is_refused_before_the_model_loads(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "k.jsonl", ROWS[:1])
    with pytest.raises(DataError, match="needs at least 2 training examples"):
        run(make_cfg(data, tmp_path / "run", tiny_model_dir))


@pytest.mark.slow
def test_two_processes_follow_the_one_process_losses(tiny_model_dir, tmp_path):
    """--nproc 2 (DDP, gloo): each process's micro-batches, KL estimates included, are those of one process with
    twice the accumulation, so the losses agree."""
    import subprocess
    import sys

    data = write_jsonl(tmp_path / "k.jsonl", ROWS + ROWS[::-1])
    common = ["--model", tiny_model_dir, "--data", data, "--stage", "kto", "--max-steps", "3", "--lr", "1e-2",
              "--lora-dropout", "0", "--device", "cpu", "--batch-size", "2", "--target-modules", "all-linear"]
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-m", "roctune", "train", *common, "--output", str(tmp_path / "two"),
                        "--nproc", "2", "--grad-accum", "1"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, PYTHONPATH=repo, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    from roctune.cli import build_parser
    from roctune.commands.train import config_from_args

    run(config_from_args(build_parser().parse_args(["train", *common, "--output", str(tmp_path / "one"),
                                                    "--grad-accum", "2"])))
    two, one = ([r["loss"] for r in metrics(tmp_path / d) if "loss" in r] for d in ("two", "one"))
    assert len(two) == len(one) == 3 and len(set(one)) == 3
    assert two == pytest.approx(one, rel=1e-4)
