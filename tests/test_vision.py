"""Vision-language models (issue 48): every vision row of roctune's family table on a tiny model of its layout
(tests/vision_models.py), against plain transformers + PEFT fed by the model's own processor:
- one LoRA step: the same token ids as the processor makes, labels -100 on every image and prompt token, the loss
  and the LoRA gradients equal (within 1e-5), and no gradient in the frozen parts (tower, projector, base weights);
- --train-vision-tower / --train-projector: those parts get gradients (LoRA on the tower, the projector whole);
- packing with images (Qwen2.5-VL's 3-D positions, SmolVLM's tiles): the loss of the packed row equals the
  unpacked batch's;
- truncation never hands the model an image whose tokens were cut.
The data refusals (a missing image, a count of <image> tags that differs, images for a text model, ...) are in
tests/test_vision_data.py."""
from __future__ import annotations

import json
import re

import pytest
import torch

import vision_models
from conftest import write_jsonl
from test_families import _randomize_lora_b, _worst  # the text matrix's: lora_B drawn, relative gradient difference

FAMILIES = list(vision_models.SPECS)
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}


@pytest.fixture(scope="session")
def vlm_dir(tmp_path_factory, default_model_dir):
    """family -> the folder of its tiny model, built once per session."""
    built: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in built:
            built[family] = vision_models.build(family, str(tmp_path_factory.mktemp(f"vlm-{family}")),
                                                default_model_dir)
        return built[family]
    return get


def _image(path, size, colour):
    from PIL import Image

    Image.new("RGB", size, COLOURS[colour]).save(path)
    return path.name


@pytest.fixture(scope="module")
def image_data(tmp_path_factory):
    """Three conversations with images in three layouts (an images column with <image> tags, OpenAI content parts
    with a path and with a data URL), two images in one of them; sizes between the pixel bounds (no rescale)."""
    import base64

    folder = tmp_path_factory.mktemp("vision-data")
    red = _image(folder / "red.png", (48, 40), "red")
    blue = _image(folder / "blue.png", (36, 64), "blue")
    _image(folder / "g.png", (40, 40), "green")
    green = base64.b64encode((folder / "g.png").read_bytes())
    rows = [
        {"messages": [{"role": "user", "content": "<image>What colour is this?"},
                      {"role": "assistant", "content": "Red."}], "images": [red]},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": blue}, {"type": "text", "text": "And "},
                                                    {"type": "image_url", "image_url": {"url": red}},
                                                    {"type": "text", "text": "these two?"}]},
                      {"role": "assistant", "content": "Blue, then red."}]},
        {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + green.decode()}},
            {"type": "text", "text": "Colour?"}]}, {"role": "assistant", "content": "Green."}]},
    ]
    return {"file": write_jsonl(folder / "train.jsonl", rows), "folder": folder}


def test_every_vision_row_of_the_table_has_a_tiny_model_and_only_those():
    from roctune.config.vision import MAX_PIXELS, MIN_PIXELS
    from roctune.data.images import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS
    from roctune.families import VISION_FAMILIES

    assert FAMILIES == [f.name for f in VISION_FAMILIES]
    assert all(f.vision is not None for f in VISION_FAMILIES)
    assert (MAX_PIXELS, MIN_PIXELS) == (DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS)  # declared in two layers


# ------------------------------------------------------------------------------------------ roctune's side
def _roctune(model_dir, data_file, tmp_path, **flags):
    """The model, batch and output head as `roctune train` builds them (prepare's checks, session.choose, the
    processor, tokenization with images, build_trainable, the vision collate)."""
    from roctune import methods, vision
    from roctune.config import TrainConfig
    from roctune.data.image_tokens import tokenize_image_records
    from roctune.data.records import load_records
    from roctune.training import session, vision_batch

    cfg = TrainConfig(data=[data_file], output=str(tmp_path / "unused"), model=model_dir, lora_r=4, lora_alpha=8,
                      lora_dropout=0.0, device="cpu", seed=0, **flags).validate()
    records = load_records([data_file])
    methods.check(cfg, model_dir)
    setup = session.choose(cfg, model_dir)
    setup.vision = vision.load_image_text(model_dir)
    items, dropped = tokenize_image_records(setup.vision, records, cfg.max_length)
    assert not dropped
    lines: list[str] = []
    torch.manual_seed(0)
    model, plan = session.build_trainable(cfg, setup, model_dir, lines.append)
    collate = vision_batch.collator(model, setup.vision)
    return cfg, setup, items, model, plan, collate, lines


