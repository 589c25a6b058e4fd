"""`roctune models build-vlm` (issue 48): a text model and a fresh SigLIP-shaped tower joined in SmolVLM's layout, a
folder that plain transformers loads and `roctune train --train-vision-tower --train-projector` trains; its
refusals in one line; and `data check` / `data preview` / `estimate` counting the images' tokens with it. The tiny
text model (tests/conftest.py) and a tiny tower keep it to seconds; scripts/vision_learning.py shows the real one
learning."""
from __future__ import annotations

import json
import os

import pytest
import torch

from conftest import read_metrics, write_jsonl
from test_hostile import refused

TOWER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "image_size": 32, "patch_size": 8}


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_model_dir):
    from PIL import Image

    from roctune.cli import main

    folder = tmp_path_factory.mktemp("build-vlm")
    (folder / "tower.json").write_text(json.dumps(TOWER))
    assert main(["models", "build-vlm", "--output", str(folder / "vlm"), "--text", tiny_model_dir,
                 "--vision", str(folder / "tower.json")]) == 0
    rows = []
    for i, (name, rgb) in enumerate((("red", (220, 30, 30)), ("blue", (30, 40, 220))) * 2):
        Image.new("RGB", (40 + 8 * i, 36), rgb).save(folder / f"{i}.png")
        rows.append({"messages": [{"role": "user", "content": "<image>Colour?"},
                                  {"role": "assistant", "content": name.capitalize() + "."}], "images": [f"{i}.png"]})
    return {"model": str(folder / "vlm"), "data": write_jsonl(folder / "d.jsonl", rows), "folder": folder}


def test_the_built_folder_loads_in_transformers_and_keeps_the_text_model(built, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor

    from roctune.vision import load_image_text

    vlm = AutoModelForImageTextToText.from_pretrained(built["model"])
    text = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.tensor([[1, 200, 300, 400, 500]])
    vocab = text.config.vocab_size
    assert torch.allclose(vlm(input_ids=ids).logits[..., :vocab], text(input_ids=ids).logits, atol=1e-5)
    assert type(vlm).__name__ == "Idefics3ForConditionalGeneration" and vlm.config.vision_config.hidden_size == 32
    it = load_image_text(built["model"])
    assert it.processor.image_seq_len == 4 and "roctune_content" in it.tokenizer.chat_template  # (32/8)^2 / 2^2
    # AutoProcessor loads it without torchvision (SmolVLM's processor would need its video processor)
    assert type(AutoProcessor.from_pretrained(built["model"])).__name__ == "Idefics3Processor"
    assert it.processor.image_processor.do_image_splitting and it.tokenizer.convert_tokens_to_ids("<row_2_col_2>") \
        != it.tokenizer.unk_token_id


def test_the_fresh_tower_is_initialised_as_siglip_initialises_it(built):
    """Patch embedding LeCun-normal (std sqrt(1/fan_in)), position embeddings std 1/sqrt(width), linear layers
    Xavier-uniform, biases zero: not SmolVLM's std 0.02 everywhere, with which the shapes task stayed near chance."""
    import math

    from transformers import AutoModelForImageTextToText

    tower = AutoModelForImageTextToText.from_pretrained(built["model"]).model.vision_model
    patch = tower.embeddings.patch_embedding.weight
    assert abs(patch.std().item() / math.sqrt(1 / patch[0].numel()) - 1) < 0.15
    assert abs(tower.embeddings.position_embedding.weight.std().item() * math.sqrt(32) - 1) < 0.15
    fc1 = tower.encoder.layers[0].mlp.fc1
    assert fc1.weight.abs().max().item() <= math.sqrt(6 / (32 + 64)) and fc1.weight.std().item() > 0.1
    assert not fc1.bias.any() and not tower.embeddings.patch_embedding.bias.any()


def test_train_vision_tower_and_projector_on_the_built_model(built, tmp_path):
    """LoRA on the language model, the fresh tower and the projector trained whole beside it: all three move; the
    run folder holds the adapter (with the tower and projector) and the processor, and loads back."""
    from peft import PeftModel
    from safetensors.torch import load_file

    from roctune.cli import main

    out = tmp_path / "run"
    assert main(["train", "--model", built["model"], "--data", built["data"], "--output", str(out), "--max-steps", "2",
                 "--batch-size", "2", "--lr", "1e-2", "--train-vision-tower", "--train-projector"]) == 0
    weights = load_file(out / "adapter_model.safetensors")
    assert any("vision_model" in k and "encoder" in k and "lora" not in k for k in weights)
    assert not any("vision_model" in k and "lora" in k for k in weights)
    assert any("text_model" in k and "lora_A" in k for k in weights)
    assert any("connector" in k and "lora" not in k for k in weights)
    assert {"processor_config.json", "chat_template.jinja", "run.yaml"} <= set(os.listdir(out))
    assert len(read_metrics(out)) == 2
    from transformers import AutoModelForImageTextToText

    model = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(built["model"]), str(out))
    base = AutoModelForImageTextToText.from_pretrained(built["model"])
    moved = model.base_model.model.model.connector.modules_to_save["default"].modality_projection.proj.weight
    assert not torch.equal(moved, base.model.connector.modality_projection.proj.weight)
    tower = model.base_model.model.model.vision_model.modules_to_save["default"]
    assert not torch.equal(tower.encoder.layers[0].mlp.fc1.weight,
                           base.model.vision_model.encoder.layers[0].mlp.fc1.weight)


