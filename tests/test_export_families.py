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
def sharp_dir(tmp_path_factory, default_model_dir):
    def get(family: str) -> str:
        folder = tmp_path_factory.mktemp(f"sharp-{family}")
        return family_models.sharpen(family_models.build(family, str(folder), default_model_dir))

    return get


@pytest.mark.parametrize("family", list(family_models.CONFIGS))
def test_family_gguf_runs_in_llama_cpp_like_the_model(family, sharp_dir, tmp_path):
    from roctune.export import export, llamacpp
    from roctune.families import FAMILIES
    from roctune.models import load_tokenizer

    folder = sharp_dir(family)
    for quant in ("q8_0", "q4_k_m"):
        report = export(folder, str(tmp_path / quant), quant=quant, name=f"tiny {family}", log=lambda s: None)
        check = report["check"]
        assert check["checked_by"] == "llama.cpp" and check["prompts"] == 3, check
        assert check["max_rel_logit_diff"] <= REL_TOLERANCE[quant], (quant, check)
        assert report["family"] == family
    tok = load_tokenizer(folder)
    vocab = tok.get_vocab()
    model = llamacpp.Model(os.path.join(tmp_path, "q4_k_m", report["gguf"]))
    try:
        ends = [vocab[t] for t in next(f for f in FAMILIES if f.name == family).end_of_turn if t in vocab][:1] + [tok.eos_token_id]
        assert ends[0] is not None and all(model.is_eog(t) for t in ends), ends
        assert not any(model.is_eog(t) for t in tok("Hello world, the weather", add_special_tokens=False)["input_ids"])
    finally:
        model.close()
