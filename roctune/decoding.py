"""Batched decoding with a KV cache, shared by `roctune serve` (continuous batching, roctune.serve.engine) and GRPO's
rollouts (`sample_completions`): left-padded prompts, the decoding state of a batch (`Batch`), dropping finished
rows, joining two batches, and sampling at a temperature within a top-p nucleus. A PEFT model decodes with its
adapters applied unmerged, as it trains. torch is imported inside the functions that need it."""
from dataclasses import dataclass


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


# ------------------------------------------------------------------------------------------- rollouts
def sample_rows(logits, temperature: float, top_p: float, gen, u=None) -> list[int]:
    """One token per row of `logits` [rows, vocab] at `temperature` within the top-p nucleus, drawn with `gen`
    (all rows in one draw: a batch's sampling costs one call whatever its size), or with the uniform numbers `u`
    [rows, 1] when given (`keyed_uniforms`); temperature 0 is greedy."""
    import torch

    if temperature <= 0:
        return logits.argmax(dim=-1).tolist()
    scaled = logits.float() / temperature
    if not torch.isfinite(scaled.max(dim=-1).values).all():  # a temperature so small it overflows: greedy
        return logits.argmax(dim=-1).tolist()
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True, dim=-1)
        sorted_p[sorted_p.cumsum(-1) - sorted_p > top_p] = 0.0  # keep the smallest set reaching top_p
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_p)
    return draw_rows(probs, gen, u=u)


def draw_rows(probs, gen, block: int = 256, u=None) -> list[int]:
    """One index per row of `probs` [rows, n] (each row's weights, not necessarily summing to 1), by inverting the
    cumulative sum at one uniform draw per row, in two levels: first a block of `block` entries, then an entry in
    it. torch.multinomial draws an exponential for every entry (34 ms a call at 64 rows of SmolLM2's 49k vocabulary
    on one CPU thread, 12% of a rollout), and one cumsum over the whole row is as slow; block sums and two short
    cumsums are not. Sums are float64 so that small weights are not lost."""
    import torch
    import torch.nn.functional as F

    rows, n = probs.shape
    p = F.pad(probs, (0, -n % block)).view(rows, -1, block)  # zero weights pad the last block
    sums = p.sum(-1, dtype=torch.float64)
    cdf = sums.cumsum(-1)
    if u is None:
        u = torch.rand((rows, 1), generator=gen, dtype=torch.float64, device=probs.device)
    u = u.to(device=probs.device, dtype=torch.float64) * cdf[:, -1:]
    b = _first_above(cdf, u)
    inner = p[torch.arange(rows, device=probs.device), b.squeeze(1)].double().cumsum(-1)
    i = _first_above(inner, u - (cdf.gather(1, b) - sums.gather(1, b)))
    return (b * block + i).squeeze(1).tolist()


def _first_above(cdf, u):
    """Per row, the first index whose cumulative weight exceeds u (so never a zero weight), or the last index with a
    weight where rounding put u at or past the total."""
    import torch

    last = (cdf < cdf[:, -1:]).sum(-1, keepdim=True)  # where the total is first reached: the last positive weight
    return torch.minimum(torch.searchsorted(cdf, u, right=True), last)


_M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of `x` (Steele, Lea and Flood, 2014)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def sample_key(*parts: int) -> int:
    """A 64-bit key for one sequence of draws from integers that name it (seed, step, prompt, sample)."""
    key = 0
    for p in parts:
        key = _mix64(key ^ (p & _M64))
    return key


def keyed_uniforms(keys: list[int], counters: list[int]):
    """[rows, 1] float64 uniforms in [0, 1), the `counter`-th draw of each row's key: a counter-based generator,
    so a sequence's tokens do not depend on which other rows share its batch, process or turn (GRPO's tool
    rollouts sample the same episode on one process or two, in one batch or another, resumed or not)."""
    import torch

    return torch.tensor([[(_mix64(k ^ _mix64(c)) >> 11) / 2.0 ** 53] for k, c in zip(keys, counters)],
                        dtype=torch.float64)


def cache_argument(model) -> str:
    """The name of the forward pass's KV-cache argument (transformers renamed past_key_values to cache)."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def _last_logits(model, cache_arg: str, cache, **inputs):
    out = model(use_cache=True, logits_to_keep=1, **inputs, **{cache_arg: cache})
    return out.logits[:, -1, :].float()


def _prefill_distinct(model, cache_arg: str, prompts: list[list[int]], pad_id: int, device: str) -> Batch:
    """The batch of `prompts` after their prefill, each distinct prompt run once and its cache rows copied to its
    repeats. GRPO samples a group of completions per prompt, and TRL's generate prefills every copy: on the
    bundled model (8 prompts x 8, 47 tokens, one CPU thread) prefill was 11 of a rollout's 30 seconds."""
    import torch
    from transformers import DynamicCache

    first: dict[tuple, int] = {}
    index = [first.setdefault(tuple(p), len(first)) for p in prompts]
    ids, mask, pos = (t.to(device) for t in left_pad([list(p) for p in first], pad_id))
    cache = DynamicCache(config=model.config)
    logits = _last_logits(model, cache_arg, cache, input_ids=ids, attention_mask=mask, position_ids=pos)
    if len(first) < len(prompts):
        sel = torch.tensor(index, device=device)
        cache.batch_select_indices(sel)
        logits, mask, pos = logits[sel], mask[sel], pos[sel]
    return Batch(list(range(len(prompts))), cache, mask, pos[:, -1:], logits, cache_joinable(cache))


def sample_completions(model, prompts: list[list[int]], max_new_tokens, temperature: float, top_p: float,
                       eos_ids: set, pad_id: int, gen, device: str, keys: list[tuple[int, int]] | None = None
                       ) -> list[list[int]]:
    """Completions of `prompts` (token ids), decoded together with a KV cache: one prefill of the left-padded
    distinct prompts (a prompt repeated for a group runs once), then one forward per token for the rows still
    going; a row ends at an end-of-sequence token (kept as its last token) or after `max_new_tokens` (one number,
    or one per row). Draws come from `gen`, or with `keys` [(key, first counter)] per row from `keyed_uniforms`.
    Runs without gradients; the caller puts the model in eval mode."""
    import torch

    cache_arg = cache_argument(model)
    out: list[list[int]] = [[] for _ in prompts]
    limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    with torch.inference_mode():
        st = _prefill_distinct(model, cache_arg, prompts, pad_id, device)
        while True:
            keep, nxt = [], []
            u = None if keys is None or temperature <= 0 else keyed_uniforms(
                [keys[r][0] for r in st.rows], [keys[r][1] + len(out[r]) for r in st.rows])
            for j, (r, tok) in enumerate(zip(st.rows, sample_rows(st.logits, temperature, top_p, gen, u))):
                out[r].append(tok)
                if tok not in eos_ids and len(out[r]) < limits[r]:
                    keep.append(j)
                    nxt.append(tok)
            if not keep:
                return out
            if len(keep) < len(st.rows):
                keep_rows(st, keep)
            advance(st)
            st.logits = _last_logits(model, cache_arg, st.cache, input_ids=torch.tensor(nxt, device=device)[:, None],
                                     attention_mask=st.mask, position_ids=st.last_pos)
