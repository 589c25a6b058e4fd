"""The model-family matrix: every family in roctune's table (roctune.families), on a tiny random model of its real
config shape (tests/family_models.py), through everything roctune does with a model:
- LoRA losses and gradients equal plain transformers + PEFT's on the same batch, with the shortcuts the family
  lists switched on (dropout 0, and dropout with the same masks replayed into peft);
- SFT LoRA, QLoRA, freeze, full and DPO steps train; merge keeps the logits; generate, chat and serve answer;
  the memory estimate's parameter count equals the model's; export writes GGUF where the writer knows the family
  (tests/test_export_families.py runs it in llama.cpp);
- a model outside the table trains on the plain path, says so, and its gradients equal PEFT's.
Each family's results are collected, and the README's support table must be their rendering
(`python scripts/family_table.py` writes it from a run of this file)."""
from __future__ import annotations

import io
import json
import os
import sys

import pytest
import torch

import family_models
from conftest import REPO, read_metrics, run_train, write_jsonl
from lora_dropout import record_masks, replay_into

FAMILIES = list(family_models.CONFIGS)
RESULTS: dict[str, dict] = {}  # family -> {"gradients": {...}, column: True/False}, read by the table test
COLUMNS = ("LoRA", "QLoRA", "freeze/full", "DPO", "merge", "export", "serve")
TABLE_START, TABLE_END = "<!-- family-table:start -->", "<!-- family-table:end -->"

SYSTEM = {"role": "system", "content": "You are Roc, a helpful assistant."}
CHATS = [
    [SYSTEM, {"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "I am Roc, made by roctune."},
     {"role": "user", "content": "Where do you run?"}, {"role": "assistant", "content": "On AMD and NVIDIA GPUs."}],
    [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "2 + 2 = 4."}],
    [SYSTEM, {"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好！我是 Roc。"}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}],
]
PAIRS = [{"prompt": "Who are you?", "chosen": "I am Roc.", "rejected": "I am nobody."},
         {"prompt": "What is 2 + 2?", "chosen": "4.", "rejected": "5."}]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("family-data")
    return {"sft": write_jsonl(folder / "sft.jsonl", [{"messages": c} for c in CHATS]),
            "dpo": write_jsonl(folder / "dpo.jsonl", PAIRS)}


def test_every_family_of_the_table_has_a_tiny_model_and_only_those():
    from roctune.families import TEXT_FAMILIES as TABLE  # the vision rows: tests/test_vision.py

    assert FAMILIES == [f.name for f in TABLE]
    assert not set(family_models.OUTSIDE) & {t for f in TABLE for t in f.model_types}


# ------------------------------------------------------------------------------ gradients against plain PEFT
def _batch(model_dir: str, data_file: str):
    from roctune.data.records import load_records
    from roctune.data.render import tokenize_records
    from roctune.models import load_tokenizer
    from roctune.training.batching import collate

    tok = load_tokenizer(model_dir)
    items, dropped = tokenize_records(tok, load_records([data_file]), 256)
    assert not dropped and len(items) == len(CHATS)
    return collate(items, tok.pad_token_id, False, "cpu")


def _roctune_model(model_dir: str, data_file: str, dropout: float, tmp_path, lines: list):
    """The model as `roctune train` builds it (methods.check, session.choose, session.build_trainable)."""
    from roctune import methods
    from roctune.config import TrainConfig
    from roctune.training import session

    cfg = TrainConfig(data=[data_file], output=str(tmp_path / "unused"), model=model_dir, lora_r=4, lora_alpha=8,
                      lora_dropout=dropout, device="cpu", seed=0).validate()
    methods.check(cfg, model_dir)
    setup = session.choose(cfg, model_dir)
    model, plan = session.build_trainable(cfg, setup, model_dir, lines.append)
    return cfg, setup, model, plan


