"""Sequence (context) parallelism: one long example split over the processes of a sequence group, Ulysses-style
(DeepSpeed-Ulysses, as LLaMA-Factory and axolotl use it), with torch.distributed's own collectives.

With --sequence-parallel P, the processes are cut into groups of P consecutive ranks; every group trains the same
micro-batches (data parallelism is over the groups, see roctune.training.loop), and inside a group rank s keeps
tokens [s*T/P, (s+1)*T/P) of every row (`shard`). Everything but attention works token by token, so each rank runs
the embeddings, MLPs, norms, projections and output layer on its own T/P tokens: the activations kept for backward
are about 1/P of one process's. Attention needs every token, so `ulysses_attention` (registered with transformers'
AttentionInterface and set as the model's attention implementation) exchanges heads for tokens with one
all-to-all: [B, H, T/P, D] on each rank becomes [B, H/P, T, D] (every token, 1/P of the heads), the model's own
kernel (SDPA or flash-attn, causal) runs on that, and a second all-to-all gives each rank its tokens back with every
head. Both all-to-alls are `torch.distributed.nn.functional.all_to_all_single`, which carries gradients (its backward
is the reverse all-to-all), and run over gloo on the CPU and NCCL/RCCL on GPUs with the same code.

Positions are the global ones (the rotary embedding of token t is the same as in one process), and the labels are
shifted by one over the whole row before it is cut (`Batch.shifted`), so the last token of a chunk learns the first
token of the next. Each rank's loss is the sum over its own tokens; the loop divides by the step's global count of
supervised tokens and DistributedDataParallel sums the gradients over all ranks (the loop scales its average),
which is exactly one process's gradient: the all-to-all's backward has already brought every rank's share of the
other ranks' losses home.

Why Ulysses and not ring attention (torch.distributed.tensor.experimental.context_parallel): ring attention
dispatches only GPU SDPA kernels, while this must also run with CPU processes; Ulysses keeps the model's own kernel
(flash-attn varlen included) and needs only heads divisible by P.

Heads that do not divide by P (the bundled SmolLM2 has 9): each rank keeps its own T/P queries with every head and
all-gathers the keys and values of the group instead (the Llama 3 paper's all-gather context parallelism), then
attends causally with its queries offset by rank*T/P (`gather_kv_attention`). The all-gather's backward is a
reduce-scatter, so every rank's key/value gradients come home as with Ulysses. It moves more data (the whole row's
keys and values on every rank, P/2 times Ulysses' traffic on average) and the last rank does the most attention work,
so Ulysses stays the choice wherever the heads divide.
"""
from __future__ import annotations

from roctune.errors import ConfigError

ATTENTION_NAME = "roctune_ulysses"
# kernels that take a causal flag without a mask tensor; eager needs the mask transformers builds for local tokens
INNER_KERNELS = ("sdpa", "flash_attention_2")


# ---------------------------------------------------------------------------------------- checks before load
def check(cfg, model_config: dict) -> None:
    """Refuse, before the model loads, what this sequence parallelism cannot do with `model_config` (a plain dict
    of config.json)."""
    p = cfg.sequence_parallel
    if p <= 1:
        return
    if cfg.attn != "auto":  # refused here, in the launcher, not in each worker after the model loaded
        check_kernel(cfg.attn)
    text = model_config.get("text_config") or model_config
    if text.get("attn_logit_softcapping") or text.get("attention_logit_softcapping"):
        raise ConfigError(f"--sequence-parallel: this model soft-caps attention scores, which the SDPA and flash "
                          "kernels it runs cannot do here; train without --sequence-parallel")
    window = text.get("sliding_window")
    if window and text.get("use_sliding_window", True) and window < cfg.max_length:
        raise ConfigError(f"--sequence-parallel: this model attends over a sliding window of {window} tokens, "
                          f"shorter than --max-length {cfg.max_length}; train without --sequence-parallel or "
                          f"with --max-length {window}")


