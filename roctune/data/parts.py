"""Messages whose content is a list of parts (text and images), as vision-language chat templates read them.

A message's `content` is a string, or a list of parts: `{"type": "text", "text": ...}` and `{"type": "image",
"image": <RGB PIL image>}` (an image already checked at the border, roctune.data.image_input). Vision models' chat
templates (SmolVLM's, Qwen2.5-VL's, Gemma 3's, LLaVA's) render an image part as the model's image placeholder, which
the processor then expands into the image's tokens; SmolVLM's reads content only as parts (it iterates over it, so a
plain string's text would be lost), which `reads_only_parts` finds out by rendering a probe.
"""
from __future__ import annotations

from roctune.errors import DataError

PARTS_PROBE = "PARTS-PROBE"


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


def as_parts(message: dict) -> dict:
    """The message with its content as a list of parts (a string becomes one text part)."""
    content = message.get("content")
    if isinstance(content, list):
        return message
    return {**message, "content": [{"type": "text", "text": content or ""}]}


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
    return {**user, "content": [{"type": "text", "text": f"{text}\n\n"}] + as_parts(user)["content"]}


def reads_only_parts(render) -> bool:
    """Whether a chat template loses a string content's text (`render(messages)` renders with it): SmolVLM's."""
    try:
        return PARTS_PROBE not in render([{"role": "user", "content": PARTS_PROBE}])
    except Exception:  # noqa: BLE001 - a template that fails on a string content reads parts
        return True


def check_template_reads_images(messages: list[dict], template_text: str) -> None:
    """Images need a template that reads image parts: one that renders only strings would drop them."""
    if has_images(messages) and "image" not in template_text:
        raise DataError("this model's chat template renders text only (it never names an image part); images need "
                        "a vision model's template (SmolVLM, Qwen2.5-VL, Gemma 3, LLaVA)")