def _plain(model_dir, data_file, folder, like, row, **lora):
    """transformers + PEFT as their docs do it: the processor on each whole conversation (its chat template, the
    images as PIL images), labels -100 up to the end of the prompt and on padding, LoRA on the language model's
    attention; `like`'s trainable weights copied in."""
    from peft import LoraConfig, get_peft_model
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    from roctune.vision import processor_class

    proc = processor_class(row.processor).from_pretrained(model_dir)
    proc.tokenizer.padding_side = "right"
    texts, prompts, images = [], [], []
    for line in open(data_file, encoding="utf-8"):
        rec = json.loads(line)
        conv, pics = _openai_parts(rec, folder)
        texts.append(proc.tokenizer.apply_chat_template(conv, tokenize=False))
        prompts.append(proc.tokenizer.apply_chat_template(conv[:-1], tokenize=False, add_generation_prompt=True))
        images.append([Image.open(p).convert("RGB") for p in pics])
    inputs = proc(text=texts, images=images, padding=True, return_tensors="pt")
    labels = inputs["input_ids"].clone()
    for i, (prompt, pics) in enumerate(zip(prompts, images)):
        labels[i, :len(proc(text=[prompt], images=[pics])["input_ids"][0])] = -100
    labels[inputs["attention_mask"] == 0] = -100
    targets = lora.pop("target_modules", rf"{re.escape(row.language_model)}\..*\.(q_proj|k_proj|v_proj|o_proj)")
    model = get_peft_model(AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets, **lora))
    mine = dict(like.named_parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(mine[name])
    return model, inputs, labels


def _openai_parts(rec, folder):
    """A record of `image_data` as chat-template messages with image parts, and its images' files in order."""
    import base64
    import io

    pics, conv = [], []
    tagged = iter(rec.get("images", []))
    for m in rec["messages"]:
        parts = []
        if isinstance(m["content"], str):
            for j, piece in enumerate(m["content"].split("<image>")):
                if j:
                    parts.append({"type": "image"})
                    pics.append(folder / next(tagged))
                if piece:
                    parts.append({"type": "text", "text": piece})
        else:
            for part in m["content"]:
                if part["type"] == "text":
                    parts.append(part)
                    continue
                url = part["image"] if part["type"] == "image" else part["image_url"]["url"]
                pics.append(io.BytesIO(base64.b64decode(url.split(",", 1)[1])) if url.startswith("data:")
                            else folder / url)
                parts.append({"type": "image"})
        conv.append({"role": m["role"], "content": parts})
    return conv, pics


def _grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return float(loss.detach()), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_step_equals_plain_peft_fed_by_the_processor(family, vlm_dir, image_data, tmp_path):
    from roctune.families import family_of
    from roctune.training.losses import token_loss_sum
    from roctune.vision import part_of

    folder = vlm_dir(family)
    row = family_of(json.load(open(f"{folder}/config.json"))["model_type"]).vision
    cfg, setup, items, mine, plan, collate, lines = _roctune(folder, image_data["file"], tmp_path)
    plain, inputs, labels = _plain(folder, image_data["file"], image_data["folder"], mine, row)
    # the processor's own tokens and label mask: images and prompts -100, spans where the image tokens are
    for i, item in enumerate(items):
        n = len(item.input_ids)
        assert item.input_ids == inputs["input_ids"][i, :n].tolist(), family
        assert item.labels == labels[i, :n].tolist(), family
        assert len(item.spans) == len(item.images) == (2 if i == 1 else 1)
        assert all(item.labels[a:b] == [-100] * (b - a) for a, b in item.spans)
    assert plan.family.name == family and plan.head is not None
    _randomize_lora_b(mine, plain)
    mine.train(), plain.train()
    batch = collate(items, setup.vision.tokenizer.pad_token_id, False, "cpu")
    n = int((batch.labels[:, 1:] != -100).sum())
    loss_a, grads_a = _grads(mine, token_loss_sum(mine, batch, plan.head) / n)
    loss_b, grads_b = _grads(plain, plain(**inputs, labels=labels).loss)
    assert abs(loss_a - loss_b) < 1e-5, (family, loss_a, loss_b)
    assert _worst(grads_a, grads_b) < 1e-5, family
    assert grads_a and all(".lora_" in k and part_of(k, row) == "language" for k in grads_a)
    frozen = [(k, p) for k, p in mine.named_parameters() if part_of(k, row) != "language" or ".lora_" not in k]
    assert frozen and all(not p.requires_grad and p.grad is None for _, p in frozen)
    assert any(line.startswith("vision model: tower frozen") and "projector frozen" in line for line in lines), lines


# ------------------------------------------------------------------------------------------------ packing
@pytest.mark.parametrize("family", ["qwen2_5_vl", "smolvlm"])
def test_packed_rows_with_images_have_the_unpacked_loss(family, vlm_dir, image_data, tmp_path):
    """One packed row (positions restarting per example; Qwen2.5-VL's 3-D positions per example, from the model,
    under a row of text positions that transformers builds the block-diagonal mask from) against the right-padded
    batch of the same examples: the same loss and LoRA gradients. (Without the text row the loss differs by 5e-3.)"""
    from roctune.training.losses import token_loss_sum

    cfg, setup, items, model, plan, collate, _ = _roctune(vlm_dir(family), image_data["file"], tmp_path)
    _randomize_lora_b(model)
    pad = setup.vision.tokenizer.pad_token_id
    padded, packed = collate(items, pad, False, "cpu"), collate(items, pad, True, "cpu")
    assert packed.input_ids.shape[0] == 1 and packed.n_supervised == padded.n_supervised
    if family == "qwen2_5_vl":
        assert packed.position_ids.shape == (4, 1, packed.input_ids.shape[1])  # text row + 3-D rows
        assert int(packed.position_ids[0].max()) < max(len(e.input_ids) for e in items)  # restarts per example
    loss_a, grads_a = _grads(model, token_loss_sum(model, padded, plan.head) / padded.n_supervised)
    loss_b, grads_b = _grads(model, token_loss_sum(model, packed, plan.head) / packed.n_supervised)
    assert abs(loss_a - loss_b) < 1e-5, (family, loss_a, loss_b)
    assert _worst(grads_b, grads_a) < 1e-4, family


# --------------------------------------------------------------------------------------------- truncation
def test_truncation_never_hands_the_model_a_cut_image(vlm_dir, image_data, tmp_path):
    """A conversation whose image span crosses --max-length: right truncation keeps the first exchange without the
    image, left keeps the last answer without it; split refuses an image longer than its window, naming the line.
    Every kept example's image tokens are exactly its kept images' (the model takes the batch)."""
    from roctune.data.image_tokens import tokenize_image_conversation, tokenize_image_records
    from roctune.data.records import load_records
    from roctune.data.render import RenderOptions
    from roctune.errors import DataError
    from roctune.training.losses import token_loss_sum

    folder = image_data["folder"]
    rows = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."},
                          {"role": "user", "content": "<image>What colour is this?"},
                          {"role": "assistant", "content": "Red."}], "images": ["red.png"]}]
    data = write_jsonl(folder / "long.jsonl", rows)
    cfg, setup, _, model, plan, collate, _ = _roctune(vlm_dir("smolvlm"), data, tmp_path)
    it = setup.vision
    [record] = load_records(data)
    ids, labels, [(a, b)] = tokenize_image_conversation(it, record.messages, record.images)
    assert b - a > 8 and labels[a:b] == [-100] * (b - a)
    cut = (a + b) // 2  # inside the image's span
    for how, keep_answer in (("right", "Hello there."), ("left", "Red.")):
        items, dropped = tokenize_image_records(it, [record], cut if how == "right" else len(ids) - cut,
                                                RenderOptions(truncation=how))
        assert not dropped and len(items) == 1, how
        [item] = items
        assert not item.images and not item.spans  # the image left with its tokens
        assert it.processor.image_token_id not in item.input_ids, how
        learned = it.tokenizer.decode([t for t in item.labels if t != -100])
        assert keep_answer in learned, (how, learned)
        batch = collate(items, it.tokenizer.pad_token_id, False, "cpu")
        token_loss_sum(model, batch, plan.head).backward()  # the model takes it: no image tokens without features
    whole, _ = tokenize_image_records(it, [record], len(ids))
    assert len(whole[0].images) == 1 and whole[0].spans == [(a, b)]
    with pytest.raises(DataError, match=r"long.jsonl:1: an image of \d+ tokens does not fit a --max-length 8"):
        tokenize_image_records(it, [record], 8, RenderOptions(truncation="split"))


