"""`roctune export` of a vision-language run: the language model GGUF and llama.cpp's mmproj, read back and run.

The run is a LoRA adapter on the tiny SmolVLM-layout model's language model, vision tower and connector
(tests/vision_models.py): the vision-side LoRA must reach the mmproj (llama.cpp's converter drops it: its issue 14867).
Checked three ways: llama.cpp itself loads both files and evaluates a conversation with a picture (the image-token
layout, the image embeddings and the distributions after the image against the merged model), GGUF's reader reads
every tensor back, and transformers computes with the mmproj's tensors loaded back when llama.cpp is absent."""
from __future__ import annotations

import json
import os

import pytest


@pytest.fixture(scope="module")
def exported(tmp_path_factory, vlm_lora_dir):
    from roctune.export import export

    out = str(tmp_path_factory.mktemp("vlm-export") / "out")
    lines: list[str] = []
    report = export(vlm_lora_dir, out, quant="q8_0", name="tiny-vlm", log=lines.append)
    return out, report, lines


def test_export_writes_both_files_checked_by_llama_cpp(exported):
    from roctune.export import mtmd

    out, report, lines = exported
    assert sorted(os.listdir(out)) == ["DEPLOY.md", "Modelfile", "mmproj-tiny-vlm-f16.gguf", "roctune_export.json",
                                       "tiny-vlm-q8_0.gguf"]
    check = report["mmproj_check"]
    assert check["checked_by"] == ("llama.cpp" if mtmd.available() else "transformers (mmproj read back)")
    assert check["max_rel_image_embedding_diff"] < 0.005 and check["mean_kl"] < 1e-3 and check["same_top"] > 0.9
    assert report["check"]["mean_kl"] < 0.1 and report["mmproj_read_back"]["tensors"] == 38
    assert any(line.startswith("mmproj check (1 conversation(s) with a picture") for line in lines)
    assert json.load(open(os.path.join(out, "roctune_export.json")))["mmproj"] == "mmproj-tiny-vlm-f16.gguf"
    deploy = open(os.path.join(out, "DEPLOY.md")).read()
    assert "--mmproj" in deploy and "llama-mtmd-cli" in deploy


def test_mmproj_keys_and_tensors_as_llama_cpp_reads_them(exported):
    import gguf

    out, _, _ = exported
    reader = gguf.GGUFReader(os.path.join(out, "mmproj-tiny-vlm-f16.gguf"))
    value = lambda key: reader.get_field(key).contents()  # noqa: E731
    assert value("general.architecture") == "clip" and value("clip.projector_type") == "idefics3"
    assert value("clip.vision.image_size") == 32 and value("clip.vision.patch_size") == 8
    assert value("clip.vision.projection_dim") == 64 and value("clip.vision.projector.scale_factor") == 2
    assert value("clip.vision.preproc_image_size") == 64 and value("clip.vision.block_count") == 2
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in reader.tensors}
    assert shapes["mm.model.fc.weight"] == (128, 64)  # gguf lists dimensions innermost first
    assert shapes["v.blk.1.attn_q.weight"] == (32, 32) and shapes["v.patch_embd.weight"] == (8, 8, 3, 32)


def test_without_llama_cpp_the_mmproj_is_checked_through_transformers(exported, monkeypatch, tmp_path,
                                                                      vlm_lora_dir):
    """The fallback check loads the mmproj's tensors into the merged model: it passes the written file and refuses
    one written from the base model, whose vision tower lacks the adapter's LoRA (what llama.cpp's converter
    would ship)."""
    from roctune.errors import RoctuneError
    from roctune.export import mmproj, mmproj_check
    from roctune.generate import base_of
    from roctune.merge import merge

    out, _, _ = exported
    merged = str(tmp_path / "merged")
    merge(vlm_lora_dir, merged, log=lambda *_: None)
    lay = mmproj.check(merged)
    conversations = mmproj_check.check_conversations()
    refs = mmproj_check.references(merged, lay, conversations)
    good = mmproj_check.by_transformers(merged, os.path.join(out, "mmproj-tiny-vlm-f16.gguf"), refs, lay, conversations)
    mmproj_check.judge(good, 0.1, "mmproj")
    assert good["max_rel_image_embedding_diff"] < 0.005
    stale = str(tmp_path / "base-mmproj.gguf")
    mmproj.write(base_of(vlm_lora_dir, None), stale, "base")
    bad = mmproj_check.by_transformers(merged, stale, refs, lay, conversations)
    with pytest.raises(RoctuneError, match="the image embeddings differ from the merged model's"):
        mmproj_check.judge(bad, 0.1, "base-mmproj.gguf")
    with pytest.raises(RoctuneError, match="mm.model.fc.weight differs from the merged model's"):
        mmproj.read_back(stale, merged)


def test_export_refusals_are_one_line_before_loading(vlm_lora_dir, tmp_path, capsys):
    from roctune.cli import main

    assert main(["export", "--adapter", vlm_lora_dir, "--output", str(tmp_path / "o"), "--format", "lora-gguf"]) == 2
    err = capsys.readouterr().err
    assert "a vision-language model exports as --format gguf" in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "o")


def test_a_processor_that_does_not_split_pictures_is_refused(tiny_vlm_dir, tmp_path):
    """llama.cpp always cuts a SmolVLM picture into tiles plus the whole picture; a model whose processor does not
    would see pictures in llama.cpp unlike in training: refused by name before anything loads."""
    import shutil

    from roctune.errors import ConfigError
    from roctune.export import mmproj

    folder = shutil.copytree(tiny_vlm_dir, tmp_path / "nosplit")
    path = folder / "processor_config.json"
    doc = json.loads(path.read_text())
    doc["image_processor"]["do_image_splitting"] = False
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="its processor does not cut pictures into tiles .do_image_splitting False"):
        mmproj.check(str(folder))
