"""Write the bundled vision example (examples/vision_shapes*.jsonl): a synthetic image task made with Pillow.

Each image is 64 x 64 pixels (the model `roctune models build-vlm` assembles shows it as 2 x 2 tiles of 32 pixels and
the whole picture scaled to one tile) with one shape (circle, square or triangle) of one colour (red, green, blue or
yellow) at a random place and size on a light background; the user asks for the colour or for the shape, and the
answer is one word. Chance is 1/4 for colours and 1/3 for shapes. The training split asks the shape four times in
five: a tower trained from nothing tells colours apart after a few hundred pictures but needs about a thousand to tell
a circle from a square (measured on the tower alone: 1,024 shape pictures x 3 epochs gave 97-98% held-out, 576 x 4
gave 66-85%); the held-out split asks both equally often. The images travel inside the JSONL as data URLs (OpenAI
content parts), so each split is one small file; the held-out split's images are drawn from another seed.
Deterministic: running it again writes the same files.

    .venv/bin/python scripts/make_vision_example.py     # examples/vision_shapes.jsonl + vision_shapes_heldout.jsonl
"""
from __future__ import annotations

import base64
import io
import json
import os
import random
import sys

COLOURS = {"red": (215, 40, 40), "green": (40, 170, 60), "blue": (45, 70, 215), "yellow": (230, 200, 30)}
SHAPES = ("circle", "square", "triangle")
QUESTIONS = {"colour": ("What colour is the shape?", "Which colour is drawn here?", "Name the colour of the shape."),
             "shape": ("What shape is drawn?", "Which shape is this?", "Name the shape in the picture.")}
SIZE = 64
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def draw(colour: str, shape: str, rng: random.Random) -> bytes:
    """A PNG of one shape: its side or diameter 36-56 pixels, placed anywhere it fits, on a light grey-ish
    background that varies a little (so a colour is not a constant image). Why that large: at 24-44 pixels a circle
    and a square differ in a few pixels of their corners, under one 8-pixel patch, and a fresh tower stayed near
    chance on them (59-80% held-out from 768 pictures, against 98-99% at 36-56)."""
    from PIL import Image, ImageDraw

    shade = rng.randint(225, 250)
    image = Image.new("RGB", (SIZE, SIZE), (shade, shade, rng.randint(220, 250)))
    d = ImageDraw.Draw(image)
    side = rng.randint(36, 56)
    x, y = rng.randint(2, SIZE - side - 2), rng.randint(2, SIZE - side - 2)
    fill = tuple(min(255, max(0, c + rng.randint(-20, 20))) for c in COLOURS[colour])
    if shape == "circle":
        d.ellipse((x, y, x + side, y + side), fill=fill)
    elif shape == "square":
        d.rectangle((x, y, x + side, y + side), fill=fill)
    else:
        d.polygon([(x + side / 2, y), (x, y + side), (x + side, y + side)], fill=fill)
    buf = io.BytesIO()
    image.save(buf, "PNG", optimize=True)
    return buf.getvalue()


def records(n: int, seed: int, colour_every: int) -> list[dict]:
    """`n` conversations, every (colour, shape) pair equally often; each `colour_every`-th round of the pairs asks
    the colour, the others the shape."""
    rng = random.Random(seed)
    pairs = [(c, s) for c in COLOURS for s in SHAPES]
    out = []
    for i in range(n):
        colour, shape = pairs[i % len(pairs)]
        asked = "colour" if (i // len(pairs)) % colour_every == 0 else "shape"
        url = "data:image/png;base64," + base64.b64encode(draw(colour, shape, rng)).decode()
        question = rng.choice(QUESTIONS[asked])
        answer = (colour if asked == "colour" else shape).capitalize() + "."
        out.append({"messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": question}]},
            {"role": "assistant", "content": answer}]})
    rng.shuffle(out)
    return out


def main() -> int:
    for name, n, seed, colour_every in (("vision_shapes.jsonl", 1260, 1, 5), ("vision_shapes_heldout.jsonl", 96, 2, 2)):
        path = os.path.join(REPO, "examples", name)
        with open(path, "w", encoding="utf-8") as f:
            for r in records(n, seed, colour_every):
                f.write(json.dumps(r) + "\n")
        print(f"{path}: {n} conversations, {os.path.getsize(path) // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
