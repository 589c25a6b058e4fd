"""GGUF export of models with a SentencePiece vocabulary (Mistral 7B, Gemma 2, Phi-3 mini, Llama 2), checked by
llama.cpp itself.

A tiny SentencePiece model is trained here with the `sentencepiece` package (BPE, byte fallback, digits split, a few
hundred pieces, on generated English and Chinese text) with each family's special pieces and ids, and wrapped as the
family's transformers tokenizer (LlamaTokenizer with the normalizer of Llama 2's and Mistral's tokenizer.json, '▁'
prepended to every text segment, for Mistral and Phi-3, GemmaTokenizer for Gemma) from the `tokenizer.model` file;
Phi-3's chat tokens are added on top of the model's pieces, as in its tokenizer.json. The family's tiny model
(tests/family_models.py shapes, sharpened) is exported as f16, q8_0 and q4_k_m (llama.cpp's quantizer on roctune's
f16 file) with `roctune export`, whose own check runs the file in llama.cpp (same token ids for the rendered
prompts, logits within tolerance, greedy answers). Here, besides: llama.cpp splits a fixed mixed text (English,
Chinese outside the vocabulary, digits, runs of spaces, a special token) into the same ids as transformers; the
greedy answers (16 tokens) of an f16 export are equal (at q8_0 a random tiny model's near-ties flip some late token:
measured 2 of 3 equal for Mistral, the logits within 0.06 of their spread); the end-of-turn token and EOS end
generation in llama.cpp and text tokens do not. Tolerances, as max |logit difference| over the spread (std) of
transformers' logits: f16 0.05 (measured 0.003-0.008: the layout and vocabulary are right), q8_0 0.3 as for the
byte-level BPE families (test_export_families.py; measured 0.06-0.11, Gemma 3's six layers 0.24); q4_k_m within
export's own K-quant KL limit (4-bit noise on a random model of hidden size 64, where llama.cpp falls back to its
legacy 4/5-bit types), which shows llama.cpp's requantized file keeps the
vocabulary and runs."""
from __future__ import annotations

import io
import json
import os
import random

import pytest

import family_models

REL_TOLERANCE = 0.3      # q8_0
F16_REL_TOLERANCE = 0.05
MIXED = "Hello world, the water  is  here!\n我想在apple工作1314151天 ok   {special} 42 end"

# family -> (tokenizer class, SentencePiece ids/pieces, pieces in the model, tokens added on top, eot, template)
LLAMA_IDS = dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
GEMMA_IDS = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>")
STYLES = {
    # Llama 2: [INST] is plain text, its chat template otherwise Mistral's
    "llama": ("LlamaTokenizer", LLAMA_IDS, {}, [], "</s>", family_models.MISTRAL),
    "mistral": ("LlamaTokenizer", LLAMA_IDS, {"control_symbols": ["[INST]", "[/INST]"]}, [], "</s>",
                family_models.MISTRAL),
    "gemma2": ("GemmaTokenizer", GEMMA_IDS, {"user_defined_symbols": ["<start_of_turn>", "<end_of_turn>"]}, [],
               "<end_of_turn>", family_models.GEMMA2),
    "gemma3": ("GemmaTokenizer", GEMMA_IDS, {"user_defined_symbols": ["<start_of_turn>", "<end_of_turn>"]}, [],
               "<end_of_turn>", family_models.GEMMA3),
    "phi3": ("LlamaTokenizer", LLAMA_IDS, {}, ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>",
                                              "<|system|>"], "<|end|>", family_models.PHI3),
}


def _corpus(n: int = 400) -> list[str]:
    rng = random.Random(0)
    words = ("the of and to in is you that it was for on are as with they at be this have from or one had by word "
             "but not what all were we when your can said there use an each which she do how if will up other about "
             "out many then them these so some would make like him into time has look two more write go see number "
             "no way could people my than first water been call who now find long down day did get come made may "
             "part hello world assistant answer question").split()
    zh = "我想在工作天你好世界中国人大学生今天气很"
    return [" ".join(rng.choice(words) for _ in range(12)) + " " + "".join(rng.choice(zh) for _ in range(4)) +
            f" {rng.randint(0, 99999)}" for _ in range(n)]


def train_spm(folder: str, ids: dict, extra: dict, model_type: str = "bpe") -> str:
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_corpus()), model_writer=out, vocab_size=600,
                                   model_type=model_type, byte_fallback=True, character_coverage=0.9995,
                                   split_digits=True, minloglevel=2, **ids, **extra)
    path = os.path.join(folder, "tokenizer.model")
    with open(path, "wb") as f:
        f.write(out.getvalue())
    return path


