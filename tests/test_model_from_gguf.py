"""`--model FILE.gguf`: a GGUF file on disk (as Ollama and llama.cpp keep models) converted once into
$ROCTUNE_HOME/models with its tokenizer and chat template, trained on, and the LoRA GGUF export offered as the way
back onto that same file (its Modelfile and DEPLOY.md name the file, and llama.cpp's check passes). The GGUF here is
the tiny test model written by roctune export as f16."""
from __future__ import annotations

import os

import pytest


@pytest.fixture
def gguf_file(tmp_path, tiny_model_dir):
    from roctune.export import export

    report = export(tiny_model_dir, str(tmp_path / "src"), quant="f16", name="tiny", verify=False, log=lambda s: None)
    return os.path.join(tmp_path, "src", report["gguf"])


def test_gguf_file_is_converted_once_with_tokenizer_and_template(tmp_path, tiny_model_dir, gguf_file, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    from roctune.errors import ModelError
    from roctune.models import gguf_source, load_tokenizer, resolve_model

    monkeypatch.setenv("ROCTUNE_HOME", str(tmp_path / "home"))
    folder = resolve_model(gguf_file)
    assert folder.startswith(str(tmp_path / "home" / "models")) and gguf_source(folder) == gguf_file
    stamp = os.path.getmtime(os.path.join(folder, "model.safetensors"))
    assert resolve_model(gguf_file) == folder and os.path.getmtime(os.path.join(folder, "model.safetensors")) == stamp
    tok, want = load_tokenizer(folder), load_tokenizer(tiny_model_dir)
    assert tok.chat_template == want.chat_template
    text = want.apply_chat_template([{"role": "user", "content": "Who are you?"}], tokenize=False,
                                    add_generation_prompt=True)
    ids = want(text, add_special_tokens=False)["input_ids"]
    assert tok(text, add_special_tokens=False)["input_ids"] == ids
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(folder)(torch.tensor([ids])).logits
        ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(torch.tensor([ids])).logits
    assert (got - ref).abs().max() < 0.02 * ref.std()  # f16 weights
    with pytest.raises(ModelError, match="no such GGUF file"):
        resolve_model(str(tmp_path / "missing.gguf"))


def test_lora_gguf_goes_back_onto_the_original_file(tmp_path, gguf_file, monkeypatch):
    from test_export_families import _lora_run

    from roctune.export import export
    from roctune.models import resolve_model

    monkeypatch.setenv("ROCTUNE_HOME", str(tmp_path / "home"))
    run = _lora_run(gguf_file, tmp_path / "run", tmp_path)
    assert resolve_model(gguf_file) != run
    lines = []
    report = export(run, str(tmp_path / "lora"), fmt="lora-gguf", name="roc", log=lines.append)
    assert report["base_gguf"] == gguf_file and report["check"]["checked_by"] == "llama.cpp", report
    deploy = (tmp_path / "lora" / "DEPLOY.md").read_text()
    assert f"llama-server -m {gguf_file} --lora {report['gguf']}" in deploy
    assert f"FROM {gguf_file}\nADAPTER ./{report['gguf']}" in (tmp_path / "lora" / "Modelfile").read_text()
    merged = export(run, str(tmp_path / "gguf"), quant="q8_0", name="roc", log=lines.append)
    assert merged["check"]["mean_kl"] <= merged["check"]["kl_limit"]
    assert any(f"came from {gguf_file}" in line and "--format lora-gguf" in line for line in lines), lines
