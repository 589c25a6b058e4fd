"""Decoding state for the engine: `GenRequest` (one completion to produce), `Row` (one request inside a batch:
its generated ids, the text sent so far, stop strings, its sampler). The batch itself (`Batch`: rows decoded
together with their KV cache and attention mask) and its tensor operations (left-padded prompts, joining two
batches, dropping finished rows, sampling) are in roctune.decoding, shared with GRPO's rollouts. torch is imported
inside the functions that need it."""

import random
from dataclasses import dataclass
from typing import Callable

from roctune.decoding import Batch, advance, cache_joinable, join, keep_rows, left_pad, sample
from roctune.serve.errors import ApiError, generation_failed
from roctune.serve.schemas import Sampling

# the batch tensor operations live in roctune.decoding (GRPO's rollouts use them too); re-exported for serve
__all__ = ["Batch", "GenRequest", "Row", "advance", "cache_joinable", "fail", "join", "keep_rows", "left_pad",
           "sample", "send"]


@dataclass
class GenRequest:
    """One completion to produce. `emit` is called from the worker thread with ("text", delta),
    ("end", finish_reason, completion_tokens) or ("error", ApiError); it must be thread-safe. `solo` asks the
    engine to decode it in a batch of its own (set after a batch it was in failed as a whole)."""

    prompt_ids: list[int]
    adapter: str | None
    sampling: Sampling
    emit: Callable[[tuple], None]
    cancelled: bool = False
    solo: bool = False
    constraint: object = None  # a constrain.Constraint the answer must follow (response_format, forced calls)
    images: dict | None = None  # a vision model's prompt inputs beside the ids (pixel values, ...): prefilled alone


def send(req: GenRequest, ev: tuple) -> None:
    """Hand `ev` to the request's client; an emit that fails (a closed event loop: the client is gone)
    cancels the request."""
    try:
        req.emit(ev)
    except Exception:
        req.cancelled = True


def fail(req: GenRequest, exc: BaseException) -> None:
    """Answer `req` alone with an error (an ApiError as it is, anything else as a 500) and stop decoding it."""
    if req.cancelled:
        return
    req.cancelled = True
    send(req, ("error", exc if isinstance(exc, ApiError) else generation_failed(exc)))


class Row:
    """Decoding state of one request inside a batch: generated ids, text sent so far, stop handling."""

    def __init__(self, req: GenRequest, decode: Callable[[list[int]], str], eos_ids: set, device: str):
        import torch

        self.req = req
        self.decode = decode
        self.eos_ids = eos_ids
        self.ids: list[int] = []
        self.sent = 0  # characters of the decoded text already emitted
        self.finished = False
        self.gen = None
        self.sampling = req.sampling
        if self.sampling.temperature > 0:
            self.gen = torch.Generator(device=device)
            seed = self.sampling.seed
            self.gen.manual_seed(seed if seed is not None else random.getrandbits(63))

    def _send(self, text: str, upto: int) -> None:
        if upto > self.sent:
            send(self.req, ("text", text[self.sent:upto]))
            self.sent = upto

    def finish(self, reason: str, n_tokens: int) -> None:
        self.finished = True
        send(self.req, ("end", reason, n_tokens))

    def next_token(self, logits, greedy: int) -> int:
        """This row's next token from its logits (`greedy`: their argmax, taken at temperature 0)."""
        sp = self.sampling
        if self.req.constraint is not None:
            logits = self.req.constraint.mask(logits)
            greedy = int(logits.argmax())
        return greedy if sp.temperature <= 0 else sample(logits, sp.temperature, sp.top_p, self.gen)

    def push(self, token: int) -> bool:
        """Take the next token; emit what can be sent; True when the row is finished."""
        if token in self.eos_ids:
            text = self.decode(self.ids)
            self._send(text, len(text))
            self.finish("stop", len(self.ids) + 1)
            return True
        self.ids.append(token)
        text = self.decode(self.ids)
        stop_at = self._stop_at(text)
        if self.req.constraint is not None:
            self.req.constraint.consume(token)
            if self.req.constraint.done:  # the grammar is complete: nothing more may follow
                stop_at = len(text) if stop_at is None else stop_at
        if stop_at is not None:
            self._send(text, stop_at)
            self.finish("stop", len(self.ids))
            return True
        if len(self.ids) >= self.sampling.max_tokens:
            self._send(text, len(text))
            self.finish("length", len(self.ids))
            return True
        self._send(text, self._safe_end(text))
        return False

    def _stop_at(self, text: str) -> int | None:
        """Where the first stop string starts in `text` (searching only past what was sent), or None."""
        hits = [i for i in (text.find(s, max(0, self.sent - len(s) + 1)) for s in self.sampling.stop) if i >= 0]
        return min(hits) if hits else None

    def _safe_end(self, text: str) -> int:
        """How much of `text` can be sent now: not an incomplete UTF-8 sequence, nor a tail that may grow into a
        stop string."""
        safe = len(text)
        while safe > self.sent and text[safe - 1] == "\ufffd":  # an incomplete UTF-8 sequence: wait for more
            safe -= 1
        for s in self.sampling.stop:  # hold back a tail that may grow into a stop string
            for k in range(min(len(s) - 1, safe - self.sent), 0, -1):
                if text[safe - k:safe] == s[:k]:
                    safe -= k
                    break
        return safe