def spm_tokenizer(family: str, folder: str):
    """The family's transformers tokenizer from a freshly trained tokenizer.model in `folder`."""
    from transformers import AutoTokenizer

    cls, ids, extra, added, _, template = STYLES[family]
    os.makedirs(folder, exist_ok=True)
    train_spm(folder, ids, extra)
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": cls, "legacy": True, "add_bos_token": True}, f)
    tok = AutoTokenizer.from_pretrained(folder)
    if cls == "LlamaTokenizer":  # as in Llama 2's and Mistral's tokenizer.json: '▁' before every text segment
        from tokenizers import normalizers

        tok.backend_tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                                                 normalizers.Replace(" ", "\u2581")])
        tok.backend_tokenizer.pre_tokenizer = None
    if added:  # as in Phi-3's tokenizer.json: </s> and its chat tokens drop the whitespace after them
        from tokenizers import AddedToken

        tok.add_special_tokens({"additional_special_tokens": [
            AddedToken(t, special=True, normalized=False, rstrip=t != "<|endoftext|>") for t in ["</s>", *added]]})
        tok.eos_token = tok.pad_token = "<|endoftext|>"
    if family.startswith("gemma"):
        tok.pad_token = "<pad>"
    tok.chat_template = template
    return tok


def build(family: str, folder: str) -> str:
    """The family's tiny model with a SentencePiece tokenizer (tokenizer.model kept beside it), sharpened."""
    import torch
    import transformers

    cls_name, _, shape = family_models.CONFIGS[family]
    tok = spm_tokenizer(family, folder)
    ids = {f"{k}_token_id": tok.convert_tokens_to_ids(getattr(tok, f"{k}_token")) if getattr(tok, f"{k}_token")
           else None for k in ("bos", "eos", "pad")}
    config = getattr(transformers, cls_name)(vocab_size=len(tok), **shape, **ids)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return family_models.sharpen(folder)


@pytest.mark.parametrize("family", list(STYLES))
def test_sentencepiece_gguf_runs_in_llama_cpp_like_the_model(family, tmp_path):
    from roctune.export import export, llamacpp
    from roctune.models import load_tokenizer

    folder = build(family, str(tmp_path / "model"))
    f16 = export(folder, str(tmp_path / "f16"), quant="f16", name=f"tiny {family}", log=lambda s: None)["check"]
    assert f16["answers_equal"] == f16["prompts"] == 3, f16["answers"]
    assert f16["max_rel_logit_diff"] <= F16_REL_TOLERANCE, f16
    report = export(folder, str(tmp_path / "out"), quant="q8_0", name=f"tiny {family}", log=lambda s: None)
    check = report["check"]
    assert report["pre_tokenizer"] == "default" and check["checked_by"] == "llama.cpp", report
    assert check["max_rel_logit_diff"] <= REL_TOLERANCE, check
    k = export(folder, str(tmp_path / "k"), quant="q4_k_m", name=f"tiny {family}", log=lambda s: None)["check"]
    assert k["checked_by"] == "llama.cpp" and k["mean_kl"] <= k["kl_limit"], k
    tok = load_tokenizer(folder)
    eot = STYLES[family][4]
    text = MIXED.format(special=eot)
    want = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in want and tok.convert_tokens_to_ids(eot) in want
    assert any(tok.convert_ids_to_tokens(i).startswith("<0x") for i in want)  # byte fallback exercised
    model = llamacpp.Model(os.path.join(tmp_path, "out", report["gguf"]))
    try:
        with_bos = tok.bos_token + text
        assert model.tokenize(with_bos) == tok(with_bos, add_special_tokens=False)["input_ids"]
        # transformers 5 rebuilds a Llama model's tokenizer with '▁' before the start of the text only, which
        # llama.cpp cannot express (it prefixes every text segment or none): text with a special token before it
        # (a chat prompt, or BOS) splits the same; text at the very start lacks that '▁' in llama.cpp
        if family != "llama":
            assert model.tokenize(text) == want
        assert model.meta("tokenizer.ggml.model") == "llama"
        assert model.meta("tokenizer.ggml.add_space_prefix") == ("false" if family.startswith(("gemma", "llama")) else "true")
        assert model.meta("tokenizer.ggml.add_bos_token") == "true"
        ends = [tok.convert_tokens_to_ids(eot), tok.eos_token_id]
        assert all(model.is_eog(t) for t in ends), ends
        assert not any(model.is_eog(t) for t in tok("Hello world, the water", add_special_tokens=False)["input_ids"])
    finally:
        model.close()