# ---------------------------------------------------------------------------------------------- batches
def shard(batch, rank: int, size: int, pad_id: int):
    """This rank's share of `batch` (a roctune.training.batching.Batch, right-padded [B, T]): the row is padded to
    a multiple of `size` (padding comes last, so causal attention never lets a real token see it), the labels are
    shifted by one over the whole row, and rank `rank` keeps its contiguous T/size tokens with their global
    positions. n_supervised becomes this rank's own count (the counts of a group add up to the batch's)."""
    import dataclasses

    import torch

    if batch.position_ids is not None:  # only packed rows carry positions (restarting at each example)
        raise ConfigError("--sequence-parallel needs unpacked batches (--packing off)")
    ids, labels = batch.input_ids, batch.labels
    rows, width = ids.shape
    full = -(-width // size) * size
    if full != width:
        ids = torch.nn.functional.pad(ids, (0, full - width), value=pad_id)
        labels = torch.nn.functional.pad(labels, (0, full - width), value=-100)
    targets = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)  # target of token t is token t+1
    part = full // size
    keep = slice(rank * part, (rank + 1) * part)
    positions = torch.arange(rank * part, (rank + 1) * part, device=ids.device).unsqueeze(0).expand(rows, -1)
    local_targets = targets[:, keep].contiguous()
    return dataclasses.replace(batch, input_ids=ids[:, keep].contiguous(), labels=local_targets, attention_mask=None,
                               position_ids=positions, n_supervised=int((local_targets != -100).sum()), shifted=True)