def test_trained_tower_and_projector_equal_plain_peft_and_deepstack_follows_the_projector(vlm_dir, image_data,
                                                                                          tmp_path):
    """Qwen3-VL with --vision-tower-lora --train-projector: LoRA on every linear layer of the tower (never on the
    mergers), the merger and the DeepStack mergers trained whole (LLaMA-Factory PR 9399's bug was the reverse: those
    mergers trainable under a frozen tower); the step equals plain PEFT's with the same modules. With
    --train-vision-tower alone the tower trains whole and the mergers stay frozen."""
    import torch.nn as nn

    from roctune.families import family_of
    from roctune.training.losses import token_loss_sum
    from roctune import vision
    from roctune.vision import lora_pattern, part_of, projector_modules

    folder = vlm_dir("qwen3_vl")
    row = family_of("qwen3_vl").vision
    _, _, _, whole, _, _, _ = _roctune(folder, image_data["file"], tmp_path, train_vision_tower=True)
    trains = {n.replace(".modules_to_save.default", "") for n, p in whole.named_parameters() if p.requires_grad}
    assert {part_of(n, row) for n in trains if ".lora_" not in n} == {"tower"} and not any("merger" in n for n in trains)
    assert any(".blocks.1.mlp.linear_fc1." in n for n in trains) and any(".patch_embed." in n for n in trains)
    _, setup, items, mine, plan, collate, lines = _roctune(folder, image_data["file"], tmp_path,
                                                           vision_tower_lora=True, train_projector=True)
    base = mine.get_base_model()
    lora = {n.rsplit(".lora_A", 1)[0] for n, _ in mine.named_parameters() if ".lora_A." in n}
    tower_linears = {f"base_model.model.{n.removesuffix('.base_layer')}" for n, m in base.named_modules()
                     if isinstance(m, nn.Linear) and part_of(n, row) == "tower" and "lora_" not in n}
    assert tower_linears and tower_linears <= lora
    assert not any("merger" in n for n in lora)
    trained = {n for n, p in mine.named_parameters() if p.requires_grad and ".lora_" not in n}
    assert any("deepstack_merger_list" in n for n in trained) and any(".merger." in n for n in trained)
    assert all(part_of(n.replace(".modules_to_save.default", ""), row) == "projector" for n in trained)
    assert any("tower trains" in line and "projector trains" in line for line in lines), lines
    conf = mine.peft_config["default"]  # the same modules for plain PEFT: roctune's pattern, checked above
    assert conf.target_modules == lora_pattern(vision.meta_model(folder), row, ["q_proj", "k_proj", "v_proj", "o_proj"],
                                               tower=True)
    plain, inputs, labels = _plain(folder, image_data["file"], image_data["folder"], mine, row,
                                   target_modules=conf.target_modules, modules_to_save=projector_modules(base, row))
    _randomize_lora_b(mine, plain)
    batch = collate(items, setup.vision.tokenizer.pad_token_id, False, "cpu")
    loss_a, grads_a = _grads(mine, token_loss_sum(mine, batch, plan.head) / batch.n_supervised)
    loss_b, grads_b = _grads(plain, plain(**inputs, labels=labels).loss)
    assert abs(loss_a - loss_b) < 1e-5
    assert _worst(grads_a, grads_b) < 1e-5


