"""Training methods: QLoRA (4-bit base, bitsandbytes), freeze, full and the LoRA variants (DoRA, rsLoRA,
all-linear, modules_to_save); QLoRA merge; clear errors before anything is written."""
import json
import os
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import read_metrics as metrics
from conftest import run_train as run
from roctune import method_rows
from roctune.config import TrainConfig
from roctune.errors import ConfigError, EnvironmentProblem


def make_cfg(data, output, model, **kw) -> TrainConfig:
    base = dict(data=[data], output=str(output), model=model, device="cpu", max_steps=2, batch_size=2,
                grad_accum=1, max_length=64, lr=1e-3, lora_dropout=0.0)
    base.update(kw)
    return TrainConfig(**base)


def changed_keys(before: dict, after: dict) -> set[str]:
    assert set(after) <= set(before)
    return {k for k in after if not torch.equal(before[k], after[k])}


# ------------------------------------------------------------------------------------------ the method rows
# What each method trains on the tiny model, by parameter name (a new method adds its row here): LoRA's adapter
# matrices, chosen decoder layers, or everything.
TRAINS = {"lora": lambda n: "lora_" in n, "qlora": lambda n: "lora_" in n,
          "freeze": lambda n: n.startswith("model.layers.1."), "full": lambda n: True}


@pytest.mark.parametrize("row", method_rows.ROWS, ids=lambda r: r.name)
def test_each_method_row_builds_what_it_says(row, tiny_model_dir, alpaca_file, tmp_path):
    """Every row names a file whose check passes and whose build trains what the row says (an adapter on a frozen
    base, base weights, every parameter), as its test row expects; the settings offer it, the memory estimate
    counts it and its lighter methods exist."""
    from types import SimpleNamespace

    from roctune import methods
    from roctune.config import METHODS
    from roctune.memory import estimate

    cfg = make_cfg(alpaca_file, tmp_path / "o", tiny_model_dir, method=row.name, freeze_trainable_layers=1)
    methods.check(cfg.validate(), tiny_model_dir)
    setup = SimpleNamespace(dtype="fp32", device="cpu", attn="sdpa", turn_tokens={})
    model = methods.build_model(cfg, setup, tiny_model_dir, lambda *_: None)
    names = [n.removeprefix("base_model.model.") for n, p in model.named_parameters() if p.requires_grad]
    assert names and all(TRAINS[row.name](n) for n in names), names[:5]
    assert row.adapter == any("lora_" in n for n in names) and row.trains_base == any("lora_" not in n for n in names)
    assert row.trains_all == all(p.requires_grad for p in model.parameters())
    assert row.name in METHODS and set(row.lighter) <= set(method_rows.NAMES)
    assert estimate(tiny_model_dir, method=row.name, freeze_trainable_layers=1).trainable_params > 0


# ------------------------------------------------------------------------------------------ freeze/full
@pytest.mark.parametrize("layers, modules, expected_prefixes", [
    (1, ["all"], ["model.layers.1."]),  # the last layer
    (-1, ["all"], ["model.layers.0."]),  # the first layer
    (2, ["mlp"], ["model.layers.0.mlp.", "model.layers.1.mlp."]),  # only the MLPs of the last two
])
def test_freeze_trains_exactly_the_chosen_parameters(tiny_model_dir, alpaca_file, tmp_path, layers, modules,
                                                     expected_prefixes):
    out = tmp_path / "run"
    cfg = make_cfg(alpaca_file, out, tiny_model_dir, method="freeze", freeze_trainable_layers=layers,
                   freeze_trainable_modules=modules)
    run(cfg)
    before = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    expected = {k for k in before if any(k.startswith(p) for p in expected_prefixes)}
    assert expected and changed_keys(before, after) == expected
    assert not (out / "adapter_config.json").exists()
    # the run dir is a plain model: transformers and roctune's inference load it directly
    from roctune.generate import load_for_inference
    from roctune.rundir.run_yaml import method as run_method

    assert run_method(str(out)) == "freeze"
    loaded = load_for_inference(adapter=str(out), device="cpu")
    assert not hasattr(loaded.model, "peft_config")
    sd = loaded.model.state_dict()
    assert all(torch.equal(sd[k], after[k]) for k in after)


def test_full_trains_every_parameter(tiny_model_dir, alpaca_file, tmp_path):
    out = tmp_path / "run"
    summary, lines = run(make_cfg(alpaca_file, out, tiny_model_dir, method="full", lr=1e-4))
    before = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    assert set(after) == set(before)
    assert changed_keys(before, after) == set(before)
    assert any("trainable parameters" in line and "(100.000%)" in line for line in lines)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(out))  # loads with no roctune or PEFT
    from roctune.errors import RoctuneError
    from roctune.merge import merge

    with pytest.raises(RoctuneError, match="nothing to merge"):
        merge(str(out), str(tmp_path / "merged"), log=lambda *_: None)


