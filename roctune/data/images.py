"""Images in the data: the border where a picture from outside becomes a checked, typed value (`ImageRef`).

An image comes into a record three ways (roctune.data.formats, .sources): an OpenAI content part
(`{"type": "image_url", "image_url": {"url": ...}}` with a `data:` URL or a path, or `{"type": "image", "image":
path}`), or an `images` column (LLaMA-Factory's multimodal layout) whose entries the turns place with `<image>` tags.
Inside roctune a turn's text holds IMAGE_MARKER where each image goes and the record carries the images in order,
so the rest of the text code (templates, reasoning, tools) handles strings as before.

Checked here, before any model loads, each failure one line naming the file, line and field:
- a path (relative to the data file's folder; absolute, or a `file://` URL) must be a regular file (never a pipe or
  device, which would block) of at most MAX_IMAGE_BYTES; a `data:` URL's base64 must decode strictly and to at most
  that many bytes (the length is checked before decoding); other URL schemes (http, ...) are refused: roctune
  fetches nothing;
- the picture's size is read from its header and refused above MAX_IMAGE_PIXELS before a pixel is decoded (a small
  PNG can declare 100,000 x 100,000 pixels: a decompression bomb), then it is decoded whole, so a truncated or
  damaged file is found now and not in the middle of training.
Pillow does the decoding (the only image library transformers' PIL image processors need; no torchvision).

At inference (chat --image, a data URL in a server request, a web upload) the same checks apply, under limits the
caller may tighten (`ImageLimits`: serve's --max-image-pixels); a server takes only data URLs (`read_data_url`).

`fit_size` / `load` apply --image-max-pixels and --image-min-pixels (LLaMA-Factory's names and defaults: the image
is scaled, keeping its aspect ratio, to at most 768x768 and at least 32x32 pixels' worth) before the model's image
processor sees it, so the size, and with it every image's token count, is known from the header alone.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import math
import os
import re
import stat
import io
from dataclasses import dataclass, field

from roctune.errors import DataError

IMAGE_MARKER = "<image>"  # where an image goes in a turn's text (LLaMA-Factory's tag)
MAX_IMAGE_BYTES = 32 << 20  # one image file or data URL, encoded
MAX_IMAGE_PIXELS = 8192 * 8192  # width x height, from the header, before decoding
MAX_IMAGES_PER_RECORD = 64
DEFAULT_MAX_PIXELS = 768 * 768  # --image-max-pixels
DEFAULT_MIN_PIXELS = 32 * 32  # --image-min-pixels
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")  # what vision processors read: Pillow tries no other decoder
_DATA_URL = re.compile(r"^data:(?P<mime>image/[\w.+-]+)?(?P<params>(;[\w=.+-]+)*);base64,(?P<data>.*)$", re.S)


@dataclass(frozen=True)
class ImageLimits:
    """How large one image may be: its bytes (encoded) and its pixels (from the header, before decoding)."""

    max_bytes: int
    max_pixels: int


def default_limits() -> ImageLimits:
    """MAX_IMAGE_BYTES and MAX_IMAGE_PIXELS, read when an image is checked."""
    return ImageLimits(MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS)


@dataclass(frozen=True)
class ImageRef:
    """A checked image: where it came from (for messages), its file or bytes, and its size from the header."""

    source: str  # the path as resolved, or "data URL (N bytes)"
    width: int
    height: int
    format: str  # PNG, JPEG, ... (Pillow's name)
    path: str | None = None
    data: bytes | None = field(default=None, repr=False)
    digest: bytes = field(default=b"", repr=False, compare=False)  # of the bytes read when it was checked

    @property
    def nbytes(self) -> int:
        return len(self.data) if self.data is not None else os.path.getsize(self.path)

    def content_hash(self) -> int:
        """A hash of the image's bytes, taken when they were read to be checked (a file is not read again), so
        duplicate checks see two records with one question and different pictures as different (and one picture
        under two paths, or as a file and a data URL, as the same)."""
        if self.digest:
            return hash(self.digest)
        if self.data is not None:
            return hash(_digest(self.data))
        try:  # a reference made without reading its file (read_image takes the digest as it checks)
            with open(self.path, "rb") as f:
                return hash(_digest(f.read()))
        except OSError as e:
            raise DataError(f"{self.source}: {e.strerror}") from None


def _digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


def _pil():
    try:
        from PIL import Image
    except ImportError:  # pillow comes with transformers' vision extra; roctune's `vision` extra lists it
        raise DataError("images in the data need Pillow: pip install pillow") from None
    return Image


def _check_decoded(opened, where: str, limits: ImageLimits) -> tuple[int, int, str]:
    """(width, height, format) of an opened image after its pixel count is checked and it decodes whole."""
    width, height = opened.size
    if width < 1 or height < 1:
        raise DataError(f"{where}: the image has no pixels ({width}x{height}); give a real picture")
    if width * height > limits.max_pixels:
        raise DataError(f"{where}: the image is {width}x{height} pixels, more than roctune reads "
                        f"({limits.max_pixels:,} pixels); scale it down first")
    opened.load()  # every pixel decodes: a truncated or damaged file is refused now, not during training
    return width, height, str(opened.format or "?")


def _open(file_or_bytes, where: str, limits: ImageLimits) -> tuple[int, int, str]:
    import warnings

    Image = _pil()
    source = io.BytesIO(file_or_bytes) if isinstance(file_or_bytes, bytes) else file_or_bytes
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source, formats=FORMATS) as opened:
                return _check_decoded(opened, where, limits)
    except DataError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise DataError(f"{where}: the image declares more pixels than roctune reads ({limits.max_pixels:,}); "
                        "scale it down first") from None
    except Image.UnidentifiedImageError:
        raise DataError(f"{where}: not an image (no format Pillow reads); give a PNG, JPEG, WebP, GIF or BMP "
                        "file") from None
    except (OSError, ValueError, SyntaxError, EOFError, MemoryError) as e:
        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise DataError(f"{where}: not a readable image ({reason}); give a PNG, JPEG, WebP, GIF or BMP file") from None


def _size(n: int) -> str:
    return f"{n / 2 ** 20:.1f} MiB" if n >= 2 ** 20 else f"{n:,} bytes"


def _from_data_url(url: str, where: str, limits: ImageLimits) -> ImageRef:
    m = _DATA_URL.match(url[:200] + url[200:].strip())
    if not m:
        raise DataError(f"{where}: a data URL must be data:image/TYPE;base64,DATA; this one is not")
    data = m["data"]
    if len(data) * 3 // 4 > limits.max_bytes:
        raise DataError(f"{where}: the data URL holds more than {_size(limits.max_bytes)}; give a smaller image")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise DataError(f"{where}: the data URL's base64 does not decode; encode the image again") from None
    width, height, fmt = _open(raw, where, limits)
    return ImageRef(f"data URL ({len(raw)} bytes)", width, height, fmt, data=raw, digest=_digest(raw))


def _resolve_path(value: str, roots: list[str], where: str) -> str:
    path = os.path.expanduser(value[len("file://"):] if value.startswith("file://") else value)
    candidates = [path] if os.path.isabs(path) else [os.path.join(root, path) for root in roots]
    for candidate in candidates:
        if os.path.lexists(candidate):
            return candidate
    shown = candidates[0] if candidates else path
    raise DataError(f"{where}: image {value!r} not found (looked for {shown}); paths are relative to the data "
                    "file's folder")


def _from_path(value: str, roots: list[str], where: str, limits: ImageLimits) -> ImageRef:
    path = _resolve_path(value, roots, where)
    try:
        info = os.stat(path)
    except OSError as e:
        raise DataError(f"{where}: image {path}: {e.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise DataError(f"{where}: image {path} is not a regular file (a folder, pipe or device); give an image file")
    if info.st_size > limits.max_bytes:
        raise DataError(f"{where}: image {path} is {_size(info.st_size)}, more than roctune reads "
                        f"({_size(limits.max_bytes)}); compress or scale it down")
    try:
        with open(path, "rb") as f:
            raw = f.read(limits.max_bytes + 1)  # read once: decoded here and hashed for the duplicate checks
    except OSError as e:
        why = "permission denied" if isinstance(e, PermissionError) else e.strerror or type(e).__name__
        raise DataError(f"{where}: image {path} cannot be read ({why})") from None
    if len(raw) > limits.max_bytes:  # it grew after the size check
        raise DataError(f"{where}: image {path} is more than roctune reads ({_size(limits.max_bytes)}); compress or "
                        "scale it down")
    width, height, fmt = _open(raw, f"{where}: image {path}", limits)
    return ImageRef(os.path.abspath(path), width, height, fmt, path=os.path.abspath(path), digest=_digest(raw))


def read_image(value, roots: list[str], where: str, limits: ImageLimits | None = None) -> ImageRef:
    """One image named in the data (a path, a file:// or data: URL), checked (within `limits`, by default
    `default_limits()`); DataError naming `where` otherwise."""
    limits = limits or default_limits()
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: an image must be given as a path or a data: URL (a non-empty string), got "
                        f"{type(value).__name__}")
    value = value.strip()
    if value.startswith("data:"):
        return _from_data_url(value, where, limits)
    scheme = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://", value)
    if scheme and scheme[1].lower() != "file":
        raise DataError(f"{where}: image URL {value[:80]!r}: roctune fetches nothing from the network; download "
                        "the image and give its path (or a data: URL)")
    return _from_path(value, roots, where, limits)


def read_data_url(url: str, where: str, limits: ImageLimits | None = None) -> ImageRef:
    """An image a client sent (a server request): only a `data:` URL is taken. A server that opened paths or
    fetched http(s) URLs would read its own disk or network for whoever sends a request, so every other form is
    refused and nothing is fetched."""
    if not isinstance(url, str) or not url.strip().startswith("data:"):
        scheme = re.match(r"^\s*([a-zA-Z][a-zA-Z0-9+.-]*):", url) if isinstance(url, str) else None
        shown = f"a URL of scheme {scheme[1].lower()}:" if scheme else "not a data URL"
        raise DataError(f"{where}: {shown} - nothing is fetched; send the image itself as a data URL "
                        "(data:image/png;base64,...)")
    return _from_data_url(url.strip(), where, limits or default_limits())


def read_images(values, roots: list[str], where: str, key: str = "images") -> list[ImageRef]:
    """An `images` column (a list of paths or data URLs, or one) as checked images."""
    if values is None or values == []:
        return []
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list):
        raise DataError(f"{where}: field '{key}' must be a list of image paths, got {type(values).__name__}")
    if len(values) > MAX_IMAGES_PER_RECORD:
        raise DataError(f"{where}: field '{key}' lists {len(values)} images, more than roctune takes in one record "
                        f"({MAX_IMAGES_PER_RECORD})")
    return [read_image(v, roots, f"{where}: field '{key}[{j}]'") for j, v in enumerate(values)]


def check_marker_count(messages: list[dict], images: list, where: str, key: str = "images") -> None:
    """As many IMAGE_MARKER tags in the turns as images in the record (LLaMA-Factory's rule)."""
    tags = sum(m["content"].count(IMAGE_MARKER) for m in messages if isinstance(m.get("content"), str))
    if tags != len(images):
        raise DataError(f"{where}: field '{key}' has {len(images)} image(s) but the turns hold {tags} "
                        f"{IMAGE_MARKER} tag(s); put one {IMAGE_MARKER} where each image goes")


# ------------------------------------------------------------------------------------------- content parts
def parts_text(parts, where: str, key: str) -> tuple[str, list[tuple[str, str]]]:
    """OpenAI content parts as (text with IMAGE_MARKER where each image goes, the images in order as (raw value,
    where it was: "file:line: field 'messages[0].content[1]'"), for `read_image`). Text parts join without a
    separator, as chat templates concatenate them."""
    if not isinstance(parts, list):
        raise DataError(f"{where}: field '{key}' must be a string or a list of content parts")
    texts, images = [], []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        here = f"{where}: field '{key}[{j}]'"
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise DataError(f"{here}: a text part needs a 'text' string")
            texts.append(part["text"])
        elif kind in ("image_url", "image"):
            value = part.get(kind)
            if kind == "image_url" and isinstance(value, dict):
                value = value.get("url")
            if not isinstance(value, str) or not value.strip():
                raise DataError(f"{here}: an {kind} part needs " + ('{"url": PATH or data: URL}' if kind == "image_url"
                                                                     else "an 'image' path"))
            texts.append(IMAGE_MARKER)
            images.append((value, here))
        else:
            raise DataError(f"{here}: part type {kind!r}; expected text, image_url or image")
    return "".join(texts), images


def content_parts(text: str) -> list[dict]:
    """A turn's text as the content parts a vision model's chat template takes: an image part for each
    IMAGE_MARKER, text parts around them."""
    parts: list[dict] = []
    for j, piece in enumerate(text.split(IMAGE_MARKER)):
        if j:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


# ------------------------------------------------------------------------------------------- pixels
def fit_size(width: int, height: int, max_pixels: int, min_pixels: int) -> tuple[int, int]:
    """The size an image is scaled to before its processor (aspect ratio kept): at most `max_pixels` and at
    least `min_pixels` pixels' worth, as LLaMA-Factory scales them."""
    if width * height > max_pixels:
        factor = math.sqrt(max_pixels / (width * height))
        width, height = int(width * factor), int(height * factor)
    if width * height < min_pixels:
        factor = math.sqrt(min_pixels / (width * height))
        width, height = int(width * factor), int(height * factor)
    return max(1, width), max(1, height)


def load(ref: ImageRef, max_pixels: int = DEFAULT_MAX_PIXELS, min_pixels: int = DEFAULT_MIN_PIXELS):
    """The checked image as an RGB PIL image of its fitted size (`fit_size`)."""
    Image = _pil()
    with Image.open(io.BytesIO(ref.data) if ref.data is not None else ref.path) as opened:
        if opened.size != (ref.width, ref.height):  # the file changed since it was checked
            raise DataError(f"{ref.source}: the image changed since the data was read ({ref.width}x{ref.height}, "
                            f"now {opened.size[0]}x{opened.size[1]}); start again")
        image = opened.convert("RGB")
    size = fit_size(ref.width, ref.height, max_pixels, min_pixels)
    return image if size == image.size else image.resize(size, Image.Resampling.BICUBIC)


def open_image(value: str, where: str, limits: ImageLimits | None = None,
               pixels: tuple[int, int] = (DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS)):
    """A picture given at inference (`chat --image PATH`, a web upload's file), relative to the current folder,
    checked (`read_image`) and loaded as training loads one (`load`), within `pixels` (max, min: the run's
    --image-max-pixels and --image-min-pixels, roctune.generate.image_pixels)."""
    return load(read_image(value, [os.getcwd()], where, limits), *pixels)


# ------------------------------------------------------------------------------------------- clients and checks
def data_url(image, fmt: str = "PNG") -> str:
    """An RGB PIL image as a data URL (what a client sends: the web UI, tests, scripts)."""
    buf = io.BytesIO()
    image.save(buf, fmt)
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def probe_image(size: int = 64):
    """A fixed test picture (four coloured quadrants) for the checks that compare two models on an image (merge,
    export): deterministic, and not uniform, so every patch position sees different pixels."""
    Image = _pil()
    image = Image.new("RGB", (size, size))
    h = size // 2
    for (x, y), colour in zip(((0, 0), (h, 0), (0, h), (h, h)),
                              ((220, 20, 60), (30, 144, 255), (255, 215, 0), (34, 139, 34))):
        image.paste(colour, (x, y, x + h, y + h))
    return image
