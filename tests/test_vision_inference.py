"""Images at inference on a tiny SmolVLM-layout model (tests/vision_models.py) with a LoRA adapter on its language
model, vision tower and connector: the border every image crosses (one line per refusal), `chat --image`, the
merge (the merged folder loads in plain transformers with the adapter's logits) and the vLLM hand-off's refusal of
vision-side LoRA. Serving images is in test_serve_images.py, the GGUF + mmproj export in test_mmproj.py."""
from __future__ import annotations

import base64
import io
import struct
import zlib

import pytest

from vision_models import picture


def _png(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height pixels (its data is a few bytes: a decompression bomb's shape)."""
    chunk = lambda kind, data: (struct.pack(">I", len(data)) + kind + data  # noqa: E731
                                + struct.pack(">I", zlib.crc32(kind + data)))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def _url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@pytest.mark.parametrize("url, message", [
    ("http://example.com/cat.png", "a URL of scheme http: - nothing is fetched"),
    ("https://example.com/cat.png", "a URL of scheme https: - nothing is fetched"),
    ("file:///etc/passwd", "a URL of scheme file: - nothing is fetched"),
    ("/etc/passwd", "not a data URL - nothing is fetched"),
    ("data:text/plain;base64,aGk=", "a data URL must be data:image/TYPE;base64,DATA"),
    ("data:image/png,abc", "a data URL must be data:image/TYPE;base64,DATA"),
    ("data:image/png;base64,!!!!", "the data URL's base64 does not decode"),
    (_url(_png(64, 64)), "not a readable image"),
    (_url(b"hello"), "not an image (no format Pillow reads)"),
    (_url(_png(60000, 60000)), "the image declares more pixels than roctune reads (16,777,216)"),
    (_url(_png(7000, 7000)), "the image is 7000x7000 pixels, more than roctune reads (16,777,216 pixels)"),
    (_url(b"\0" * (21 << 20)), "the data URL holds more than 20.0 MiB"),
])
def test_a_servers_image_border_refuses_in_one_line(url, message):
    """What a server takes (data/images.read_data_url, under serve's limits): only data URLs, checked before a
    pixel is decoded."""
    from roctune.data.images import ImageLimits, read_data_url
    from roctune.errors import DataError

    with pytest.raises(DataError) as e:
        read_data_url(url, "messages[0].content[1].image_url.url", ImageLimits(20 << 20, 4096 * 4096))
    assert str(e.value).startswith("messages[0].content[1].image_url.url: ") and message in str(e.value)
    assert "\n" not in str(e.value)


def test_image_border_gives_the_pixels_back():
    from roctune.data.images import data_url, load, read_data_url

    img = picture()
    assert list(load(read_data_url(data_url(img), "x")).getdata()) == list(img.getdata())


@pytest.mark.parametrize("flag_value, message", [
    ("missing.png", "--image: image 'missing.png' not found"),
    ("notes.txt", "notes.txt: not an image (no format Pillow reads)"),
])
def test_chat_image_file_refused_before_loading(tmp_path, monkeypatch, capsys, vlm_lora_dir, flag_value, message):
    from roctune.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("not a picture")
    assert main(["chat", "--adapter", vlm_lora_dir, "--image", flag_value]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("value", ["large", 0, True])
def test_run_yaml_pixels_edited_to_a_non_number_is_one_line(tmp_path, capsys, vlm_lora_dir, tiny_vlm_dir, value):
    """A run.yaml whose image_max_pixels was edited to something that is not a positive whole number: chat --image
    refuses in one line naming the file and field, before any model loads (it was a ValueError's traceback)."""
    import shutil

    from roctune import rundir
    from roctune.cli import main

    run = str(tmp_path / "run")
    shutil.copytree(vlm_lora_dir, run)
    rundir.write_run(run, {"base_model": tiny_vlm_dir, "config": {"method": "lora", "image_max_pixels": value}})
    picture().save(tmp_path / "q.png")
    assert main(["chat", "--adapter", run, "--image", str(tmp_path / "q.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run.yaml: config.image_max_pixels is" in err[0] and "positive whole number" in err[0]


def test_chat_image_to_a_text_only_model_is_refused(tmp_path, capsys, tiny_model_dir):
    from roctune.cli import main

    picture().save(tmp_path / "q.png")
    assert main(["chat", "--model", tiny_model_dir, "--image", str(tmp_path / "q.png")]) == 2
    assert "is a text-only model (no vision tower in its config.json)" in capsys.readouterr().err


def test_chat_with_an_image_answers_as_generate_does(tmp_path, monkeypatch, capsys, vlm_lora_dir):
    """`chat --image` shows the picture with the first message and keeps it in the history; its streamed answer is
    generate()'s, and the picture changes the answer (the tuned vision tower sees it)."""
    from roctune.cli import main
    from roctune.generate import generate, load_for_inference

    picture().save(tmp_path / "q.png")
    monkeypatch.setattr("sys.stdin", io.StringIO("What colour?\n"))
    assert main(["chat", "--adapter", vlm_lora_dir, "--image", str(tmp_path / "q.png"), "--max-new-tokens", "6",
                 "--device", "cpu", "--dtype", "fp32"]) == 0
    said = capsys.readouterr().out.split("assistant> ")[1].splitlines()[0].strip()
    loaded = load_for_inference(vlm_lora_dir, device="cpu", dtype="fp32")
    parts = [{"type": "image", "image": picture()}, {"type": "text", "text": "What colour?"}]
    with_image, without = generate(loaded, [[{"role": "user", "content": parts}],
                                            [{"role": "user", "content": "What colour?"}]], max_new_tokens=6)
    assert said == with_image and with_image != without


def test_pictures_at_inference_are_scaled_as_the_run_trained_them(tmp_path, tiny_vlm_dir, vlm_lora_dir):
    """A run trained with --image-max-pixels / --image-min-pixels (run.yaml): `chat --image` and the web UI's border
    (open_image with the run's pixels), the server's border (the request budget of the adapter it asks for) and
    load_for_inference scale a 64 x 64 picture to 40 x 40, as training did; a run that does not say, the defaults; a
    whole-model run served as the base, its own bounds."""
    import shutil

    from roctune import rundir
    from roctune.data.images import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, data_url, open_image
    from roctune.generate import image_pixels, load_for_inference
    from roctune.serve import build_engine
    from roctune.serve.images import ImageSettings, budget_for, image_part

    run = str(tmp_path / "run")
    shutil.copytree(vlm_lora_dir, run)
    rundir.write_run(run, {"base_model": tiny_vlm_dir,
                           "config": {"method": "lora", "image_max_pixels": 40 * 40, "image_min_pixels": 16 * 16}})
    assert image_pixels(run) == (1600, 256)
    assert image_pixels(vlm_lora_dir) == image_pixels(None) == (DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS)
    picture().save(tmp_path / "q.png")
    assert open_image(str(tmp_path / "q.png"), "--image", pixels=image_pixels(run)).size == (40, 40)
    assert load_for_inference(run, device="cpu", dtype="fp32").image_pixels == (1600, 256)
    engine = build_engine(tiny_vlm_dir, [("tuned", run), ("plain", vlm_lora_dir)], device="cpu", dtype="fp32")
    part = {"type": "image_url", "image_url": {"url": data_url(picture())}}
    sizes = {name: image_part(part, "messages[0].content[0]", budget_for(ImageSettings(), name, engine, name))
             ["image"].size for name in ("tuned", "plain")}
    assert sizes == {"tuned": (40, 40), "plain": (64, 64)}
    whole = str(tmp_path / "whole")  # a run that trained the whole model, served as the base
    shutil.copytree(tiny_vlm_dir, whole)
    rundir.write_run(whole, {"base_model": tiny_vlm_dir, "config": {"method": "full", "image_max_pixels": 48 * 48}})
    engine = build_engine(whole, [], device="cpu", dtype="fp32")
    base = image_part(part, "messages[0].content[0]", budget_for(ImageSettings(), engine.base_id, engine, None))
    assert base["image"].size == (48, 48)


def test_merged_vlm_loads_in_plain_transformers_with_the_adapters_logits(tmp_path, tiny_vlm_dir, vlm_lora_dir):
    """roctune merge of LoRA on the language model, vision tower and connector: the folder loads with
    AutoModelForImageTextToText and AutoProcessor alone, and its logits on a picture prompt (rendered by the
    processor's own template) equal the adapter model's; without the adapter they do not."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from roctune.merge import merge

    out = str(tmp_path / "merged")
    report = merge(vlm_lora_dir, out, log=lambda *_: None)
    assert report["max_logit_diff"] < 1e-4
    processor = AutoProcessor.from_pretrained(out)
    merged = AutoModelForImageTextToText.from_pretrained(out).eval()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    enc = processor(text=[processor.apply_chat_template(messages, add_generation_prompt=True)],
                    images=[[picture("noise")]], return_tensors="pt")
    adapter = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir), vlm_lora_dir).eval()
    with torch.no_grad():
        got, want = merged(**enc).logits, adapter(**enc).logits
        with adapter.disable_adapter():
            base = adapter(**enc).logits
    assert (got - want).abs().max() < 1e-4
    assert (base - want).abs().max() > 0.1


def test_vllm_refuses_an_adapter_that_trained_the_vision_side(vlm_lora_dir, tiny_vlm_dir, tmp_path):
    import vision_models
    from roctune.errors import ConfigError
    from roctune.serve.vllm import check_adapter
    from roctune.vision import vision_row

    with pytest.raises(ConfigError, match=r"--adapter tuned: it trains the vision side \(model\.connector\.modality_"
                                          r"projection\.proj, .*vLLM applies LoRA to the language model only"):
        check_adapter("tuned", vlm_lora_dir, tiny_vlm_dir, "tiny", vision=vision_row(tiny_vlm_dir))
    text_only = vision_models.lora_adapter(tiny_vlm_dir, str(tmp_path / "text"), vision_models.TEXT_TARGETS)
    assert check_adapter("tuned", text_only, tiny_vlm_dir, "tiny", vision=vision_row(tiny_vlm_dir)).rank == 4