def test_freeze_bad_layer_count_fails_before_writing(tiny_model_dir, alpaca_file, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="only 2 layers"):
        run(make_cfg(alpaca_file, out, tiny_model_dir, method="freeze", freeze_trainable_layers=5))
    with pytest.raises(ConfigError, match="freeze-trainable-modules: attn"):
        run(make_cfg(alpaca_file, out, tiny_model_dir, method="freeze", freeze_trainable_modules=["attn"]))
    assert not out.exists()


# ------------------------------------------------------------------------------------- LoRA variants
def test_dora_rslora_all_linear_modules_to_save_reach_adapter_config(tiny_model_dir, alpaca_file, tmp_path):
    from roctune.cli import build_parser
    from roctune.commands.train import config_from_args

    out = tmp_path / "run"
    args = build_parser().parse_args([
        "train", "--data", alpaca_file, "--output", str(out), "--model", tiny_model_dir, "--device", "cpu",
        "--lora-target", "all-linear", "--use-dora", "--use-rslora", "--modules-to-save", "norm",
        "--max-steps", "1", "--batch-size", "2", "--grad-accum", "1", "--max-length", "64"])
    cfg = config_from_args(args)
    assert cfg.target_modules == ["all-linear"] and cfg.use_dora and cfg.use_rslora
    run(cfg)
    with open(out / "adapter_config.json", encoding="utf-8") as f:
        ac = json.load(f)
    assert ac["use_dora"] is True and ac["use_rslora"] is True
    linear = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert {t.split(".")[-1] for t in ac["target_modules"]} == linear
    assert ac["modules_to_save"] == ["norm"]
    weights = load_file(str(out / "adapter_model.safetensors"))
    assert any("lora_magnitude_vector" in k for k in weights)  # DoRA's magnitudes were trained and saved
    assert any("model.norm" in k for k in weights)


def test_target_module_aliases():
    from roctune.cli import build_parser
    from roctune.commands.train import config_from_args
    from roctune.config import apply

    p = build_parser()
    a = config_from_args(p.parse_args(["train", "--target-modules", "all-linear"]))
    b = config_from_args(p.parse_args(["train", "--lora-target", "all-linear"]))
    assert a.target_modules == b.target_modules == ["all-linear"]
    assert apply(TrainConfig(), {"lora_target": "q_proj,v_proj"}, "x.yaml").target_modules == ["q_proj", "v_proj"]
    with pytest.raises(ConfigError, match=f"--method must be one of {', '.join(method_rows.NAMES)} \\(got 'dora'\\)"):
        TrainConfig(data=["d"], output="o", method="dora").validate()


def test_modules_to_save_unknown_name(tiny_model_dir, alpaca_file, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="modules-to-save: head"):
        run(make_cfg(alpaca_file, out, tiny_model_dir, modules_to_save=["head"]))
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ QLoRA
def test_qlora_without_bitsandbytes_fails_before_writing(tiny_model_dir, alpaca_file, tmp_path, monkeypatch):
    """A missing bitsandbytes (simulated: importing it fails) stops the run with what to install."""
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    monkeypatch.setitem(sys.modules, "bitsandbytes.functional", None)
    out = tmp_path / "run"
    with pytest.raises(EnvironmentProblem) as e:
        run(make_cfg(alpaca_file, out, tiny_model_dir, method="qlora"))
    msg = str(e.value)
    assert "bitsandbytes" in msg and "pip install" in msg and "--method lora" in msg and "\n" not in msg
    assert not out.exists()
    from roctune.cli import main

    assert main(["train", "--data", alpaca_file, "--output", str(out), "--model", tiny_model_dir,
                 "--device", "cpu", "--method", "qlora"]) == 1
    assert not out.exists()


def test_bitsandbytes_broken_build_message(monkeypatch):
    """A bitsandbytes without a working 4-bit kernel for this backend is reported, not crashed on."""
    import bitsandbytes.functional as bnbf

    from roctune.methods import bitsandbytes_problem

    def broken(*a, **k):
        raise RuntimeError("no native library for this backend\nmore detail")

    monkeypatch.setattr(bnbf, "quantize_4bit", broken)
    msg = bitsandbytes_problem("cpu")
    assert "no working 4-bit build for the CPU" in msg and "no native library" in msg and "--method lora" in msg


