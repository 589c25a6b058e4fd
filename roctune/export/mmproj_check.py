"""The check of a written mmproj: conversations with a picture run through the merged model (transformers) and
through the two GGUF files, and compared where the image matters.

With llama.cpp's multimodal library (the `gguf` extra) the language-model GGUF and the mmproj are loaded by llama.cpp
itself, which cuts the picture into tiles, encodes them with the mmproj and evaluates the conversation: the places
of the image tokens must be those the model's processor gives, each image token's embedding must match the one the
merged model feeds its language model, and the next-token distributions after the image (every position of the text
that follows it) must be within the language model's KL limit for its quant (verify.py). Without it, the mmproj's
tensors are read back by GGUF's reader, dequantized into a copy of the merged model, and the same comparison is
made through transformers: a lost, misnamed or transposed tower tensor changes the image embeddings either way.

The picture is a fixed one (images.probe_image), given to llama.cpp as raw pixels so no image decoder differs,
and the conversations are the run's own when its data has pictures, else a question about it with an answer.
"""
from __future__ import annotations

import os

import numpy as np

from roctune.errors import RoctuneError

EMBEDDING_LIMIT = 0.02  # largest |difference| of an image embedding, relative to the largest |value|: f16 ~ 1e-3
N_CONVERSATIONS = 3


def check_conversations(records: list[list[dict]] | None = None) -> list[list[dict]]:
    """Conversations with a picture: the run's (up to N_CONVERSATIONS), else a fixed question about the probe
    picture with an answer, so positions after the image are compared."""
    from roctune.data.images import probe_image
    from roctune.data.parts import has_images

    mine = [c for c in records or [] if has_images(c)][:N_CONVERSATIONS]
    if mine:
        return mine
    picture = {"type": "image", "image": probe_image()}
    return [[{"role": "user", "content": [picture, {"type": "text", "text": "What is in this picture?"}]},
             {"role": "assistant", "content": "Four squares: red, blue, yellow and green."}]]


def _image_token_id(cfg: dict) -> int:
    for key in ("image_token_id", "image_token_index"):
        if isinstance(cfg.get(key), int):
            return cfg[key]
    raise RoctuneError("the model's config.json names no image token (image_token_id); cannot check the mmproj")


def references(merged_dir: str, lay, conversations: list[list[dict]]) -> list[dict]:
    """The merged model on each conversation: its text (the template's image placeholder where each picture
    goes), pictures, token ids, logits at every position and the embeddings it gives its language model at the
    image tokens."""
    model, processor = _load(merged_dir)
    return [_reference(model, processor, lay, msgs) for msgs in conversations]


def _load(merged_dir: str):
    from roctune.generate import load_vision_model

    return load_vision_model(merged_dir, "fp32", "cpu", "sdpa", False)


def _reference(model, processor, lay, msgs: list[dict], model_for_embeddings=None) -> dict:
    import torch

    from roctune.data.parts import take_images
    from roctune.data.render import conversation_segments

    shaped, images = take_images(msgs)
    text = "".join(t for t, _ in conversation_segments(processor.tokenizer, shaped))
    enc = processor(text=[text], images=[images], return_tensors="pt", add_special_tokens=False)
    token = _image_token_id(model.config.to_dict())
    seen = {}
    text_model = model.get_submodule(lay.text_prefix.rstrip("."))

    def grab(_, args, kwargs):
        seen["embeds"] = kwargs.get("inputs_embeds")

    hook = text_model.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            logits = model(**enc).logits[0].float().numpy()
    finally:
        hook.remove()
    ids = enc["input_ids"][0].tolist()
    where = [i for i, t in enumerate(ids) if t == token]
    embeds = seen["embeds"][0, where].float().numpy() if seen.get("embeds") is not None else None
    return {"text": text, "images": images, "ids": ids, "logits": logits, "image_embeds": embeds, "token": token}


def _layout_ids(layout: list, token: int) -> list[int]:
    return [t for kind, x in layout for t in (x if kind == "text" else [token] * x)]