def test_data_check_preview_and_estimate_count_image_tokens(built, capsys):
    from roctune.cli import main

    assert main(["data", "check", built["data"], "--model", built["model"], "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # a picture is 2 x 2 tiles and the whole picture, 4 tokens each, with their markers (<row_1_col_1> ...)
    assert report["images"]["images"] == 4 and report["images"]["tokens_per_image"]["min"] == 33
    assert main(["data", "preview", built["data"], "--model", built["model"], "--json"]) == 0
    preview = json.loads(capsys.readouterr().out)
    assert preview["images"][0]["tokens"] == 33 and any(s.get("image") == 0 for s in preview["segments"])
    assert main(["estimate", "--model", built["model"], "--device", "cpu", "--images", "3", "--max-length", "128",
                 "--json", "--train-vision-tower"]) == 0
    est = json.loads(capsys.readouterr().out)
    b = est["breakdown_bytes"]
    assert est["settings"]["tokens_per_image"] == 33 and b["vision_activations"] > 0
    # the CPU's heap holes beside the tower's activations as beside the language model's (roctune.memory.vision)
    from roctune.memory.estimate import CPU_HEAP_HOLES, CPU_PROCESS_BYTES

    holes = int(CPU_HEAP_HOLES * b["activations"]) + int(CPU_HEAP_HOLES * b["vision_activations"])
    assert est["settings"]["heap_holes"] and b["overhead"] == CPU_PROCESS_BYTES + holes


@pytest.mark.parametrize("argv,names", [
    (["--output", "{out}"], "--output {out}: already exists and is not empty"),
    (["--output", "{new}", "--vision", "{bad_json}"], "not valid JSON"),
    (["--output", "{new}", "--vision", "{unknown}"], "field 'depth' is not a vision tower setting"),
    (["--output", "{new}", "--vision", "{odd}"], "image_size 30 is not a multiple of patch_size 8"),
], ids=["existing-output", "bad-json", "unknown-field", "odd-size"])
def test_build_vlm_refusals_in_one_line(argv, names, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    (tmp_path / "bad.json").write_text("{nope")
    (tmp_path / "unknown.json").write_text(json.dumps({"depth": 2}))
    (tmp_path / "odd.json").write_text(json.dumps({"image_size": 30}))
    paths = {"out": "out", "new": "new", "bad_json": "bad.json", "unknown": "unknown.json", "odd": "odd.json"}
    refused(["models", "build-vlm"] + [a.format(**paths) for a in argv], capsys, names.format(**paths))


def test_estimate_refuses_images_a_text_model_or_a_length_cannot_hold(built, tiny_model_dir, tmp_path, monkeypatch,
                                                                       capsys):
    monkeypatch.chdir(tmp_path)
    refused(["estimate", "--model", tiny_model_dir, "--images", "2"], capsys, "is not a vision-language model")
    refused(["estimate", "--model", built["model"], "--images", "10", "--max-length", "64", "--device", "cpu"],
            capsys, "--max-length 64 cannot hold 10 image(s) of 33 tokens each")


def test_overwrite_replaces_a_vision_run(built, tmp_path):
    """A vision run's folder holds its processor's files, which are roctune's own: --overwrite replaces it."""
    from roctune.cli import main

    out = tmp_path / "run"
    argv = ["train", "--model", built["model"], "--data", built["data"], "--output", str(out), "--max-steps", "1",
            "--batch-size", "4", "--grad-accum", "1"]
    assert main(argv) == 0 and (out / "processor_config.json").is_file()
    assert main(argv + ["--overwrite"]) == 0 and len(read_metrics(out)) == 1
