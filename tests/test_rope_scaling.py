"""Long-context models: a warning with the fix when --max-length passes the model's context, --rope-scaling
TYPE:FACTOR applied at load and kept in run.yaml, and the same positions after training: the merged model's
config.json, the server's base model, the GGUF's rope scaling keys (read with the `gguf` package) and llama.cpp's logits past the native
context all agree with the adapter-applied model."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from conftest import read_metrics, run_train

NATIVE = 128  # the tiny model's native context here; the examples are about 2.5 times that


@pytest.fixture(scope="module")
def short_model(tmp_path_factory, tiny_model_dir):
    """The tiny llama with a 128-token native context."""
    folder = tmp_path_factory.mktemp("short") / "model"
    shutil.copytree(tiny_model_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["max_position_embeddings"] = NATIVE
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


def _data(path, n=4):
    words = ["river", "stone", "lamp", "orbit", "maple", "quiet", "copper", "signal"]
    rows = [{"instruction": f"Recite list {i}.", "input": "",
             "output": " ".join(words[(i + j) % len(words)] for j in range(240))} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_max_length_past_the_native_context_is_warned_with_the_fix(short_model):
    from roctune.models import context_warning

    line = context_warning(short_model, 400, "")
    assert "--max-length 400 exceeds the 128 positions" in line and "--rope-scaling yarn:4" in line
    assert context_warning(short_model, 128, "") is None
    assert context_warning(short_model, 400, "yarn:4") is None  # 512 covered
    assert "--rope-scaling yarn:5" in context_warning(short_model, 600, "yarn:4")


@pytest.mark.parametrize("value", ["yarn", "yarn:1", "ntk:2", "linear:x", "linear:nan"])
def test_bad_rope_scaling_is_refused_in_one_line(capsys, tmp_path, alpaca_file, value):
    from roctune.cli import main

    code = main(["train", "--data", alpaca_file, "--output", str(tmp_path / "out"), "--rope-scaling", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--rope-scaling" in err[0] and "yarn:4" in err[0], err
    assert not (tmp_path / "out").exists()


def test_scaled_config_stretches_the_native_context(short_model, tiny_model_dir):
    from roctune.errors import ModelError
    from roctune.models import scaled_config

    cfg = scaled_config(short_model, "llama3:8")
    assert cfg.max_position_embeddings == 8 * NATIVE
    assert cfg.rope_parameters["rope_type"] == "llama3" and cfg.rope_parameters["factor"] == 8
    assert cfg.rope_parameters["original_max_position_embeddings"] == NATIVE
    assert scaled_config(short_model, "") is None
    scaled = os.path.join(os.path.dirname(short_model), "scaled")
    shutil.copytree(short_model, scaled)
    cfg.save_pretrained(scaled)
    with pytest.raises(ModelError, match="already scales its rope"):
        scaled_config(scaled, "yarn:2")


@pytest.mark.slow
def test_yarn_run_merge_and_gguf_use_the_same_positions(short_model, tmp_path):
    import gguf
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from roctune import rundir
    from roctune.config import TrainConfig
    from roctune.export import export, llamacpp
    from roctune.generate import load_for_inference
    from roctune.merge import merge
    from roctune.serve import build_engine
    from roctune.serve.errors import ApiError

    run = str(tmp_path / "run")
    cfg = TrainConfig(model=short_model, data=[_data(tmp_path / "long.jsonl")], output=run, max_steps=2,
                      batch_size=2, grad_accum=1, lr=1e-2, lora_dropout=0.0, max_length=400, device="cpu",
                      rope_scaling="yarn:4", target_modules=["q_proj", "v_proj"])
    cfg.validate()
    _, lines = run_train(cfg)
    assert not [line for line in lines if "exceeds" in line], lines  # 400 <= 4 x 128: no warning
    assert rundir.read_run(run)["config"]["rope_scaling"] == "yarn:4"
    assert min(m["tokens"] for m in read_metrics(run)) > 2 * 2 * NATIVE  # examples past the native context

    ids = torch.tensor([list(range(5, 5 + 3 * NATIVE))])  # 384 tokens: positions up to 3x the native context
    loaded = load_for_inference(adapter=run, device="cpu", dtype="fp32")
    with torch.no_grad():
        adapted = loaded.model(ids).logits[0].float()
    merged_dir = str(tmp_path / "merged")
    merge(run, merged_dir, log=lambda *_: None)
    written = json.loads(open(os.path.join(merged_dir, "config.json")).read())
    rope = written.get("rope_parameters") or written["rope_scaling"]
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4 and rope["original_max_position_embeddings"] == NATIVE
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    plain = AutoModelForCausalLM.from_pretrained(short_model, dtype=torch.float32).eval()
    with torch.no_grad():
        got = merged(ids).logits[0].float()
        unscaled = plain(ids).logits[0].float()
    assert float((got - adapted).abs().max()) < 1e-3
    served = build_engine(short_model, [("yarn", run)], device="cpu", dtype="fp32")  # the base takes the run's rope
    served.stack.peft.set_adapter("yarn")
    with torch.no_grad():
        assert float((served.stack.peft(ids).logits[0] - adapted).abs().max()) < 1e-4
    with pytest.raises(ApiError, match="--rope-scaling yarn:4"):  # a base without it refuses the run
        build_engine(short_model, [], device="cpu", dtype="fp32").load_adapter("yarn", run)
    # the positions matter here: the base model's own (unscaled) rope gives other logits past the native context
    assert float((unscaled[-1] - got[-1]).abs().max()) > 100 * float((got[-1] - adapted[-1]).abs().max())

    out = str(tmp_path / "gguf")
    report = export(run, out, quant="f16", name="tiny-yarn", log=lambda *_: None)
    path = os.path.join(out, report["gguf"])
    reader = gguf.GGUFReader(path)

    def key(name):
        field = reader.fields[name]
        return field.parts[field.data[0]].tolist()

    assert bytes(key("llama.rope.scaling.type")).decode() == "yarn"
    assert key("llama.rope.scaling.factor") == [4.0]
    assert key("llama.rope.scaling.original_context_length") == [NATIVE]
    assert key("llama.context_length") == [4 * NATIVE]
    model = llamacpp.Model(path, n_ctx=4 * NATIVE)
    try:
        logits, _ = model.run(ids[0].tolist(), 0)
    finally:
        model.close()
    ref = got[-1].numpy()
    rel = float(np.abs(logits - ref).max()) / float(np.std(ref))
    assert rel < 0.05, rel  # f16 weights; a wrong rope past the native context is far off (checked below)
    assert float(np.abs(unscaled[-1].numpy() - ref).max()) / float(np.std(ref)) > 4 * rel
