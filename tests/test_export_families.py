"""GGUF export of every family in roctune's table (roctune.families), checked by llama.cpp itself.

Each family's tiny model (tests/family_models.py, its real config shape scaled down, sharpened so that a wrong
Q/K permutation, norm or bias shows in the logits) is exported as q8_0 (written by roctune) and q4_k_m (llama.cpp's
own quantizer on roctune's f16 file) with `roctune export`, whose check runs the file in llama.cpp: it loads it,
splits the prompts into the same token ids, and its logits after each prompt are compared with the merged
(transformers) model's. Here the largest |logit difference| relative to the spread (std) of the transformers
logits must stay within a stated tolerance:
- q8_0: 0.3. Measured 0.05-0.13 across the families; a Q/K permutation left out measured 0.9-1.1 and Gemma's
  norm +1 left out 4.6, so this tolerance tells a right layout from a wrong one.
- q4_k_m: 1.0. Measured 0.06-0.66 (hidden size 64 is below K-quants' 256-wide blocks, so llama.cpp falls back to
  its 4/5-bit legacy types there, as it does for any such tensor); it shows llama.cpp's quantizer output of
  roctune's file loads and runs close to the model, the layout itself being checked by q8_0.
Generation stops at the end of a turn: llama.cpp's vocabulary in the file marks the family's end-of-turn token
(and EOS) as end-of-generation, and ordinary text tokens not."""
from __future__ import annotations

import os

import pytest

import family_models

REL_TOLERANCE = {"q8_0": 0.3, "q4_k_m": 1.0}


@pytest.fixture(scope="module")
def sharp_dir(tmp_path_factory, family_dir):
    """family -> a sharpened copy of its tiny model."""
    import shutil

    def get(family: str) -> str:
        folder = str(tmp_path_factory.mktemp(f"sharp-{family}") / "model")
        shutil.copytree(family_dir(family), folder)
        return family_models.sharpen(folder)

    return get


@pytest.mark.parametrize("family", list(family_models.CONFIGS))
def test_family_gguf_runs_in_llama_cpp_like_the_model(family, sharp_dir, tmp_path):
    from roctune.export import export, llamacpp
    from roctune.families import FAMILIES
    from roctune.models import load_tokenizer

    folder = sharp_dir(family)
    for quant in ("q8_0", "q4_k_m"):
        lines = []
        report = export(folder, str(tmp_path / quant), quant=quant, name=f"tiny {family}", log=lines.append)
        check = report["check"]
        assert check["checked_by"] == "llama.cpp" and check["prompts"] == 3, check
        assert check["max_rel_logit_diff"] <= REL_TOLERANCE[quant], (quant, check)
        assert report["family"] == family
        # a chat template Ollama's TEMPLATE cannot express (Mistral's, Gemma 2's without a system role, ...): the
        # GGUF is still written, the Modelfile has no TEMPLATE, and one line says what to do
        modelfile = open(tmp_path / quant / "Modelfile").read()
        bare = [line for line in lines if line.startswith("Modelfile without TEMPLATE")]
        assert len(bare) == (0 if report["modelfile_template"] else 1), lines
        assert ("TEMPLATE" in modelfile) == report["modelfile_template"] and modelfile.startswith("FROM ./tiny-")
    tok = load_tokenizer(folder)
    vocab = tok.get_vocab()
    model = llamacpp.Model(os.path.join(tmp_path, "q4_k_m", report["gguf"]))
    try:
        family_eot = next(f for f in FAMILIES if f.name == family).end_of_turn
        ends = [vocab[t] for t in family_eot if t in vocab][:1] + [tok.eos_token_id]
        assert ends[0] is not None and all(model.is_eog(t) for t in ends), ends
        assert not any(model.is_eog(t) for t in tok("Hello world, the weather", add_special_tokens=False)["input_ids"])
        adds_bos = tok("a")["input_ids"][0] == tok.bos_token_id
        assert model.meta("tokenizer.ggml.add_bos_token") == str(adds_bos).lower()
        assert model.meta("tokenizer.ggml.add_space_prefix") == "false"
    finally:
        model.close()