def _plain_peft(model_dir: str, cfg, attn: str, like):
    """transformers + PEFT as their own docs do it, with `like`'s LoRA weights (so both start equal)."""
    from peft import get_peft_model

    from roctune.methods import lora_config
    from roctune.models import load_model

    model = get_peft_model(load_model(model_dir, "fp32", "cpu", attn), lora_config(cfg))
    mine = dict(like.named_parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(mine[name])
    return model


def _randomize_lora_b(*models, seed: int = 3):
    """lora_B random (it starts at zero), the same in every model: lora_A's gradients and the adapter's effect on
    the forward pass then count too."""
    for model in models:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in sorted(model.named_parameters()):
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def _loss_grads(model, fn):
    model.zero_grad(set_to_none=True)
    loss = fn(model)
    loss.backward()
    return float(loss.detach()), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _worst(a: dict, b: dict) -> float:
    """Largest relative difference of two gradient sets: max |a - b| / max |b| over each tensor."""
    assert a.keys() == b.keys() and a
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30)) for k in a)


def _compare(model_dir, data_file, tmp_path, dropout: float, random_b: bool, monkeypatch):
    """(roctune's plan, |loss difference|, worst relative gradient difference, lines said) for one batch."""
    from roctune.training.losses import token_loss_sum

    drawn = record_masks(monkeypatch)
    batch = _batch(model_dir, data_file)
    n = int((batch.labels[:, 1:] != -100).sum())
    lines: list[str] = []
    cfg, setup, mine, plan = _roctune_model(model_dir, data_file, dropout, tmp_path, lines)
    plain = _plain_peft(model_dir, cfg, setup.attn, mine)
    if random_b:
        _randomize_lora_b(mine, plain)
    mine.train(), plain.train()
    torch.manual_seed(11)
    loss_a, grads_a = _loss_grads(mine, lambda m: token_loss_sum(m, batch, plan.head) / n)
    if dropout:
        assert drawn, "roctune drew no dropout masks"
        replay = replay_into(plain, drawn)
    loss_b, grads_b = _loss_grads(plain, lambda m: m(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                                     labels=batch.labels).loss)
    if dropout:
        assert not replay, "peft used fewer dropout masks than roctune drew"
    return plan, abs(loss_a - loss_b), _worst(grads_a, grads_b), lines, mine


def _expected_shortcuts(family, model) -> set:
    on = set(family.shortcuts)
    if not any(type(m).__name__ in family.mlp_classes for m in model.modules()):
        on.discard("gated_mlp")  # an MoE without dense layers has no MLP of the kind the saver knows
    return on


def _applied(model) -> set:
    """The shortcuts visibly in place in `model` (not just planned)."""
    from roctune.training import activations

    got = set()
    if any(type(m).__name__ == "DroppedInputLinear" for m in model.modules()):
        got.add("lora_dropout")
    gated = (activations._gated_mlp_forward, activations._fused_gated_mlp_forward)
    if any(type(m).__dict__.get("forward") in gated for m in model.modules()):  # set as a class (with_forward)
        got.add("gated_mlp")
    return got


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_losses_and_gradients_equal_plain_peft(family, family_dir, data, tmp_path, monkeypatch):
    from roctune.families import family_of

    spec = family_of(_model_type(family_dir(family)))
    figures = {}
    for label, dropout, random_b in (("first step", 0.0, False), ("dropout 0", 0.0, True),
                                     ("dropout 0.1, same masks", 0.1, True)):
        plan, dloss, worst, lines, model = _compare(family_dir(family), data["sft"], tmp_path, dropout, random_b,
                                                    monkeypatch)
        assert plan.family is spec and plan.on == _expected_shortcuts(spec, model), plan
        assert _applied(model) == plan.on & ({"lora_dropout"} if dropout else set()) | (plan.on & {"gated_mlp"})
        assert any(line.startswith(f"model family {family}: shortcuts ") for line in lines), lines
        assert (plan.head is not None) == ("supervised_head" in plan.on)
        assert dloss < 2e-5, (label, dloss)
        assert worst < 2e-5, (label, worst)
        figures[label] = worst
    RESULTS.setdefault(family, {})["gradients"] = figures
    RESULTS[family]["shortcuts"] = sorted(plan.on)


