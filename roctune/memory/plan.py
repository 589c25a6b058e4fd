"""The long-sequence part of a training plan (checkpointing, MLP tiles, offloading layer inputs) chosen from the
length, and the one place the memory estimate of a training run is built from its settings: `train`'s warning, the
out-of-memory advice, the web UI and `roctune estimate` all call `estimate_run`, so they cannot disagree.

Why checkpointing from 2,048 tokens on: without it every layer keeps its activations (about 830 KiB per token on
the bundled 30-layer model, fp32, LoRA), with it each layer keeps its input (69 KiB) and one layer is recomputed at
a time; measured peak RSS at 2k tokens was 3.16 GiB without and 1.69 GiB with (issue 36). Below that length
training is faster without (a layer's forward runs twice with it) and the activations are small.
"""
from __future__ import annotations

from dataclasses import dataclass

from roctune.method_rows import METHODS

# Sequences of this many tokens and more are trained with layer checkpointing and MLP tiles without a flag.
LONG_SEQUENCE = 2048
# On a GPU, from this length on the checkpointed layer inputs wait in pinned host memory (roctune.training.offload):
# there they are most of what grows with the length, and a layer's compute hides their copy (side stream).
OFFLOAD_SEQUENCE = 16384


@dataclass(frozen=True)
class Checkpointing:
    on: bool
    offload: bool  # layer inputs in host memory (GPUs only)
    reason: str

    @property
    def value(self) -> str:
        return ("layers, inputs offloaded to host memory" if self.offload else "layers, MLP in tiles") if self.on \
            else "off"


def choose_checkpointing(asked: bool, max_length: int, device: str, offload: str = "auto") -> Checkpointing:
    """Checkpointing for a run: asked for, or chosen because the sequences are long (see the module docstring);
    `offload` (--offload auto|on|off): its layer inputs in host memory, on a GPU only."""
    from roctune.errors import ConfigError

    if offload == "on" and device != "cuda":
        raise ConfigError("--offload on needs a GPU (it moves layer inputs from GPU memory to host memory; the CPU "
                          "keeps them in RAM already); drop --offload or use --device cuda")
    if offload == "on":
        return Checkpointing(True, True, "--offload on: every layer checkpointed, its input in pinned host memory "
                                         "(copied while the next layers compute)")
    on = offload == "auto" and device == "cuda" and max_length >= OFFLOAD_SEQUENCE
    offload = on
    why_offload = (f"; inputs in pinned host memory from {OFFLOAD_SEQUENCE:,} tokens on a GPU (copied while the next "
                   "layers compute; --offload off keeps them on the GPU)") if offload else ""
    if asked:
        return Checkpointing(True, offload, "asked for with --grad-checkpointing" + why_offload)
    if max_length >= LONG_SEQUENCE:
        return Checkpointing(True, offload, f"sequences up to {max_length:,} tokens (>= {LONG_SEQUENCE:,}): each "
                                            "layer keeps only its input" + why_offload)
    return Checkpointing(False, False, f"sequences up to {max_length:,} tokens (< {LONG_SEQUENCE:,}): faster "
                                       "without; --grad-checkpointing forces it")


def maps_large_allocations(device: str, max_length: int) -> bool:
    """Whether a run maps each large CPU allocation on its own (roctune.hardware.allocator): on the CPU from
    LONG_SEQUENCE tokens on, where a checkpointed step's holes in the heap would outgrow the step (issue 36); shorter
    steps keep the heap (mapping cost a third of their speed) and the estimate counts its holes."""
    return device == "cpu" and max_length >= LONG_SEQUENCE


