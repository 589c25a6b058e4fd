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


def test_kquant_of_a_gguf_base_keeps_the_changed_matrices_at_q8_0(tmp_path, gguf_file, monkeypatch):
    """A K-quant of a fine-tune of a GGUF base: the matrices the LoRA changed stay at q8_0 (their fresh 4-5 bit
    rounding would be as large as the fine-tune's change: roctune/export/requant.py), every other tensor and every
    metadata key is what llama.cpp's quantizer wrote, and llama.cpp loads and passes the file."""
    import gguf

    from test_export_families import _lora_run

    from roctune.export import export
    from roctune.export.gguf_file import kquantize, write_gguf
    from roctune.merge import merge
    from roctune.models import load_tokenizer

    monkeypatch.setenv("ROCTUNE_HOME", str(tmp_path / "home"))
    run = _lora_run(gguf_file, tmp_path / "run", tmp_path)
    lines = []
    report = export(run, str(tmp_path / "q4"), quant="q4_k_m", name="roc", log=lines.append)
    kept = report["tensor_plan"]["q8_0_tensors"]
    assert kept and all(n.startswith("blk.") for n in kept) and "blk.0.attn_q.weight" in kept, kept
    assert any(f"the {len(kept)} matrices the adapter changed stay at q8_0" in line for line in lines), lines
    assert report["check"]["checked_by"] == "llama.cpp" and report["check"]["mean_kl"] <= report["check"]["kl_limit"]
    got = gguf.GGUFReader(str(tmp_path / "q4" / report["gguf"]))
    # the same file from llama.cpp's quantizer alone: identical but for the kept matrices
    merged, f16, plain = str(tmp_path / "merged"), str(tmp_path / "m.gguf"), str(tmp_path / "plain.gguf")
    merge(run, merged, log=lambda *_: None)
    write_gguf(merged, f16, "f16", "roc", load_tokenizer(merged))
    kquantize(f16, plain, "q4_k_m", report["tensor_plan"])
    want = gguf.GGUFReader(plain)
    assert {k: f.contents() for k, f in got.fields.items() if not k.startswith("GGUF.")} == \
           {k: f.contents() for k, f in want.fields.items() if not k.startswith("GGUF.")}
    theirs = {t.name: t for t in want.tensors}
    for t in got.tensors:
        if t.name in kept:
            assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0, t.name
        else:
            assert t.tensor_type == theirs[t.name].tensor_type and (t.data == theirs[t.name].data).all(), t.name
    assert any(theirs[n].tensor_type != gguf.GGMLQuantizationType.Q8_0 for n in kept)  # llama.cpp's were lower
