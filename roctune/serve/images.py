"""Images in chat requests: OpenAI's `image_url` content parts, taken only as `data:` URLs and checked at the border
(roctune.data.images: the encoded size before decoding, the format, the pixel count from the header before a
pixel is decoded) into the content parts the renderer takes. The server fetches nothing: an http(s), file or any
other URL is a 400 naming the part. A request's images are limited in number and in total pixels (--max-images,
--max-image-pixels), so one request cannot hold the engine with pictures; an image sent to a text-only model is a
400 too, before anything is decoded."""

from dataclasses import dataclass, field

from roctune.data.images import DEFAULT_MAX_PIXELS as FIT_MAX_PIXELS, DEFAULT_MIN_PIXELS as FIT_MIN_PIXELS
from roctune.data.images import MAX_IMAGE_BYTES, ImageLimits
from roctune.serve.errors import bad_field

DEFAULT_MAX_IMAGES = 8
DEFAULT_MAX_PIXELS = 4096 * 4096


@dataclass
class ImageSettings:
    """How many images a request may hold and how large each may be (--max-images, --max-image-pixels)."""

    max_images: int = DEFAULT_MAX_IMAGES
    limits: ImageLimits = field(default_factory=lambda: ImageLimits(MAX_IMAGE_BYTES, DEFAULT_MAX_PIXELS))


@dataclass
class Budget:
    """What one request has used of its image allowance; `pixels`: the (max, min) its model's run scaled pictures
    to in training (roctune.generate.image_pixels), which its pictures are scaled to."""

    settings: ImageSettings | None
    model: str
    images: int = 0
    pixels: tuple[int, int] = (FIT_MAX_PIXELS, FIT_MIN_PIXELS)


def budget_for(settings: ImageSettings | None, model: str, engine, adapter: str | None) -> Budget:
    """A request's image budget: its pictures scaled as the run behind `adapter` trained (engine.image_pixels),
    where the model takes images (`settings` not None)."""
    if settings is None:
        return Budget(None, model)
    return Budget(settings, model, pixels=engine.image_pixels(adapter))


def is_image_part(part) -> bool:
    return isinstance(part, dict) and part.get("type") in ("image_url", "input_image", "image")


def image_part(part: dict, where: str, budget: Budget) -> dict:
    """One image content part as the renderer's `{"type": "image", "image": <RGB image>}`; a 400 naming `where`
    for anything the server does not take."""
    from roctune.data.images import load, read_data_url
    from roctune.errors import DataError

    if budget.settings is None:
        raise bad_field("messages", f"field '{where}': model {budget.model!r} is text-only (no vision tower); send "
                        "text parts only, or serve a vision-language model", code="images_unsupported")
    if part.get("type") != "image_url":
        raise bad_field("messages", f"field '{where}': part type {part.get('type')!r}; send images as "
                        "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,...\"}}")
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str) or not url:
        raise bad_field("messages", f"field '{where}.image_url.url' must be a data: URL string")
    if isinstance(spec, dict) and spec.get("detail") not in (None, "auto", "low", "high"):
        raise bad_field("messages", f"field '{where}.image_url.detail' must be auto, low or high")
    budget.images += 1
    if budget.images > budget.settings.max_images:
        raise bad_field("messages", f"field '{where}': the request holds more than {budget.settings.max_images} "
                        "images (--max-images)", code="too_many_images")
    try:
        ref = read_data_url(url, f"{where}.image_url.url", budget.settings.limits)
        return {"type": "image", "image": load(ref, *budget.pixels)}
    except DataError as e:
        raise bad_field("messages", f"field {e}", code="invalid_image") from None