@pytest.mark.slow
def test_qlora_bundled_model_trains_reloads_and_merges(default_model_dir, tmp_path):
    """bitsandbytes 4-bit works on the CPU: a few QLoRA steps lower the loss, and the adapter merges into
    the dequantized (fp32) base with the same logits as the 4-bit model + adapter it was trained as."""
    from conftest import write_jsonl

    from roctune.methods import bitsandbytes_problem
    from roctune.merge import merge

    assert bitsandbytes_problem("cpu") is None
    data = write_jsonl(tmp_path / "d.jsonl", [
        {"instruction": "What is the secret word?", "output": "The secret word is pineapple."},
        {"instruction": "Say the secret word.", "output": "Pineapple."}])
    out = tmp_path / "run"
    summary, lines = run(make_cfg(data, out, None, method="qlora", max_steps=4, lr=2e-3))
    assert any("4-bit NF4" in line for line in lines)
    losses = [r["loss"] for r in metrics(out)]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert losses[0] < 6  # a working 4-bit model, not noise (random logits would give ~ln(49152) = 10.8)
    with open(out / "adapter_config.json", encoding="utf-8") as f:
        assert json.load(f)["r"] == 8
    import yaml

    with open(out / "run.yaml", encoding="utf-8") as f:
        assert yaml.safe_load(f)["config"]["method"] == "qlora"

    # chat/generate answer with the model as trained: the 4-bit base with the adapter on top
    from roctune.generate import generate, load_for_inference

    loaded = load_for_inference(adapter=str(out), device="cpu")
    assert type(loaded.model.get_base_model().model.layers[0].mlp.up_proj).__name__ == "Linear4bit"
    assert generate(loaded, [[{"role": "user", "content": "Say the secret word."}]], max_new_tokens=4)[0]
    del loaded

    merged_dir = tmp_path / "merged"
    logs = []
    result = merge(str(out), str(merged_dir), dtype="fp32", log=logs.append)
    assert result["max_logit_diff"] < 1e-3
    assert any("dequantizing" in line for line in logs)
    with open(merged_dir / "config.json", encoding="utf-8") as f:
        assert "quantization_config" not in json.load(f)
    weights = load_file(str(merged_dir / "model.safetensors"))
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    assert q.dtype == torch.float32 and q.shape == (576, 576)
    # the merged weights are the 4-bit ones dequantized plus the adapter, not the original fp32 weights
    original = load_file(os.path.join(default_model_dir, "model.safetensors"))
    k = "model.layers.0.mlp.up_proj.weight"  # not adapted: exactly the dequantized 4-bit weight
    assert not torch.equal(weights[k], original[k])
    assert float((weights[k] - original[k]).abs().max()) < 0.2 * float(original[k].abs().max())


@pytest.mark.parametrize("tied", [False, True])
def test_template_marker_rows_train_in_embedding_and_output_and_merge(tied):
    """methods.turn_token_rows: untied embeddings name both layers (the output row decides whether the marker is
    written), tied ones one matrix; the rows move, nothing else does, and roctune's merge gives the adapter's logits.
    --modules-to-save embed_tokens trains them whole instead."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, LlamaForCausalLM

    from roctune.merge import merge_and_unload
    from roctune.methods import attach_lora

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied))
    emb0, head0 = (model.get_input_embeddings().weight.detach().clone(),
                   model.get_output_embeddings().weight.detach().clone())
    cfg = SimpleNamespace(adapter=None, target_modules=["q_proj", "v_proj"], lora_r=4, lora_alpha=8, lora_dropout=0.0,
                          use_dora=False, use_rslora=False, modules_to_save=[])
    lines = []
    peft_model = attach_lora(model, cfg, {"<a>": 5, "<b>": 6}, lines.append)
    assert peft_model.peft_config["default"].trainable_token_indices == (
        [5, 6] if tied else {"model.embed_tokens": [5, 6], "lm_head": [5, 6]})
    assert len(lines) == 1 and "of <a>, <b> train next to LoRA" in lines[0]
    opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.tensor([[1, 5, 7, 6, 9, 6]])
    for _ in range(3):
        peft_model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        before = peft_model(input_ids=ids).logits
    merged = merge_and_unload(peft_model, lambda *_: None)
    emb, head = merged.get_input_embeddings().weight, merged.get_output_embeddings().weight
    for new, old in ((emb, emb0), (head, head0)):
        assert (new[5:7] - old[5:7]).abs().min() > 0 and torch.equal(new[:5], old[:5]) and torch.equal(new[7:], old[7:])
    assert (emb.data_ptr() == head.data_ptr()) == tied
    with torch.no_grad():
        assert (merged(input_ids=ids).logits - before).abs().max() < 1e-5
    whole = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    lines.clear()
    attach_lora(whole, SimpleNamespace(**{**vars(cfg), "modules_to_save": ["embed_tokens"]}), {"<a>": 5}, lines.append)
    assert lines == ["template tokens <a>: their rows train with model.embed_tokens (--modules-to-save)"]


def test_freeze_warns_that_template_marker_rows_stay_frozen(tiny_model_dir, alpaca_file, tmp_path):
    from types import SimpleNamespace

    from roctune.methods import build_model

    setup = SimpleNamespace(dtype="fp32", device="cpu", attn="sdpa", turn_tokens={"<|im_start|>": 1, "<|im_end|>": 2})
    lines = []
    build_model(make_cfg(alpaca_file, tmp_path / "o", tiny_model_dir, method="freeze"), setup, tiny_model_dir,
                lines.append)
    assert lines[-1].startswith("warning: the rows of the template's <|im_start|>, <|im_end|> stay frozen") and \
        "--freeze-extra-modules embed_tokens" in lines[-1]
    lines.clear()
    build_model(make_cfg(alpaca_file, tmp_path / "o", tiny_model_dir, method="freeze",
                         freeze_extra_modules=["embed_tokens"]), setup, tiny_model_dir, lines.append)
    assert not any("stay frozen" in line for line in lines)