# -------------------------------------------------------------------------------------------- attention
def _all_to_all(x, group):
    """Chunk i of x's first dimension goes to rank i of `group`; chunk i of the result came from rank i. With
    gradients: PyTorch's functional collective (what torch.distributed.nn.functional.all_to_all_single now points
    to), whose backward is the reverse all-to-all."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    return wait_tensor(all_to_all_single_autograd(x, None, None, group))


def _heads_for_tokens(x, group, size: int):
    """[B, H, t, D] (all heads of this rank's t tokens) -> [B, H/size, size*t, D] (this rank's heads of every
    token, in rank order: rank r holds tokens r*t..)."""
    b, h, t, d = x.shape
    send = x.reshape(b, size, h // size, t, d).permute(1, 0, 2, 3, 4).contiguous()
    got = _all_to_all(send, group)  # [source rank, B, H/size, t, D]
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // size, size * t, d)


def _tokens_for_heads(x, group, size: int):
    """[B, size*t, H/size, D] (kernel output: this rank's heads of every token) -> [B, t, H, D]."""
    b, n, h, d = x.shape
    t = n // size
    send = x.reshape(b, size, t, h, d).permute(1, 0, 2, 3, 4).contiguous()  # [token chunk = destination, ...]
    got = _all_to_all(send, group)  # [source rank = head chunk, B, t, h, D]
    return got.permute(1, 2, 0, 3, 4).reshape(b, t, size * h, d)


def make_attention(group, size: int, inner: str):
    """The attention function transformers calls in each layer (AttentionInterface's signature) for a sequence
    group `group` of `size` ranks, running the registered kernel `inner` on the exchanged heads."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    kernel = ALL_ATTENTION_FUNCTIONS[inner]

    def ulysses_attention(module, query, key, value, attention_mask, **kwargs):
        # the mask and positions transformers made describe this rank's tokens only; every kernel here is causal
        # over the whole row instead (padding comes last), and the positions were applied by the rotary embedding
        for name in ("position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
            kwargs.pop(name, None)
        kv_heads = key.shape[1]
        if kv_heads % size:  # grouped-query attention with fewer kv heads than ranks: give each query head its own
            from transformers.models.llama.modeling_llama import repeat_kv

            key, value = (repeat_kv(t, query.shape[1] // kv_heads) for t in (key, value))
        q, k, v = (_heads_for_tokens(t, group, size) for t in (query, key, value))
        groups = getattr(module, "num_key_value_groups", 1)
        module.num_key_value_groups = q.shape[1] // k.shape[1]  # the kernel repeats kv heads by this
        try:
            out, _ = kernel(module, q, k, v, None, **kwargs)
        finally:
            module.num_key_value_groups = groups
        return _tokens_for_heads(out, group, size), None

    return ulysses_attention


def _gather_tokens(x, group):
    """[B, H, t, D] on each rank -> [B, H, size*t, D], rank r's tokens at r*t.. (the functional all-gather
    concatenates along dim 0 and carries gradients: its backward is a reduce-scatter)."""
    from torch.distributed._functional_collectives import all_gather_single_autograd, wait_tensor

    got = wait_tensor(all_gather_single_autograd(x.permute(2, 0, 1, 3).contiguous(), 0, group))
    return got.permute(1, 2, 0, 3)


def make_gather_attention(group, rank: int, inner: str):
    """The attention function for heads that do not divide by the group's size: this rank's queries (tokens
    rank*t..) against the keys and values of tokens 0..(rank+1)*t of the whole row, causally.

    The offset is made by putting rank*t zero queries in front, so the kernel's own causal mode (aligned at the
    top left in SDPA) lines the real queries up with their keys: no [t, T] mask, which SDPA would keep per layer for
    backward (512 MiB a layer at 16k tokens), only O(T) more; the zero queries' outputs are dropped, so their
    gradient is zero and they add nothing to the keys' and values' gradients. The price is their compute: the last
    of 2 ranks does 2 t^2 of attention instead of 1.5 t^2."""
    import torch
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    kernel = ALL_ATTENTION_FUNCTIONS[inner]

    def gather_kv_attention(module, query, key, value, attention_mask, **kwargs):
        for name in ("position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "is_causal"):
            kwargs.pop(name, None)
        b, h, t, d = query.shape
        offset = rank * t  # later ranks' tokens are never attended to: their keys are not kept
        key, value = (_gather_tokens(x, group)[:, :, :offset + t] for x in (key, value))
        if offset:
            query = torch.cat([query.new_zeros(b, h, offset, d), query], dim=2)
        out = kernel(module, query, key, value, None, is_causal=True, **kwargs)[0]  # [B, offset + t, H, D]
        return out[:, offset:].contiguous(), None  # o_proj keeps t tokens, not a view of the padded row

    return gather_kv_attention


def scheme(heads: int, size: int) -> str:
    """How a group of `size` ranks shares attention for a model of `heads` query heads."""
    return "ulysses" if heads % size == 0 else "all-gather"


def check_kernel(attn: str) -> None:
    """The attention kernel chosen for this run must work without a mask (before the model loads)."""
    if attn not in INNER_KERNELS:
        raise ConfigError(f"--sequence-parallel needs --attn sdpa or flash_attention_2 (not {attn}): eager "
                          "attention builds its causal mask for the local tokens only")


def install(model, group, size: int, attn: str) -> str:
    """Make every attention layer of `model` (a transformers model, or a peft wrapper of one) run Ulysses over
    `group` (or the all-gather of keys and values where the heads do not divide by `size`), with the kernel `attn`
    inside. Registered under one name per process (one group per process). Returns what was chosen, for the log."""
    import torch.distributed as dist
    from transformers import AttentionInterface

    check_kernel(attn)
    config = model.get_base_model().config if hasattr(model, "get_base_model") else model.config
    heads = (getattr(config, "text_config", None) or config).num_attention_heads
    how = scheme(heads, size)
    fn = (make_attention(group, size, attn) if how == "ulysses"
          else make_gather_attention(group, dist.get_rank(group), attn))
    AttentionInterface.register(ATTENTION_NAME, fn)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation(ATTENTION_NAME)
    if how == "ulysses":
        return f"Ulysses: an all-to-all over the {heads} attention heads"
    return (f"all-gather of keys and values ({heads} attention heads do not divide by {size}, so each process "
            "keeps every head of its own queries)")
