"""Images that reach a model at inference from outside (a `chat --image` file, a data URL in an API request, a web
upload), checked where they enter into a decoded RGB picture, or refused with one line naming where it came from.

The checks, in order, each before the next costs anything: the size in bytes (a data URL's before its base64 is
decoded), the format (PNG, JPEG, WebP, GIF, BMP: what vision processors read; PIL is told to try no other decoder),
then the pixel count read from the header before a single pixel is decoded, so a small file that unpacks into a
huge picture (a decompression bomb: a 40 kB PNG of 30000 x 30000 pixels is 2.7 GB decoded) is refused by its
header. Only a `data:` URL is taken from a request: a server that fetched http(s) or file URLs would read its own
disk or its network for whoever sends a request, so every other scheme is refused and nothing is fetched.
"""
from __future__ import annotations

import base64
import binascii
import io
import os
import re
from dataclasses import dataclass

from roctune.errors import DataError

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
MIME_TYPES = {"image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif", "image/bmp"}
DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(?:;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,",
                      re.ASCII)


@dataclass(frozen=True)
class ImageLimits:
    """How large one image may be: its bytes (encoded) and its pixels (decoded). The defaults take a 4K photo
    (8.3 M pixels, a few MB as JPEG) and refuse what no vision processor would use at its size anyway."""

    max_bytes: int = 20 * 2**20
    max_pixels: int = 40_000_000


DEFAULT_LIMITS = ImageLimits()


def open_image_bytes(data: bytes, where: str, limits: ImageLimits = DEFAULT_LIMITS):
    """The picture in `data` as an RGB PIL image; DataError naming `where` when it is too large, not an image of a
    known format, or damaged."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > limits.max_bytes:
        raise DataError(f"{where}: the image is {len(data) / 2**20:.1f} MiB, over the limit of "
                        f"{limits.max_bytes / 2**20:.0f} MiB; send a smaller image")
    if not data:
        raise DataError(f"{where}: the image is empty")
    try:
        img = Image.open(io.BytesIO(data), formats=FORMATS)  # reads the header only
        width, height = img.size
        if width * height > limits.max_pixels:
            raise DataError(f"{where}: the image is {width} x {height} pixels, over the limit of "
                            f"{limits.max_pixels:,} pixels; send a smaller image")
        img.seek(0)  # an animated image: its first frame
        img.load()
        return img.convert("RGB")
    except DataError:
        raise
    except UnidentifiedImageError:
        raise DataError(f"{where}: not an image roctune reads (PNG, JPEG, WebP, GIF or BMP)") from None
    except Image.DecompressionBombError:  # PIL's own refusal, at far more pixels than ours (a header's claim)
        raise DataError(f"{where}: the image claims more than {limits.max_pixels:,} pixels; send a smaller "
                        "image") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise DataError(f"{where}: the image is damaged or truncated ({str(e)[:100] or type(e).__name__})") from None


def open_image_file(path: str, where: str, limits: ImageLimits = DEFAULT_LIMITS):
    """The picture in the file `path` (see `open_image_bytes`); its size is checked before it is read."""
    if not os.path.isfile(path):
        raise DataError(f"{where}: {path}: no such image file")
    size = os.path.getsize(path)
    if size > limits.max_bytes:
        raise DataError(f"{where}: {path} is {size / 2**20:.1f} MiB, over the limit of "
                        f"{limits.max_bytes / 2**20:.0f} MiB; use a smaller image")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"{where}: {path} cannot be read ({e.strerror or e})") from None
    return open_image_bytes(data, f"{where}: {path}", limits)


def scheme_of(url: str) -> str:
    """The scheme of a URL as written ("data", "https", "file", ...), "" when it has none."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", url)
    return m.group(1).lower() if m else ""


def open_data_url(url: str, where: str, limits: ImageLimits = DEFAULT_LIMITS):
    """The picture in a `data:image/...;base64,...` URL (see `open_image_bytes`). Any other scheme is refused
    without being fetched; the encoded length is checked before the base64 is decoded."""
    scheme = scheme_of(url)
    if scheme != "data":
        shown = f"a URL of scheme {scheme}:" if scheme else "not a URL"
        raise DataError(f"{where}: {shown} - nothing is fetched; send the image itself as a data URL "
                        "(data:image/png;base64,...)")
    m = DATA_URL.match(url)
    if not m or not m.group("b64"):
        raise DataError(f"{where}: a data URL must be data:image/<type>;base64,<data>")
    mime = (m.group("mime") or "").lower()
    if mime not in MIME_TYPES:
        raise DataError(f"{where}: data URL of type {mime or 'none'}; send image/png, image/jpeg, image/webp, "
                        "image/gif or image/bmp")
    encoded = url[m.end():]
    if len(encoded) // 4 * 3 > limits.max_bytes:
        raise DataError(f"{where}: the image is about {len(encoded) * 3 / 4 / 2**20:.1f} MiB, over the limit of "
                        f"{limits.max_bytes / 2**20:.0f} MiB; send a smaller image")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise DataError(f"{where}: the data URL's base64 is not valid") from None
    return open_image_bytes(data, where, limits)


def data_url(img, fmt: str = "PNG") -> str:
    """An RGB PIL image as a data URL (for clients: the web UI, tests, scripts)."""
    buf = io.BytesIO()
    img.save(buf, fmt)
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def probe_image(size: int = 64):
    """A fixed test picture (four coloured quadrants) for the checks that compare two models on an image (merge,
    export): deterministic, and not uniform, so every patch position sees different pixels."""
    from PIL import Image

    img = Image.new("RGB", (size, size))
    h = size // 2
    for (x, y), colour in zip(((0, 0), (h, 0), (0, h), (h, h)),
                              ((220, 20, 60), (30, 144, 255), (255, 215, 0), (34, 139, 34))):
        img.paste(colour, (x, y, x + h, y + h))
    return img