@pytest.mark.parametrize("method,flags", [("freeze", {}), ("full", {"train_projector": True}), ("qlora", {})])
def test_freeze_full_and_qlora_act_on_the_language_model(method, flags, vlm_dir, image_data, tmp_path):
    """freeze picks the language model's last layers (never the tower's, although it has as many); full trains the
    language model whole, the tower frozen and the projector as asked; qlora quantizes the language model only. One
    step each moves only what trains."""
    from roctune.families import family_of
    from roctune.training.losses import token_loss_sum
    from roctune.vision import part_of

    row = family_of("smolvlm").vision
    cfg, setup, items, model, plan, collate, lines = _roctune(vlm_dir("smolvlm"), image_data["file"], tmp_path,
                                                              method=method, freeze_trainable_layers=1, **flags)
    trains = {n for n, p in model.named_parameters() if p.requires_grad}
    parts = {part_of(n, row) for n in trains}
    if method == "freeze":
        assert trains and all(n.startswith("model.text_model.layers.1.") for n in trains), sorted(trains)[:3]
    elif method == "full":
        assert parts == {"language", "projector"} and "lm_head.weight" in trains | {"lm_head.weight"}
    else:
        assert parts == {"language"} and all(".lora_" in n for n in trains)
        quantized = {n for n, m in model.named_modules() if type(m).__name__ == "Linear4bit"}
        assert quantized and all(part_of(n, row) == "language" for n in quantized)
    batch = collate(items, setup.vision.tokenizer.pad_token_id, False, "cpu")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    token_loss_sum(model, batch, plan.head).backward()
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1).step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert moved and moved <= trains
