"""Messages whose content is a list of parts (text and images), as vision-language chat templates read them.

A message's `content` is a string, or a list of parts: `{"type": "text", "text": ...}` and `{"type": "image",
"image": <RGB PIL image>}` (an image already checked at the border, roctune.data.images). Vision models' chat
templates (SmolVLM's, Qwen2.5-VL's, Gemma 3's, LLaVA's) render an image part as the model's image placeholder, which
the processor then expands into the image's tokens. SmolVLM's reads content only as parts (it iterates over it, so a
plain string's text would be lost): a vision model's tokenizer is marked to take string contents as parts
(roctune.vision.load_image_text for training, generate.load_vision_model at inference; data/render.py converts).
"""
from __future__ import annotations

from roctune.errors import DataError


def has_images(messages: list[dict]) -> bool:
    return any(isinstance(m.get("content"), list) and any(p.get("type") == "image" for p in m["content"])
               for m in messages)


def count_images(messages: list[dict]) -> int:
    return sum(1 for m in messages if isinstance(m.get("content"), list)
               for p in m["content"] if p.get("type") == "image")


def text_of(content) -> str:
    """The text of a content (its text parts joined), for showing a prompt."""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if p.get("type") == "text")


def take_images(messages: list[dict]) -> tuple[list[dict], list]:
    """The messages with every image part replaced by a bare `{"type": "image"}` (what a template renders) and the
    images in the order they appear, as the processor takes them."""
    out, images = [], []
    for m in messages:
        if isinstance(m.get("content"), list):
            parts = []
            for p in m["content"]:
                if p.get("type") == "image":
                    images.append(p["image"])
                    parts.append({"type": "image"})
                else:
                    parts.append(p)
            m = {**m, "content": parts}
        out.append(m)
    return out, images


def fold_system_parts(system: dict, user: dict) -> dict:
    """A system turn's text put before a user turn whose content is parts (for templates without a system role)."""
    text = text_of(system["content"])
    if not text.strip():
        return user
    content = user["content"] if isinstance(user["content"], list) else [{"type": "text", "text": user["content"]}]
    return {**user, "content": [{"type": "text", "text": f"{text}\n\n"}] + content}


def check_template_reads_images(messages: list[dict], template_text: str) -> None:
    """Images need a template that reads image parts: one that renders only strings would drop them."""
    if has_images(messages) and "image" not in template_text:
        raise DataError("this model's chat template renders text only (it never names an image part); images need "
                        "a vision model's template (SmolVLM, Qwen2.5-VL, Gemma 3, LLaVA)")