def by_llama_cpp(text_gguf: str, mmproj: str, refs: list[dict], placeholder: str) -> dict:
    """llama.cpp loads both files and evaluates each conversation (see the module docstring)."""
    from roctune.export import llamacpp, mtmd

    model = llamacpp.Model(text_gguf)
    vision = None
    try:
        vision = mtmd.Vision(model, mmproj)
        mark, pairs, worst = mtmd.marker(), [], 0.0
        for ref in refs:
            got = vision.run(ref["text"].replace(placeholder, mark), ref["images"])
            if _layout_ids(got["layout"], ref["token"]) != ref["ids"]:
                raise RoctuneError(f"llama.cpp places the image tokens of {os.path.basename(mmproj)} differently from "
                                   "the model's processor; not saved")
            worst = max(worst, _relative(ref["image_embeds"], np.concatenate(got["embeddings"])))
            pairs.append((ref["logits"][-len(got["logits"]):], got["logits"]))
    finally:
        if vision is not None:
            vision.close()
        model.close()
    return _figures("llama.cpp", pairs, worst)


def by_transformers(merged_dir: str, mmproj: str, refs: list[dict], lay, conversations: list[list[dict]]) -> dict:
    """Without llama.cpp: the mmproj's tensors, read back and dequantized, replace the merged model's vision tower
    and projector; the same conversations are compared (the language model is checked by verify.py)."""
    from roctune.export.mmproj import load_into

    model, processor = _load(merged_dir)
    load_into(model, mmproj, merged_dir)
    pairs, worst = [], 0.0
    for ref, msgs in zip(refs, conversations):
        got = _reference(model, processor, lay, msgs)
        worst = max(worst, _relative(ref["image_embeds"], got["image_embeds"]))
        after = max(i for i, t in enumerate(ref["ids"]) if t == ref["token"]) + 1
        pairs.append((ref["logits"][after:], got["logits"][after:]))
    return _figures("transformers (mmproj read back)", pairs, worst)


def _relative(ref, got) -> float:
    if ref is None or got is None or np.shape(ref) != np.shape(got):
        raise RoctuneError(f"the mmproj gives {np.shape(got)[0] if got is not None else 0} image embeddings where "
                           f"the merged model has {np.shape(ref)[0] if ref is not None else 0}; not saved")
    return float(np.abs(np.asarray(ref) - np.asarray(got)).max() / max(float(np.abs(ref).max()), 1e-9))


def _figures(by: str, pairs: list, worst: float) -> dict:
    from roctune.export.verify import divergence

    kl, same = [], []
    for ref, got in pairs:
        k, s = divergence(ref, got)
        kl += k
        same += s
    return {"checked_by": by, "conversations": len(pairs), "positions": len(kl),
            "mean_kl": round(float(np.mean(kl)), 6), "same_top": round(float(np.mean(same)), 4),
            "max_rel_image_embedding_diff": round(worst, 6)}


def judge(report: dict, kl_limit: float, name: str) -> None:
    """Raise when the image embeddings or the distributions after the image are off."""
    if not report["max_rel_image_embedding_diff"] <= EMBEDDING_LIMIT:
        raise RoctuneError(f"{name}: the image embeddings differ from the merged model's by "
                           f"{100 * report['max_rel_image_embedding_diff']:.2g}% (> {100 * EMBEDDING_LIMIT:g}%, in "
                           f"{report['checked_by']}); not saved")
    if not report["mean_kl"] <= kl_limit:
        raise RoctuneError(f"{name}: after the image the next-token distributions differ from the merged model's by "
                           f"a mean KL divergence of {report['mean_kl']:.3g} (> {kl_limit:g}, in "
                           f"{report['checked_by']}); not saved")


def summary(report: dict) -> str:
    return (f"mmproj check ({report['conversations']} conversation(s) with a picture, run by "
            f"{report['checked_by']}): image embeddings within {100 * report['max_rel_image_embedding_diff']:.2g}% "
            f"of the merged model's, mean KL divergence after the image {report['mean_kl']:.3g} over "
            f"{report['positions']} positions, same top token at {100 * report['same_top']:.1f}%")