def estimate_run(model, cfg, *, device: str, dtype: str | None = None, attn: str | None = None,
                 batch_size: int | None = None, max_length: int | None = None, supervised_fraction: float = 1.0,
                 packed: bool = False, images: int = 0, vision_model: str | None = None):
    """The estimate of one training step of `cfg` (a TrainConfig, or anything with its field names) on `model`
    (a config source for roctune.memory.estimate). dtype/attn None: as `train` chooses them for `device`;
    batch_size/max_length override cfg's (the OOM advice's micro-batch, a length search). On the CPU it is
    the process's peak RSS (the interpreter and libraries included), what the machine's RAM must hold. A
    vision-language model (`vision_model`: its folder) adds its tower and projector, with `images` per example
    (roctune.memory.vision; their tokens are part of --max-length)."""
    from roctune.families import family_of
    from roctune.hardware.allocator import huge_pages_on
    from roctune.memory.architecture import Architecture
    from roctune.memory.estimate import estimate

    arch = model if isinstance(model, Architecture) else Architecture.from_config(model)
    # the output layer runs in chunks where roctune's loss keeps it frozen at supervised positions (a known family)
    known = family_of(arch.model_type) is not None  # roctune's shortcuts (MLP tiles, chunked head) need a family
    chunked = known and bool(cfg.loss_on_supervised_only) and not METHODS[cfg.method].trains_all
    L = int(max_length or cfg.max_length)
    B = int(batch_size or cfg.batch_size)
    plan = choose_checkpointing(bool(cfg.grad_checkpointing), L, device, getattr(cfg, "offload", "auto"))
    targets = cfg.target_modules
    est = estimate(arch, method=cfg.method, batch_size=B, max_length=L, lora_r=cfg.lora_r,
                    target_modules="all-linear" if targets == ["all-linear"] else targets,
                    dtype=dtype or _dtype(cfg, device), attn=attn or _attn(cfg),
                    grad_checkpointing=plan.on, long_context=plan.on and known, offload=plan.offload,
                    freeze_trainable_layers=abs(int(cfg.freeze_trainable_layers)), lora_dropout=cfg.lora_dropout,
                    grad_accum=cfg.grad_accum, padded=not packed and B > 1, device=device,
                    supervised_fraction=supervised_fraction if cfg.loss_on_supervised_only else 1.0,
                    optimizer=getattr(cfg, "optimizer", "adamw"), rss=device == "cpu", chunked_head=chunked,
                    heap_holes=device == "cpu" and not maps_large_allocations(device, L),
                    huge_pages=device == "cpu" and huge_pages_on())
    if plan.offload:
        est.notes.append(f"checkpointed layer inputs offloaded: {est.host_bytes / 2**30:.2f} GiB of pinned host "
                         f"memory, not in the GPU total ({plan.reason})")
    return _with_vision(est, vision_model, cfg, images * B) if vision_model else est


def _with_vision(est, model_dir: str, cfg, images: int):
    """`est` with a vision model's tower and projector (roctune.memory.vision), unchanged for a text model."""
    from roctune.memory.estimate import DTYPE_BYTES
    from roctune.memory.vision import add_vision, vision_shape

    shape = vision_shape(model_dir, getattr(cfg, "image_max_pixels", 768 * 768),
                         getattr(cfg, "image_min_pixels", 32 * 32))
    if shape is None:
        return est
    return add_vision(est, shape, method=cfg.method, dtype_bytes=DTYPE_BYTES.get(est.settings.get("dtype"), 4),
                      images=images,
                      train_tower=bool(getattr(cfg, "train_vision_tower", False)),
                      tower_lora=bool(getattr(cfg, "vision_tower_lora", False)),
                      train_projector=bool(getattr(cfg, "train_projector", False)), lora_r=cfg.lora_r)


def _dtype(cfg, device: str) -> str:
    if cfg.dtype not in (None, "", "auto"):
        return cfg.dtype
    # as roctune.hardware.choose_dtype decides without asking the GPU: fp32 on the CPU (QLoRA computes in bf16)
    return "fp32" if device == "cpu" and not METHODS[cfg.method].quantized else "bf16"


def _attn(cfg) -> str:
    return "sdpa" if cfg.attn in (None, "", "auto") else cfg.attn


def longest_length(model, cfg, memory_bytes: int, *, device: str, step: int = 64, limit: int = 1 << 20,
                   **kw) -> int | None:
    """The longest --max-length (a multiple of `step`) whose estimate_run fits `memory_bytes`, the plan for each
    length included; None when even `step` tokens do not fit. The estimate grows with the length within one plan
    and drops where the plan changes (LONG_SEQUENCE, OFFLOAD_SEQUENCE), so each stretch is searched alone."""
    def fits(units: int) -> bool:
        return estimate_run(model, cfg, device=device, max_length=units * step, **kw).total_bytes <= memory_bytes

    edges = [1] + [-(-b // step) for b in (LONG_SEQUENCE, OFFLOAD_SEQUENCE)] + [limit // step + 1]
    best = None
    for lo, end in zip(edges, edges[1:]):
        hi = end - 1
        if lo > hi or not fits(lo):
            continue
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        best = lo * step
    return best