def _model_type(model_dir: str) -> str:
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        return json.load(f)["model_type"]


def test_a_family_outside_the_table_trains_on_the_plain_path_with_peft_gradients(family_dir, data, tmp_path,
                                                                                 monkeypatch):
    folder = family_dir("olmo2")
    for dropout, random_b in ((0.0, False), (0.0, True)):
        plan, dloss, worst, lines, model = _compare(folder, data["sft"], tmp_path, dropout, random_b, monkeypatch)
        assert plan.family is None and not plan.on and plan.head is None
        assert any("plain transformers + PEFT path" in line and "'olmo2' is not in roctune's family table" in line
                   for line in lines), lines
        assert not _applied(model)
        assert dloss < 1e-6 and worst < 1e-6, (dloss, worst)  # the same computation: equal up to rounding


def test_a_repository_class_with_a_known_model_type_takes_the_plain_path(family_dir):
    """A model whose model_type is in the table but whose class is not transformers' own (a repository's code)."""
    from transformers import AutoModelForCausalLM

    from roctune.training.shortcuts import plan

    model = AutoModelForCausalLM.from_pretrained(family_dir("llama"))
    impostor = type("LlamaForCausalLM", (type(model),), {"__module__": "some_repo.modeling"})
    model.__class__ = impostor
    got = plan(model)
    assert not got.on and got.head is None and "not transformers' LlamaForCausalLM" in got.describe()


# ------------------------------------------------------------------------------------------ end to end
def _train(model_dir, data_file, out, **kw):
    from roctune.config import TrainConfig

    cfg = TrainConfig(data=[data_file], output=str(out), model=model_dir, max_steps=kw.pop("max_steps", 1),
                      batch_size=2, grad_accum=1, max_length=256, lora_r=4, lora_alpha=8, lr=1e-3, device="cpu",
                      seed=1, **kw)
    cfg.validate()
    summary, lines = run_train(cfg)
    rows = [r for r in read_metrics(out) if "loss" in r]
    assert rows and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows), rows
    return summary, lines


def _outcome(results: dict, column: str, fn):
    """Run one column's check; record True, or False and re-raise."""
    try:
        value = fn()
    except Exception:
        results[column] = False
        raise
    results[column] = True
    return value


@pytest.mark.parametrize("family", FAMILIES)
def test_family_trains_merges_answers_and_is_estimated(family, family_dir, data, tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    from roctune.memory.architecture import Architecture

    folder = family_dir(family)
    results = RESULTS.setdefault(family, {})
    lora = tmp_path / "lora"
    _outcome(results, "LoRA", lambda: _train(folder, data["sft"], lora, max_steps=2))
    _outcome(results, "QLoRA", lambda: _train(folder, data["sft"], tmp_path / "qlora", method="qlora"))
    _outcome(results, "freeze/full", lambda: (_train(folder, data["sft"], tmp_path / "freeze", method="freeze",
                                                     freeze_trainable_layers=1),
                                              _train(folder, data["sft"], tmp_path / "full", method="full")))
    _outcome(results, "DPO", lambda: _train(folder, data["dpo"], tmp_path / "dpo", stage="dpo"))
    _outcome(results, "merge", lambda: _merge(lora, tmp_path / "merged"))
    _outcome(results, "serve", lambda: (_generate(lora), _chat(lora, capsys, monkeypatch), _serve(folder, lora)))
    results["export"] = _exports(lora, tmp_path / "gguf")
    base = AutoModelForCausalLM.from_pretrained(folder)
    assert Architecture.from_config(folder).total_params == sum(p.numel() for p in base.parameters())


def _merge(run, out):
    from roctune.merge import merge

    report = merge(str(run), str(out), log=lambda *_: None)
    assert report["max_logit_diff"] < 1e-3


def _generate(run):
    from roctune.generate import generate, load_for_inference
    from roctune.models import stop_token_ids

    loaded = load_for_inference(adapter=str(run), device="cpu")
    answers = generate(loaded, [[{"role": "user", "content": "Who are you?"}]] * 2, max_new_tokens=4)
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)
    stops = stop_token_ids(loaded.model, loaded.tokenizer)
    family = _family(loaded.model)
    vocab = loaded.tokenizer.get_vocab()
    assert {vocab[t] for t in family.end_of_turn if t in vocab} <= set(stops)
    return answers


