"""Which examples go into which micro-batch and optimizer step, and how a micro-batch becomes tensors."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field


def plan_batches(lengths: list[int], batch_size: int, seed: int, epoch: int, group_by_length: bool) -> list[list[int]]:
    """Indices of each micro-batch for one epoch. With length grouping, examples are shuffled, cut into
    mega-batches of 50 micro-batches, sorted by length inside each, batched, and the batches shuffled:
    random order, little padding.

    Why not transformers' get_length_grouped_indices: it draws from torch's global RNG (which would shift every
    LoRA dropout mask after it) and moves the longest mega-batch first, so runs and checkpoints written by
    earlier releases would no longer resume on the same order. This seeded version is 15 lines."""
    rng = random.Random(seed * 1000 + epoch)
    idx = list(range(len(lengths)))
    rng.shuffle(idx)
    if group_by_length:
        mega = batch_size * 50
        grouped = []
        for s in range(0, len(idx), mega):
            grouped += sorted(idx[s:s + mega], key=lambda i: -lengths[i])
        idx = grouped
    batches = [idx[s:s + batch_size] for s in range(0, len(idx), batch_size)]
    if group_by_length:
        rng.shuffle(batches)
    return batches


def plan_steps(lengths: list[int], cfg, world_size: int = 1) -> tuple[list[list[list[int]]], int]:
    """The micro-batches (item indices) of every optimizer step, and the steps per epoch. Each step holds
    grad_accum x world_size micro-batches, so the plan of N processes with accumulation A is the plan of one
    process with accumulation N x A; a short tail of an epoch joins the next step."""
    accum = cfg.grad_accum * world_size
    micro_per_epoch = math.ceil(len(lengths) / cfg.batch_size)
    steps_per_epoch = max(1, math.ceil(micro_per_epoch / accum))
    total = cfg.max_steps if cfg.max_steps > 0 else max(1, math.ceil(cfg.epochs * steps_per_epoch))
    micro: list[list[int]] = []
    epoch = 0
    while len(micro) < total * accum:
        micro += plan_batches(lengths, cfg.batch_size, cfg.seed, epoch, cfg.group_by_length)
        epoch += 1
    return [micro[s * accum:(s + 1) * accum] for s in range(total)], steps_per_epoch


@dataclass
class Batch:
    input_ids: "object"
    labels: "object"
    attention_mask: "object | None"
    position_ids: "object | None"
    n_tokens: int  # real (non-padding) tokens
    n_supervised: int  # predicted positions (labels[1:] != -100, per example)
    # labels already hold each token's next token (labels[t] is the target of token t): a sequence-parallel shard,
    # whose last token's target is the first token of the next rank's shard (roctune.training.sequence_parallel)
    shifted: bool = False
    # keyword arguments every attention layer gets, computed once per batch here (see `packed_attention_kwargs`)
    attn_kwargs: dict = field(default_factory=dict)
    # a vision-language model's other forward inputs (pixel values, image grids, per-token modality ids;
    # roctune.training.vision_batch); None for a text model's batch
    inputs: dict | None = None


def supervised_count(labels: list[int]) -> int:
    """Positions whose next token is learned (the first token is never a target)."""
    return sum(1 for x in labels[1:] if x != -100)


def packed_attention_kwargs(lengths: list[int], device: str) -> dict:
    """transformers' FlashAttentionKwargs of a packed row of examples `lengths` long: the cumulative lengths
    (int32, [n + 1]) and the longest, for queries and keys alike.

    Why here: given only position_ids, transformers' flash-attention path derives them again in every layer
    (`_is_packed_sequence`, then `prepare_fa_kwargs_from_position_ids`: a nonzero and a max, two host-device
    syncs per layer, and again for each layer recomputed under checkpointing). The collate knows the lengths
    already: one small host-to-device copy per batch, and every layer takes the varlen kernel's arguments as
    they are. Kernels that do not take them (SDPA, eager) ignore them and build their mask from position_ids,
    once per forward."""
    import torch

    from roctune.hardware.accel import to_device

    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    cu_t = to_device(torch.tensor(cu, dtype=torch.int32), device)
    longest = max(lengths)
    return {"cu_seq_lens_q": cu_t, "cu_seq_lens_k": cu_t, "max_length_q": longest, "max_length_k": longest}


def collate(examples: list, pad_id: int, packed: bool, device: str) -> Batch:
    """Right-padded [B, T] tensors, or one packed row [1, sum(T_i)] whose position_ids restart at each example
    (the attention kernels then keep examples apart; no padding computed).

    Padded batches carry no attention mask: with right padding, causal attention already keeps every real
    token from seeing the padding after it, and padded positions have no labels. The attention kernels then
    take their fast causal path (no mask tensor, masked-out blocks skipped) with identical results for
    every real token."""
    import torch

    from roctune.hardware.accel import to_device

    n_tokens = sum(len(e.input_ids) for e in examples)
    n_sup = sum(supervised_count(e.labels) for e in examples)
    if packed:
        ids, labels, pos = [], [], []
        for e in examples:
            ids += e.input_ids
            # the first token of each example is never a target of the previous one
            labels += [-100] + e.labels[1:]
            pos += list(range(len(e.input_ids)))
        t = lambda x: to_device(torch.tensor([x], dtype=torch.long), device)  # noqa: E731
        return Batch(t(ids), t(labels), None, t(pos), n_tokens, n_sup,
                     attn_kwargs=packed_attention_kwargs([len(e.input_ids) for e in examples], device))
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels)
    return Batch(to_device(ids, device), to_device(labels, device), None, None, n_tokens, n_sup)