def test_unigram_and_unknown_tokenizers_are_refused_in_one_line(tmp_path, capsys):
    """A SentencePiece unigram model (llama.cpp would split it by BPE-style merges) and a folder with neither a
    tokenizer.model nor a byte-level BPE tokenizer.json are refused before any weights load, nothing written."""
    from roctune.cli import main

    folder = build("mistral", str(tmp_path / "model"))
    train_spm(folder, LLAMA_IDS, STYLES["mistral"][2], model_type="unigram")
    capsys.readouterr()
    assert main(["export", "--adapter", folder, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unigram" in err[0] and "tokenizer.model" in err[0], err
    os.unlink(os.path.join(folder, "tokenizer.model"))
    path = os.path.join(folder, "tokenizer.json")  # tokenizer.json alone, a BPE neither SentencePiece-style
    with open(path, encoding="utf-8") as f:        # (byte fallback) nor byte-level
        data = json.load(f)
    data["model"]["byte_fallback"] = False
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    assert main(["export", "--adapter", folder, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no SentencePiece tokenizer.model" in err[0], err
    assert not (tmp_path / "out").exists()


def test_tokenizer_json_only_gemma_exports_and_llama_cpp_splits_like_transformers(tmp_path):
    """A Gemma 3 folder without tokenizer.model (as a GGUF-converted or tokenizer.json-only folder is): its
    SentencePiece pieces come from tokenizer.json, scored by merge order, and llama.cpp splits mixed text (byte
    fallback, digits, runs of spaces, Chinese, the turn markers) and a chat prompt into transformers' ids."""
    from roctune.export import export, llamacpp
    from roctune.models import load_tokenizer

    folder = build("gemma3", str(tmp_path / "model"))
    os.unlink(os.path.join(folder, "tokenizer.model"))
    tok = load_tokenizer(folder)
    report = export(folder, str(tmp_path / "out"), quant="f16", name="tiny gemma3", log=lambda s: None)
    assert report["pre_tokenizer"] == "default" and report["check"]["checked_by"] == "llama.cpp", report
    assert report["check"]["mean_kl"] <= report["check"]["kl_limit"], report["check"]
    model = llamacpp.Model(os.path.join(tmp_path, "out", report["gguf"]), vocab_only=True)
    try:
        prompt = tok.apply_chat_template([{"role": "user", "content": "the water is here 42"}], tokenize=False,
                                         add_generation_prompt=True)
        for text in (MIXED.format(special="<end_of_turn>"), prompt, *_corpus(20)):
            assert model.tokenize(text) == tok(text, add_special_tokens=False)["input_ids"], text
        assert model.meta("tokenizer.ggml.model") == "llama"
    finally:
        model.close()


def test_run_on_a_sentencepiece_model_exports(tmp_path):
    """A LoRA run's export finds the base model's tokenizer.model (the run and the merged model keep only
    tokenizer.json) and passes llama.cpp's check; so does its --format lora-gguf on an f16 GGUF of the base."""
    from test_export_families import _lora_run

    from roctune.export import export

    run = _lora_run(build("mistral", str(tmp_path / "base")), tmp_path / "run", tmp_path)
    assert not os.path.exists(os.path.join(run, "tokenizer.model"))
    for fmt in ("gguf", "lora-gguf"):
        report = export(run, str(tmp_path / fmt), fmt=fmt, name="roc", log=lambda s: None)
        assert report["check"]["checked_by"] == "llama.cpp", report
        assert report["check"]["max_rel_logit_diff"] <= (REL_TOLERANCE if fmt == "gguf" else 0.05), report["check"]


def test_phi3_name_is_kept_only_when_llama_cpp_splits_like_the_tokenizer(tmp_path):
    """llama.cpp strips the whitespace after the special tokens of a model named Phi-3; the name is written
    as is for a tokenizer that does the same (Phi-3's), with "phi_3" for one that keeps it or lacks Phi-3's
    SentencePiece tokens."""
    from tokenizers import AddedToken

    from roctune.export.gguf_file import _general_name

    tok = spm_tokenizer("phi3", str(tmp_path / "phi3"))
    assert _general_name("my Phi-3 tune", tok) == "my Phi-3 tune"
    assert _general_name("my phi3 tune", spm_tokenizer("mistral", str(tmp_path / "mistral"))) == "my phi_3 tune"
    tok.add_special_tokens({"additional_special_tokens": [AddedToken("<|tool|>", special=True, normalized=False)]})
    assert _general_name("my Phi-3 tune", tok) == "my phi_3 tune"


def test_without_llama_cpp_the_check_is_refused_before_loading(tmp_path, monkeypatch):
    """transformers' GGUF reader splits text after a special token unlike llama.cpp, so without llama.cpp's
    library a SentencePiece export asks for it (or --no-verify) before anything loads; --no-verify writes."""
    from roctune.errors import EnvironmentProblem
    from roctune.export import export, llamacpp

    folder = build("mistral", str(tmp_path / "model"))
    monkeypatch.setattr(llamacpp, "available", lambda: False)
    with pytest.raises(EnvironmentProblem, match=r"roctune\[gguf\].*--no-verify"):
        export(folder, str(tmp_path / "out"), quant="f16", log=lambda s: None)
    assert not (tmp_path / "out").exists()
    report = export(folder, str(tmp_path / "out"), quant="f16", verify=False, log=lambda s: None)
    assert os.path.getsize(tmp_path / "out" / report["gguf"]) > 0