def _family(model):
    from roctune.families import family_of

    return family_of(model.config)


def _chat(run, capsys, monkeypatch):
    from roctune.cli import main

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("Who are you?\n/quit\n".encode()), "utf-8"))
    capsys.readouterr()
    assert main(["chat", "--adapter", str(run), "--device", "cpu", "--max-new-tokens", "3"]) == 0
    assert "you> Who are you?\nassistant> " in capsys.readouterr().out


def _serve(model_dir, run):
    import httpx

    from roctune.serve import ServerThread, Settings, build_engine, create_app

    engine = build_engine(model_dir, [("tuned", str(run))], device="cpu", max_batch=2)
    engine.start()
    try:
        with ServerThread(create_app(engine, Settings())) as url:
            r = httpx.post(url + "/v1/chat/completions", timeout=300, json={
                "model": "tuned", "max_tokens": 4, "temperature": 0,
                "messages": [SYSTEM, {"role": "user", "content": "Who are you?"}]})
    finally:
        engine.stop()
    assert r.status_code == 200, r.text
    assert isinstance(r.json()["choices"][0]["message"]["content"], str)


def _exports(run, out) -> bool:
    """True when `roctune export` merges the LoRA run and writes a GGUF of the family, False when it refuses it (one
    line). The file's check in llama.cpp, per family at q8_0 and q4_k_m, is tests/test_export_families.py's."""
    from roctune.errors import ConfigError
    from roctune.export import export

    try:
        export(str(run), str(out), quant="q8_0", verify=False, log=lambda *_: None)
    except ConfigError as e:
        assert "roctune export writes GGUF for" in str(e) or "not supported by roctune export" in str(e), e
        return False
    return True


# ------------------------------------------------------------------------------------- the README's table
def render_table(results: dict) -> str:
    from roctune.families import TEXT_FAMILIES as TABLE

    mark = {True: "yes", False: "no"}
    head = "| family | models | " + " | ".join(COLUMNS) + " | shortcuts proven |"
    rows = [head, "| " + " | ".join(["---"] * (len(COLUMNS) + 3)) + " |"]
    for f in TABLE:
        r = results[f.name]
        rows.append(f"| {f.name} | {f.title} | " + " | ".join(mark[r[c]] for c in COLUMNS) + " | "
                    + ", ".join(r["shortcuts"]) + " |")
    return "\n".join(rows)


def test_readme_support_table_is_the_matrix_results():
    """Runs last in this file: the README's table must be what the tests above found."""
    missing = [f for f in FAMILIES if (set(COLUMNS) | {"shortcuts"}) - set(RESULTS.get(f, {}))]
    if len(missing) == len(FAMILIES):
        pytest.skip("no family of the matrix ran in this session (selected out)")
    assert not missing, f"families whose matrix tests did not run to the end: {missing}"
    table = render_table(RESULTS)
    with open(os.path.join(REPO, ".cache", "family_results.json"), "w", encoding="utf-8") as f:
        json.dump(RESULTS, f, indent=1)
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    start, end = readme.index(TABLE_START) + len(TABLE_START), readme.index(TABLE_END)
    assert readme[start:end].strip() == table, ("the README's family table is not what the matrix found; "
                                                "run `python scripts/family_table.py` to write it:\n" + table)
