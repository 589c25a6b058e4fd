"""Conversations with images as token ids and labels: every image's tokens known before training, never cut.

A vision-language model's processor (transformers': its tokenizer, image processor and chat template) turns each
image placeholder of the rendered text into the image's tokens (Qwen-VL: one <|image_pad|> per merged patch; SmolVLM:
tiles of <image> between row/column markers; Gemma 3: 256 soft tokens between <start_of_image> and <end_of_image>).
Here the conversation is rendered by the same template code as text (roctune.data.render: the same segments, the
same label mask), and each segment that holds images goes through the processor, whose text-replacement offsets and
the tokenizer's character offsets give every image's token span. So, before a model loads:
- each image's token count is known (`ImageTokenized.spans`; `data preview` and `estimate` show them);
- labels are -100 on every token of an image span (and on the prompt), so no image token is ever a target;
- truncation (`truncate_spans`) never cuts inside a span: --max-length moves to the span's edge and the images cut
  away leave the example with it, so the model never sees an image whose tokens and features do not match
  (LLaMA-Factory issues 5964, 6559, 9313). A window of --truncation split that cannot hold an image refuses the
  example with its line.
The images are `roctune.data.images.ImageRef`s: the pixels are decoded again, the same way, when a batch is built.
Nothing here imports torch; the processor is passed in (`ImageText`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from roctune.data.images import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, load
from roctune.data.render import RenderOptions, Tokenized, collect, conversation_segments
from roctune.errors import DataError


@dataclass
class ImageText:
    """What turning images into tokens needs: the model's processor (its tokenizer carries the chat template, see
    roctune.vision.load_image_text), the pixel bounds images are scaled to, and the forward argument that takes
    per-token modality ids (families.Vision.token_types)."""

    processor: Any
    max_pixels: int = DEFAULT_MAX_PIXELS
    min_pixels: int = DEFAULT_MIN_PIXELS
    token_types: str | None = None

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    @property
    def placeholder(self) -> str:
        """What the chat template writes for one image, which the processor expands."""
        return self.processor.image_token

    def pictures(self, refs: list) -> list:
        return [load(r, self.max_pixels, self.min_pixels) for r in refs]

    def expand(self, text: str, refs: list) -> tuple[list[int], list[tuple[int, int]]]:
        """(token ids of `text` with each placeholder expanded into its image's tokens, each image's [start, end)
        token span), through the processor exactly as transformers runs it."""
        out = self.processor(text=[text], images=[self.pictures(refs)], add_special_tokens=False,
                             return_text_replacement_offsets=True, return_offsets_mapping=True)
        ids, offsets = list(out["input_ids"][0]), out["offset_mapping"][0]
        spans = []
        for rep in out["text_replacement_offsets"][0]:
            start, end = rep["new_span"]
            inside = [t for t, (a, b) in enumerate(offsets) if a < end and b > start]
            spans.append((inside[0], inside[-1] + 1))
        if len(spans) != len(refs):
            raise DataError(f"the processor placed {len(spans)} of {len(refs)} images")
        return ids, spans


@dataclass
class ImageTokenized(Tokenized):
    """A tokenized example with its images (ImageRef, in order) and their token spans in `input_ids`."""

    images: list = field(default_factory=list)
    spans: list = field(default_factory=list)

    @property
    def image_tokens(self) -> int:
        return sum(b - a for a, b in self.spans)


def tokenize_image_conversation(it: ImageText, messages: list[dict], images: list, where: str = "",
                                tools: list[dict] | None = None, options: RenderOptions | None = None
                                ) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """(ids, labels, image spans) of one conversation: rendered into (text, learned) segments as text is, each
    segment with images expanded by the processor; labels -100 on prompts and on every image token."""
    segments = conversation_segments(it.tokenizer, messages, tools, options, where)
    counts = [text.count(it.placeholder) for text, _ in segments]
    if sum(counts) != len(images):
        raise DataError(f"{where}: the chat template placed {sum(counts)} image(s) ({it.placeholder}) for the "
                        f"record's {len(images)}; the text may spell the model's image token itself, or the template "
                        "drops images of some turns: put each image in a user turn with an <image> tag")
    plain = [text for (text, _), n in zip(segments, counts) if not n]
    plain_ids = iter(it.tokenizer(plain, add_special_tokens=False)["input_ids"] if plain else [])
    ids: list[int] = []
    labels: list[int] = []
    spans: list[tuple[int, int]] = []
    taken = 0
    for (text, learned), n in zip(segments, counts):
        if n:
            seg_ids, seg_spans = it.expand(text, images[taken:taken + n])
            spans += [(len(ids) + a, len(ids) + b) for a, b in seg_spans]
            taken += n
        else:
            seg_ids = next(plain_ids)
        ids += seg_ids
        labels += list(seg_ids) if learned else [-100] * len(seg_ids)
    for a, b in spans:
        labels[a:b] = [-100] * (b - a)
    return ids, labels, spans


def _inside(at: int, spans) -> tuple[int, int] | None:
    """The span that position `at` would cut (a < at < b), if any."""
    return next(((a, b) for a, b in spans if a < at < b), None)


def truncate_spans(ids: list[int], labels: list[int], spans: list[tuple[int, int]], max_length: int, how: str,
                   where: str = "") -> list[tuple[list[int], list[int], range, list[tuple[int, int]]]]:
    """`render.truncate` that never cuts inside an image span: [(ids, labels, the images kept as a range of
    indices, their spans in the piece)]. right: the cut moves back to the start of the span it would cut (that image
    and those after it leave); left: forward to its end; split: windows end before a span they cannot hold whole,
    and an image longer than a window refuses the example (DataError naming `where`)."""
    n = len(ids)
    if n <= max_length:
        return [(ids, labels, range(len(spans)), spans)]
    if how == "split":
        return _split_windows(ids, labels, spans, max_length, where)
    if how == "left":
        start = n - max_length
        cut = _inside(start, spans)
        start = cut[1] if cut else start
        keep = [i for i, (a, _) in enumerate(spans) if a >= start]
        return [(ids[start:], labels[start:], range(keep[0], keep[-1] + 1) if keep else range(0),
                 [(a - start, b - start) for a, b in spans if a >= start])]
    cut = _inside(max_length, spans)
    end = cut[0] if cut else max_length
    keep = [i for i, (_, b) in enumerate(spans) if b <= end]
    return [(ids[:end], labels[:end], range(len(keep)), [spans[i] for i in keep])]


def _split_windows(ids, labels, spans, max_length, where):
    """Consecutive windows of at most `max_length` tokens overlapping by one (render.truncate's split), each ending
    before an image span it cannot hold whole."""
    out, start, n = [], 0, len(ids)
    while start < n - 1:
        end = min(start + max_length, n)
        cut = _inside(end, spans)
        if cut:
            end = cut[0]
        if end - start < 2:
            a, b = cut
            raise DataError(f"{where}: an image of {b - a} tokens does not fit a --max-length {max_length} window "
                            "(--truncation split); raise --max-length or lower --image-max-pixels")
        keep = [i for i, (a, b) in enumerate(spans) if a >= start and b <= end]
        out.append((ids[start:end], labels[start:end], range(keep[0], keep[-1] + 1) if keep else range(0),
                    [(spans[i][0] - start, spans[i][1] - start) for i in keep]))
        start = end - 1
    return out


def iter_image_tokenized(it: ImageText, records: Iterable, max_length: int,
                         options: RenderOptions | None = None) -> Iterator[ImageTokenized | None]:
    """Each record tokenized with its images (`render.iter_tokenized` for vision models); None for one whose answer
    truncation cut off entirely (it is dropped)."""
    how = options.truncation if options else "right"
    for r in records:
        ids, labels, spans = tokenize_image_conversation(it, r.messages, r.images, r.source, r.tools, options)
        kept = [ImageTokenized(i, lab, r.source, [r.images[k] for k in keep], sp)
                for i, lab, keep, sp in truncate_spans(ids, labels, spans, max_length, how, r.source)
                if any(x != -100 for x in lab[1:])]
        if not kept:
            yield None
        yield from kept


def tokenize_image_records(it: ImageText, records: Iterable, max_length: int,
                           options: RenderOptions | None = None) -> tuple[list[ImageTokenized], int]:
    """Every record tokenized with its images. Returns (examples, number dropped because truncation left no
    answer); the signature of `render.tokenize_records` with the processor first."""
    return collect(iter_image_tokenized(it, records, max_length, options))