def _lora_run(model_dir: str, out, data_dir) -> str:
    """A LoRA run of one step, its B matrices then drawn at random so the adapter changes the logits clearly."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from conftest import run_train, write_jsonl
    from roctune.config import TrainConfig

    data = write_jsonl(data_dir / "sft.jsonl", [{"messages": [
        {"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "I am Roc."}]}] * 2)
    cfg = TrainConfig(data=[data], output=str(out), model=model_dir, max_steps=1, batch_size=2, grad_accum=1,
                      max_length=64, lora_r=4, lora_alpha=8, device="cpu", seed=1)
    cfg.validate()
    run_train(cfg)
    path = os.path.join(out, "adapter_model.safetensors")
    rng = np.random.default_rng(0)
    save_file({k: (rng.normal(0, 0.2, v.shape).astype(v.dtype) if ".lora_B." in k else v)
               for k, v in load_file(path).items()}, path)
    return str(out)


def _logits(model, ids):
    return model.run(ids, 0)[0]


@pytest.mark.parametrize("family", ["llama", "phi3"])  # Q/K rows permuted; fused qkv_proj
def test_lora_gguf_on_the_base_gguf_gives_the_merged_model(family, sharp_dir, tmp_path):
    """The adapter alone, applied by llama.cpp (llama_adapter_lora_init / llama_set_adapters_lora, as
    `llama-server --lora` does) to an f16 GGUF of the base written by `roctune export`, gives the merged
    model's logits within 5% of their spread; the base alone is far off (the adapter matters)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roctune.export import export, llamacpp
    from roctune.merge import merge

    base = sharp_dir(family)
    run = _lora_run(base, tmp_path / "run", tmp_path)
    report = export(run, str(tmp_path / "lora"), fmt="lora-gguf", name="roc", log=lambda s: None)
    assert report["check"]["checked_by"] == "llama.cpp" and report["check"]["max_rel_logit_diff"] <= 0.05
    assert sorted(os.listdir(tmp_path / "lora")) == ["DEPLOY.md", "Modelfile", "roc-lora.gguf", "roctune_export.json"]
    assert "ADAPTER ./roc-lora.gguf" in open(tmp_path / "lora" / "Modelfile").read()
    base_gguf = export(base, str(tmp_path / "base"), quant="f16", name="base", verify=False, log=lambda s: None)
    merge(run, str(tmp_path / "merged"), log=lambda *_: None)
    tok = AutoTokenizer.from_pretrained(tmp_path / "merged")
    ids = tok("Who are you? I am Roc, a helpful assistant.", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()(torch.tensor([ids])).logits[0, -1].numpy()
    path = str(tmp_path / "base" / base_gguf["gguf"])
    for lora, low, high in ((None, 0.5, np.inf), (str(tmp_path / "lora" / "roc-lora.gguf"), 0.0, 0.05)):
        model = llamacpp.Model(path, lora=lora)
        try:
            rel = np.abs(_logits(model, ids) - ref).max() / ref.std()
        finally:
            model.close()
        assert low <= rel <= high, (lora, rel)


def test_lora_gguf_refuses_modules_to_save_in_one_line(sharp_dir, tmp_path, capsys):
    import json

    from roctune.cli import main

    run = _lora_run(sharp_dir("llama"), tmp_path / "run", tmp_path)
    cfg_path = os.path.join(run, "adapter_config.json")
    cfg = json.load(open(cfg_path))
    json.dump({**cfg, "modules_to_save": ["embed_tokens", "lm_head"]}, open(cfg_path, "w"))
    capsys.readouterr()
    out = tmp_path / "lora"
    assert main(["export", "--adapter", run, "--output", str(out), "--format", "lora-gguf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "modules_to_save" in err[0] and "--format gguf" in err[0], err
    assert not out.exists()


def test_llama3_rope_factors_give_transformers_frequencies():
    """Llama 3.1's rope scaling changes only long wavelengths, which a short check prompt cannot see: the factors
    written as rope_freqs (llama.cpp divides each base frequency by its factor) must give transformers' own."""
    import numpy as np
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from roctune.export.gguf_specs import _llama3_factors

    shape = family_models.CONFIGS["llama"][2]
    config = LlamaConfig(vocab_size=16, **shape)
    cfg = config.to_dict()
    (name, factors), = _llama3_factors(cfg)
    dim, theta = cfg["head_dim"], cfg["rope_parameters"]["rope_theta"]
    base = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    want = ROPE_INIT_FUNCTIONS["llama3"](config)[0].numpy()
    assert name == "rope_freqs.weight" and np.allclose(base / factors, want, rtol=1e-5)
    assert (factors > 1).any() and (factors == 1).any()  # both ends of the scaling are exercised


def test_lora_gguf_carries_the_trained_marker_rows_of_untied_embeddings(sharp_dir, tmp_path):
    """LoRA with roctune's template on an untied model (Qwen2.5's shape) also trains the markers' embedding and
    output rows: the LoRA GGUF holds them as exact rank-k pairs (llama.cpp's token_embd layout), and llama.cpp
    applying it to the base's f16 GGUF gives the merged model's logits, also where the base's rows would give others
    (at and after the markers). A tied model's rows are refused (test_templates)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from conftest import run_train, write_jsonl
    from roctune.config import TrainConfig
    from roctune.export import export, llamacpp
    from roctune.merge import merge
    from roctune.models import load_tokenizer

    base = sharp_dir("qwen2")
    data = write_jsonl(tmp_path / "sft.jsonl", [{"messages": [
        {"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "I am Roc."}]}] * 4)
    run = str(tmp_path / "run")
    cfg = TrainConfig(data=[data], output=run, model=base, template="chatml", max_steps=3, batch_size=4, lr=0.05,
                      grad_accum=1, max_length=64, lora_r=4, lora_alpha=8, device="cpu", seed=1)
    cfg.validate()
    _, lines = run_train(cfg)
    assert any("embedding and output rows of <|im_start|>, <|im_end|>" in line for line in lines), lines
    report = export(run, str(tmp_path / "lora"), fmt="lora-gguf", name="roc", log=lambda s: None)
    assert report["token_rows"] == 2 and report["check"]["checked_by"] == "llama.cpp", report
    base_gguf = export(base, str(tmp_path / "base"), quant="f16", name="base", verify=False, log=lambda s: None)
    merge(run, str(tmp_path / "merged"), log=lambda *_: None)
    tok = load_tokenizer(base)
    ids = tok("<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    with torch.no_grad():
        ref = merged(torch.tensor([ids])).logits[0].numpy()
        marks = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
        original = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        for layer in (merged.get_input_embeddings(), merged.get_output_embeddings()):
            layer.weight[marks] = (original.get_input_embeddings() if layer is merged.get_input_embeddings()
                                   else original.get_output_embeddings()).weight[marks]
        without_rows = merged(torch.tensor([ids])).logits[0].numpy()
    model = llamacpp.Model(str(tmp_path / "base" / base_gguf["gguf"]), lora=str(tmp_path / "lora" / "roc-lora.gguf"))
    try:
        got = model.logits_all(ids)
    finally:
        model.close()
    spread = ref.std()
    assert np.abs(got - ref).max() / spread < 0.05
    assert np.abs(without_rows - ref).max() / spread > 0.5  # the rows matter: without them llama.cpp could not match
