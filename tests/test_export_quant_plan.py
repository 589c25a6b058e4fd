"""The quant plan of a llama.cpp K-quant: the token embedding and output layer at a higher type when the vocabulary is
a large share of the weights (the tiny test model's 49,152 x 64 embedding is most of it), chosen types written as
asked, flags refused where they cannot apply, and a failed check naming the next option."""
from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp_py_sync")


def test_big_vocabulary_gets_q8_0_embedding_and_types_are_selectable(tmp_path, tiny_model_dir):
    from roctune.export import export, gguf_file

    assert gguf_file.vocab_share(tiny_model_dir) > gguf_file.BIG_VOCAB_SHARE
    auto = export(tiny_model_dir, str(tmp_path / "auto"), quant="q4_k_m", log=lambda s: None)
    assert auto["tensor_plan"]["embedding_type"] == "q8_0" and "% of the parameters" in auto["tensor_plan"]["reason"]
    assert auto["vocab_tensor_types"]["token_embd.weight"] == "q8_0", auto
    f16 = export(tiny_model_dir, str(tmp_path / "f16"), quant="q4_k_m", embedding_type="f16", output_type="f16",
                 log=lambda s: None)
    assert f16["vocab_tensor_types"]["token_embd.weight"] == "f16" and f16["bytes"] > auto["bytes"], f16
    assert f16["check"]["mean_kl"] <= f16["check"]["kl_limit"]


def test_tensor_types_refused_where_they_cannot_apply(tmp_path, tiny_model_dir, capsys):
    from roctune.cli import main

    for flags, want in ((["--quant", "q8_0", "--embedding-type", "q6_k"], "--embedding-type q6_k: only for a quant"),
                        (["--quant", "q4_k_m", "--output-type", "q3"], "--output-type q3: unknown")):
        capsys.readouterr()
        assert main(["export", "--adapter", tiny_model_dir, "--output", str(tmp_path / "out"), *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and want in err[0], err
    assert not (tmp_path / "out").exists()


def test_failed_check_names_the_next_option(tmp_path, tiny_model_dir, monkeypatch):
    from dataclasses import replace

    from roctune.errors import RoctuneError
    from roctune.export import export, quants

    monkeypatch.setitem(quants.QUANTS, "q4_k_m", replace(quants.QUANTS["q4_k_m"], kl_limit=-1.0))  # any file fails
    with pytest.raises(RoctuneError) as e:
        export(tiny_model_dir, str(tmp_path / "out"), quant="q4_k_m", embedding_type="default",
               output_type="default", log=lambda s: None)
    assert "not saved; try --quant q4_k_m --embedding-type q8_0 --output-type q8_0, or --quant q6_k" in str(e.value)
    assert "--format lora-gguf" in str(e.value)
    assert not (tmp_path / "out").exists()
