"""Decoding state for the engine: `GenRequest` (one completion to produce), `Row` (one request inside a batch:
its generated ids, the text sent so far, stop strings, its sampler) and `Batch` (the rows decoded together,
with their KV cache and attention mask) with the tensor operations on it: left-padded prompts, joining two
batches, dropping finished rows. torch is imported inside the functions that need it."""

import random
from dataclasses import dataclass
from typing import Callable

from roctune.serve.errors import ApiError, generation_failed
from roctune.serve.schemas import Sampling


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


def sample(logits, temperature: float, top_p: float, gen):
    """A token drawn from `logits` (one row) at `temperature`, within the top-p nucleus. A temperature so small
    that the scaled logits overflow (1e-300) is what it tends to: the most likely token."""
    import torch

    scaled = logits.float() / temperature
    if not torch.isfinite(scaled.max()):
        return int(logits.argmax())
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p > top_p  # keep the smallest set reaching top_p
        sorted_p[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return int(torch.multinomial(probs, 1, generator=gen)[0])


# ------------------------------------------------------------------------------------------------ batches
@dataclass
class Batch:
    """The rows being decoded together: their KV cache, attention mask, last positions and next logits."""

    rows: list
    cache: object
    mask: object
    last_pos: object
    logits: object
    joinable: bool


def left_pad(prompts: list[list[int]], pad_id: int):
    """(ids, mask, positions) of the prompts, left-padded to the longest one."""
    import torch

    n, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


def cache_joinable(cache) -> bool:
    """Whether the cache's layers are plain tensors that `join` and `keep_rows` can cut and stack."""
    return all(type(layer).__name__ == "DynamicLayer" and hasattr(layer, "keys")
               for layer in getattr(cache, "layers", [None]))


def join(a: Batch, b: Batch) -> Batch:
    """One batch from two: the shorter cache is padded on the left (masked), then rows are stacked."""
    import torch

    if not b.joinable:
        raise RuntimeError("this model's cache cannot be merged")
    width = max(a.mask.shape[1], b.mask.shape[1])

    def pad(t, dim: int):
        missing = width - t.shape[dim]
        if missing == 0:
            return t
        shape = list(t.shape)
        shape[dim] = missing
        return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)

    for la, lb in zip(a.cache.layers, b.cache.layers):
        la.keys = torch.cat([pad(la.keys, 2), pad(lb.keys, 2)], dim=0)
        la.values = torch.cat([pad(la.values, 2), pad(lb.values, 2)], dim=0)
    a.mask = torch.cat([pad(a.mask, 1), pad(b.mask, 1)], dim=0)
    a.last_pos = torch.cat([a.last_pos, b.last_pos], dim=0)
    a.logits = torch.cat([a.logits, b.logits], dim=0)
    a.rows += b.rows
    return a


def keep_rows(st: Batch, keep: list[int]) -> None:
    """Drop every row of `st` but those at indices `keep`, then the columns that are now padding for all."""
    import torch

    sel = torch.tensor(keep, device=st.mask.device)
    st.cache.batch_select_indices(sel)
    st.mask, st.last_pos = st.mask[sel], st.last_pos[sel]
    st.rows = [st.rows[j] for j in keep]
    lead = int((st.mask.cumsum(1) == 0).sum(1).min())  # columns now padding for every row
    if lead >= 16 and st.joinable:
        st.mask = st.mask[:, lead:]
        for layer in st.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, lead:], layer.values[:, :, lead:]


def advance(st: Batch) -> None:
    """Move every row one position on: the next token is attended to at the next position."""
    import torch

    st.last_pos = st.last_pos + 1
    st.mask = torch.cat([st.mask, torch.ones((len(st.rows), 1), dtype=st.mask.dtype, device=st.mask.device)], 1)
