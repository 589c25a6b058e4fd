"""The memory estimate of a fine-tuning run, from the model's config alone (no weights are loaded, no torch).

The estimate is the peak of live tensor memory during a training step, which happens at the start of
the backward pass (every layer's saved activations are alive, plus the loss's vocabulary-sized tensors),
plus framework/allocator overhead:

    weights             frozen weights in the compute dtype (QLoRA: NF4 with double-quantized scales)
    trainable_params    what is trained, stored in fp32 (LoRA adapters; for full/freeze the weights
                        themselves, as roctune's trainer upcasts trainable parameters to fp32)
    autocast_copies     full/freeze in bf16/fp16: the half-precision copies autocast makes of trainable
                        weights and keeps for the backward pass
    gradients           one per trainable parameter, in its dtype (fp32)
    optimizer_states    AdamW: two fp32 moments; 8-bit AdamW: two bytes plus block scales; SGD: none
    activations         tensors the autograd graph saves for backward, per decoder layer (see
                        `_layer_saved_per_token`); with gradient checkpointing, each layer's input plus
                        one layer recomputed during backward
    logits_loss         the fp32 cross-entropy: log-softmax output, its gradient and the logits' gradient,
                        each tokens x vocabulary x 4 bytes (scaled by `supervised_fraction` when the
                        output layer runs only at supervised positions)
    overhead            GPU: ~0.5 GiB for the CUDA/HIP context and library workspaces, plus 10% of the
                        activation-sized allocations for allocator fragmentation; CPU with `rss`: the process
                        itself and (`heap_holes`) the C heap's holes beside the activations

Activation model (Hugging Face decoder layer, RMSNorm, gated MLP): the norm saves its input in fp32; a
linear layer saves its input only when its weight is trained or it carries a LoRA adapter (peft gives each
adapter its own fp32/cast copy of the input in half precision, and dropout adds its own output and mask);
attention saves q, k, v (k/v repeated to all heads when a padding mask stops SDPA's native GQA), its
output (which is also o_proj's input) and log-sum-exp, and SDPA keeps the mask, converted to a float tensor,
in every layer; eager attention saves the fp32 softmax over length x length; the gated MLP saves gate,
act(gate) and up. The peak is the largest of three phases: start of backward (activations + loss),
recomputing a checkpointed layer, optimizer step (gradients + temporaries); gradients of earlier
micro-batches add to all of them when grad_accum > 1. On the CPU this matches measured peaks of 21 runs
(fp32 and bf16+autocast; LoRA, full, freeze) within 0.3% (tests/data/memory_measured_cpu.json, measured
by scripts/measure_memory.py). Not yet checked against a GPU.

Long sequences (`long_context`, `chunked_head`, `rss`: what roctune.memory.plan.estimate_run sets as `train` runs
them): the checkpointed layers keep their inputs, the recomputed one its MLP a tile at a time, the output layer
keeps hidden-wide gradients instead of vocabulary-wide logits, and on the CPU the process's own memory is added so
the figure compares with peak RSS (scripts/bench_long_context.py prints both); shorter runs on the CPU add the heap's
holes too (`heap_holes`, CPU_HEAP_HOLES), which long ones avoid by mapping each large allocation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roctune.errors import ConfigError
from roctune.hardware.allocator import HUGE_PAGE_BYTES
from roctune.method_rows import DEFAULT, METHODS, NAMES, Method
from roctune.memory.architecture import Architecture, Linear
from roctune.memory.result import GiB, MemoryEstimate

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
OPTIMIZERS = ("adamw", "adamw8bit", "sgd")
ATTENTIONS = ("sdpa", "eager", "flash_attention_2")
_ATTN_ALIASES = {"auto": "sdpa", "fa2": "flash_attention_2", "flash": "flash_attention_2",
                 "flash_attn": "flash_attention_2", "flash-attention-2": "flash_attention_2"}
_OPTIMIZER_ALIASES = {"adamw_8bit": "adamw8bit", "adam": "adamw", "paged_adamw_8bit": "adamw8bit"}

# NF4 with double quantization: 4 bits per weight, one 8-bit scale per 64 weights, one fp32 scale per 256 scales.
QLORA_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)
GPU_CONTEXT_BYTES = GiB // 2
FRAGMENTATION = 0.10
# A roctune training process on the CPU before its first tensor: the interpreter, torch, transformers, peft and
# roctune imported (measured RSS 0.385 GiB, Python 3.12, torch 2.13); added with rss=True.
CPU_PROCESS_BYTES = int(0.38 * GiB)
# On the CPU, the share of the activations that glibc's heap keeps resident as holes beside them (added with
# heap_holes=True). Activations under 32 MiB each come from the heap (glibc's mmap threshold rises to the size of each
# freed mapping, up to 32 MiB), and a step frees and re-makes them in an order that leaves freed ones resident as holes
# the next sizes do not fit. Measured by scripts/measure_rss.py (peak RSS less the rest of the estimate, LoRA steps of
# the bundled model at 4 x 181 to 8 x 256 and 2 x 1,024 tokens, tests/data/rss_measured_cpu.json; and of the assembled
# vision model, scripts/bench_vision.py): 0.0-0.7 of the activations, most runs 0.3-0.6, varying between identical
# runs; 0.33 keeps every measured run within 15%. On huge pages (THP_MEM_ALLOC_ENABLE=1, the CLI's default) hidden
# states of 2 MiB and more left few holes (0.02-0.12) and none are counted there (_holes_counted). Giving every
# allocation its own mapping removes the holes (roctune.hardware.allocator) but cost a third of the speed at these
# lengths, so roctune maps only long sequences (roctune.memory.plan.maps_large_allocations), whose estimate leaves the
# holes out.
CPU_HEAP_HOLES = 0.33
# roctune.training.losses.CHUNK_ELEMENTS (logit elements per chunk of the chunked output layer); memory imports no
# torch, so the number is repeated here and tests/test_long_context.py checks the two agree.
HEAD_CHUNK_ELEMENTS = 8 * 2 ** 20
# roctune.training.activations.TILE_ELEMENTS (MLP tile size), checked the same way.
MLP_TILE_ELEMENTS = 4 * 2 ** 20


def _norm_choice(value: str, valid, aliases: dict, flag: str) -> str:
    v = str(value).strip().lower()
    v = aliases.get(v, v)
    if v not in valid:
        raise ConfigError(f"{flag} {value!r}: expected one of {', '.join(valid)}")
    return v


def _layer_saved_per_token(arch: Architecture, *, s: int, trained: bool, lora: list[Linear], lora_r: int,
                           lora_bytes: int, dropout: bool, mask_bytes: int, attn: str, repeat_kv: bool) -> float:
    """Bytes per token that one decoder layer keeps for the backward pass (excluding eager's L x L term).

    `trained`: the layer's own weights are trained (full/freeze); `lora`: its linear modules with adapters;
    `s`: bytes per element of activations; `lora_bytes`: of the adapters' inputs and outputs."""
    H, I = arch.hidden, arch.intermediate
    q = arch.heads * arch.head_dim
    kvd = arch.kv_heads * arch.head_dim
    inputs = {"attn_in": H, "attn_out": q, "mlp_in": H, "mlp_mid": I}
    total = 0.0
    # RMSNorm x2: fp32 input (upcast copy in half precision) and 1/rms; with a trained weight, its input too
    total += 2 * (4 * H + 4) + (2 * H * s if trained else 0)
    # inputs of linear layers. A trained base weight saves the shared input; a LoRA adapter saves the shared
    # input too in fp32 without dropout, otherwise its own copy (peft casts the input to the adapter's dtype,
    # autocast casts it back, dropout makes a new tensor and a mask).
    for feed, width in inputs.items():
        adapted = [l for l in lora if l.feeds == feed]
        shared = trained
        if adapted:
            if s == 4 and not dropout:
                shared = True
            else:
                total += len(adapted) * width * (lora_bytes + (mask_bytes if dropout else 0))
        if shared and not (feed == "attn_out" and attn != "eager"):
            total += width * s  # (a fused kernel's output is already in o_proj's input layout: counted below)
    total += sum(lora_r * lora_bytes for _ in lora)  # lora_A outputs, saved by lora_B
    # attention: q (after RoPE), k and v (repeated to every head when SDPA cannot do GQA natively)
    kv_saved = q if (repeat_kv or attn == "eager") else kvd
    total += q * s + 2 * kv_saved * s
    if attn != "eager":
        total += q * s + 4 * arch.heads  # kernel output and log-sum-exp
    # MLP: gated saves gate, act(gate), up; plain saves fc1 output and act output
    total += (3 if arch.gated_mlp else 2) * I * s
    return total


@dataclass(frozen=True)
class _Run:
    """The settings of one estimate, checked and normalised."""
    arch: Architecture
    method: str
    dtype: str
    attn: str
    optimizer: str
    device: str
    B: int  # batch size
    L: int  # max length
    lora_r: int
    lora_dropout: float
    grad_checkpointing: bool
    supervised_fraction: float
    padded: bool
    grad_accum: int
    autocast: bool
    long_context: bool = False  # MLP in sequence tiles inside the checkpointed layers
    offload: bool = False       # checkpointed layer inputs in host memory
    chunked_head: bool = False  # the frozen output layer run in chunks (roctune.training.losses)
    rss: bool = False
    heap_holes: bool = False
    huge_pages: bool = False  # THP_MEM_ALLOC_ENABLE=1 (roctune.hardware.allocator)

    @property
    def T(self) -> int:  # tokens per micro-batch
        return self.B * self.L

    @property
    def s(self) -> int:  # bytes per element of activations
        return DTYPE_BYTES[self.dtype]

    @property
    def row(self) -> Method:  # what the method trains and stores (roctune.method_rows)
        return METHODS[self.method]

    @property
    def lora(self) -> bool:
        return self.row.adapter


def _checked_run(arch: Architecture, method, batch_size, max_length, lora_r, dtype, grad_checkpointing, attn,
                 optimizer, supervised_fraction, lora_dropout, padded, device, grad_accum, autocast,
                 **long_context) -> _Run:
    method = _norm_choice(method, NAMES, {}, "--method")
    dtype = _norm_choice(dtype, tuple(DTYPE_BYTES), _DTYPE_ALIASES, "--dtype")
    attn = _norm_choice(attn, ATTENTIONS, _ATTN_ALIASES, "--attn")
    optimizer = _norm_choice(optimizer, OPTIMIZERS, _OPTIMIZER_ALIASES, "--optimizer")
    device = "cpu" if str(device).lower() == "cpu" else "cuda"
    for flag, v in (("--batch-size", batch_size), ("--max-length", max_length)):
        if int(v) < 1:
            raise ConfigError(f"{flag} must be at least 1 (got {v})")
    if METHODS[method].adapter and int(lora_r) < 1:
        raise ConfigError(f"--lora-r must be at least 1 (got {lora_r})")
    if not 0 < supervised_fraction <= 1:
        raise ConfigError(f"supervised_fraction must be in (0, 1] (got {supervised_fraction})")
    if METHODS[method].quantized and dtype == "fp32":
        dtype = "bf16"  # 4-bit weights compute in half precision
    if autocast is None:
        autocast = device == "cuda"  # as roctune's trainer does
    return _Run(arch, method, dtype, attn, optimizer, device, int(batch_size), int(max_length), lora_r,
                lora_dropout, grad_checkpointing, supervised_fraction, padded, int(grad_accum), bool(autocast),
                **{k: bool(v) for k, v in long_context.items()})


@dataclass
class _Params:
    """What is stored per parameter: the trained subset, frozen weights, autocast copies."""
    lora_mods: list[Linear]
    trainable: int
    trained_layers: int
    weights: float
    trainable_bytes: int
    copies: int


def _parameters(r: _Run, target_modules, freeze_trainable_layers: int, details: dict) -> _Params:
    arch, s, dtype, N = r.arch, r.s, r.dtype, r.arch.layers
    lora_mods = arch.targeted(target_modules) if r.lora else []
    largest = max((min(l.d_in, l.d_out) for l in lora_mods), default=None)
    if largest is not None and r.lora_r > largest:  # as roctune.methods refuses it for train
        raise ConfigError(f"--lora-r {r.lora_r}: larger than every adapted layer (the largest rank they allow is "
                          f"{largest}); typical ranks are 8 to 64")
    linear_layer_params = sum(l.d_in * l.d_out for l in arch.linears)
    other_layer_params = arch.layer_params - linear_layer_params
    embed_and_head = arch.embedding_params + arch.lm_head_params + arch.hidden
    if r.lora:
        trainable = N * sum(r.lora_r * (l.d_in + l.d_out) for l in lora_mods)
        if r.row.quantized:
            weights = (N * linear_layer_params * QLORA_BYTES_PER_PARAM
                       + (N * other_layer_params + embed_and_head) * s)
            details["weights"] = "decoder linear layers in NF4 (+ scales), embeddings/norms in " + dtype
        else:
            weights = arch.total_params * s
            details["weights"] = f"{arch.total_params:,} parameters x {s} bytes ({dtype})"
        details["trainable_params"] = f"LoRA r={r.lora_r} on {', '.join(sorted({l.name for l in lora_mods}))}, fp32"
        return _Params(lora_mods, trainable, 0, weights, trainable * 4, 0)
    every = r.row.trains_all
    trained_layers = N if every else min(N, max(0, int(freeze_trainable_layers)))
    trainable = trained_layers * arch.layer_params + (embed_and_head if every else 0)
    frozen = arch.total_params - trainable
    details["weights"] = f"{frozen:,} frozen parameters x {s} bytes ({dtype})"
    # roctune's trainer upcasts trained parameters to fp32 and computes under autocast
    details["trainable_params"] = (("all" if every else f"last {trained_layers} layers'")
                                   + " weights, fp32 (trained in fp32, computed under autocast)")
    trained_linear = trained_layers * linear_layer_params + (arch.lm_head_params or arch.embedding_params
                                                             if every else 0)
    details["autocast_copies"] = f"{dtype} copies of trained matmul weights kept for backward"
    return _Params([], trainable, trained_layers, frozen * s, trainable * 4, trained_linear * s if s != 4 else 0)


def _optimizer_states(optimizer: str, trainable: int, details: dict) -> float:
    if optimizer == "adamw":
        details["optimizer_states"] = "AdamW: 2 fp32 moments per trained parameter"
        return trainable * 8
    if optimizer == "adamw8bit":
        details["optimizer_states"] = "8-bit AdamW: 2 bytes per parameter + block scales"
        return trainable * (2 + 8 / 256)
    details["optimizer_states"] = "SGD without momentum: none"
    return 0


def _activations(r: _Run, p: _Params, details: dict) -> tuple[float, float]:
    """(activation bytes at the start of backward, bytes of the one layer recomputed under checkpointing)."""
    arch, s, B, L, T, H = r.arch, r.s, r.B, r.L, r.T, r.arch.hidden
    lora_bytes = s if r.autocast and s != 4 else 4  # under autocast the adapter inputs are cast to dtype
    repeat = r.padded and arch.kv_heads != arch.heads and r.attn != "flash_attention_2"
    if r.lora:
        saving_layers = arch.layers
        per_tok = _layer_saved_per_token(arch, s=s, trained=False, lora=p.lora_mods, lora_r=r.lora_r,
                                         lora_bytes=lora_bytes, dropout=r.lora_dropout > 0,
                                         mask_bytes=1 if r.device == "cuda" else 4, attn=r.attn, repeat_kv=repeat)
    else:
        saving_layers = p.trained_layers
        per_tok = _layer_saved_per_token(arch, s=s, trained=True, lora=[], lora_r=0, lora_bytes=4,
                                         dropout=False, mask_bytes=0, attn=r.attn, repeat_kv=repeat)
    quad = _quadratic(r)
    layer_bytes = per_tok * T + quad
    recompute = 0
    if r.grad_checkpointing and saving_layers and r.long_context:
        recompute = _tiled_recompute(r, per_tok, quad)
        kept = 2 if r.offload else saving_layers  # offloaded: the layer recomputed and the next, prefetched
        act = kept * T * H * s + recompute
        details["activations"] = (f"checkpointing: {saving_layers} layer inputs" + (" in host memory (2 back on the "
                                  "GPU: one recomputed, the next prefetched)" if r.offload else "")
                                  + " + 1 layer recomputed, its MLP in tiles")
    elif r.grad_checkpointing and saving_layers:
        # each layer's input is kept; during backward one layer is recomputed, plus its gradient buffers
        recompute = layer_bytes + T * (2 * arch.intermediate + 3 * H) * s
        act = saving_layers * T * H * s + recompute
        details["activations"] = (f"checkpointing: {saving_layers} layer inputs + 1 layer recomputed "
                                  f"({per_tok / 1024:.1f} KiB/token)")
    else:
        act = saving_layers * layer_bytes
        details["activations"] = f"{saving_layers} layers x {per_tok / 1024:.1f} KiB/token x {T:,} tokens" + (
            " + L x L " + ("softmax" if r.attn == "eager" else "mask") if quad else "")
    # shared by all layers: RoPE cos/sin, the attention mask, the final norm's fp32 input
    act += 2 * T * arch.head_dim * s + 4 * T * H
    if r.padded and r.attn == "sdpa":
        act += B * L * L
    elif r.padded and r.attn == "eager":
        act += B * L * L * s
    if r.row.trains_all:
        act += T * H * s  # the lm_head's input, saved as the head is trained
    if r.row.quantized:
        big = max(l.d_in * l.d_out for l in arch.linears)
        act += 2 * big * s  # weights dequantized for the forward/backward matmuls
        details["activations"] += "; + dequantized weight workspace"
    return act, recompute


def _tiled_recompute(r: _Run, per_tok: float, quad: float) -> float:
    """One checkpointed layer recomputed in backward with its MLP in tiles: what the layer keeps without the MLP's
    [tokens x intermediate] tensors, plus the MLP's input and output and the layer's gradient buffers per token, plus
    one tile's intermediates (gate, up, act, product and their gradients)."""
    arch, s, T, H, I = r.arch, r.s, r.T, r.arch.hidden, r.arch.intermediate
    mlp = (3 if arch.gated_mlp else 2) * I * s
    rows = min(T, max(256, MLP_TILE_ELEMENTS // max(1, I)))
    return (per_tok - mlp + 2 * H * s) * T + quad + T * 3 * H * s + rows * 6 * I * s


def _quadratic(r: _Run) -> float:
    """The per-layer L x L term of attention."""
    s, B, L = r.s, r.B, r.L
    if r.attn == "eager":  # the fp32 softmax over L x L (and its half-precision copy)
        return B * r.arch.heads * L * L * (4 + (s if s != 4 else 0))
    if r.attn == "sdpa" and r.padded:  # SDPA turns the boolean mask into a float one and keeps it for backward
        return B * L * L * s
    return 0


def _step_workspace(r: _Run, p: _Params, details: dict) -> float:
    """Per-tensor AdamW (the CPU default) makes two temporaries as large as the biggest trained tensor (sqrt
    of the second moment, then its quotient); fused AdamW makes none, for-each AdamW one per parameter."""
    details["optimizer_step"] = "AdamW step: two temporaries the size of the largest trained tensor"
    if not (r.optimizer == "adamw" and p.trainable and r.device == "cpu"):
        return 0  # roctune uses fused AdamW on GPUs: no temporaries
    arch = r.arch
    if r.lora:
        biggest = max(r.lora_r * max(l.d_in, l.d_out) for l in p.lora_mods)
    else:
        biggest = max(max(l.d_in * l.d_out for l in arch.linears),
                      arch.embedding_params if r.row.trains_all else 0)
    return 2 * 4 * biggest


def _not_concurrent(r: _Run, act, recompute, logits, grads, step_ws, details: dict) -> float:
    """What is not alive at the same time, as a negative correction to the sum of the parts.

    Phases: loss backward (activations + loss), recomputing a checkpointed layer (after the loss tensors
    are freed), optimizer step (gradients + workspace). With one micro-batch per step, activations and
    the loss are freed before the optimizer step and gradients are allocated as backward frees activations."""
    backward = act - recompute + max(logits, recompute)
    together = act + logits + grads + step_ws
    if r.grad_accum > 1:
        peak_dynamic = grads + max(backward, step_ws)
    else:
        peak_dynamic = max(backward, grads + step_ws)
    details["not_concurrent"] = ("gradients grow as backward frees activations" + (" (one micro-batch per step)"
                                 if r.grad_accum <= 1 else "") + ("; the loss is freed before layers are "
                                 "recomputed" if recompute else ""))
    return peak_dynamic - together


def _holes_counted(r: _Run) -> bool:
    """Whether the heap's holes are counted: asked for (heap_holes), except on huge pages where a step's hidden-state
    tensors reach 2 MiB, which left few holes (measured: 0.02-0.12 of the activations, against 0.4-0.7 below)."""
    return r.heap_holes and not (r.huge_pages and r.T * r.arch.hidden * r.s >= HUGE_PAGE_BYTES)


def _overhead(r: _Run, act: float, logits: float, details: dict) -> float:
    """What is resident beside the live tensors: the GPU context and allocator fragmentation; on the CPU with
    `rss`, the process itself and, with `heap_holes`, the heap's holes beside the activations (CPU_HEAP_HOLES)."""
    if r.rss:
        holes = CPU_HEAP_HOLES * act if _holes_counted(r) else 0
        details["overhead"] = ("the process itself: interpreter and libraries (peak RSS counts them)" +
                               (f" + {CPU_HEAP_HOLES:.0%} of activations (holes in the C heap)" if holes else ""))
        return CPU_PROCESS_BYTES + holes
    details["overhead"] = "GPU context and workspaces 0.5 GiB + 10% of activations (fragmentation)"
    return (GPU_CONTEXT_BYTES + FRAGMENTATION * (act + logits)) if r.device == "cuda" else 0


def _settings(r: _Run, p: _Params) -> dict:
    settings = {"method": r.method, "batch_size": r.B, "max_length": r.L,
                "lora_r": r.lora_r if r.lora else None,
                "target_modules": sorted({l.path for l in p.lora_mods}) if p.lora_mods else None, "dtype": r.dtype,
                "grad_checkpointing": bool(r.grad_checkpointing), "attn": r.attn, "optimizer": r.optimizer,
                "supervised_fraction": r.supervised_fraction,
                "lora_dropout": r.lora_dropout if (r.lora and r.lora_dropout > 0) else 0.0,
                "device": r.device, "grad_accum": r.grad_accum, "autocast": r.autocast,
                "long_context": r.long_context, "offload": r.offload, "chunked_head": r.chunked_head, "rss": r.rss,
                "heap_holes": _holes_counted(r), "huge_pages": r.huge_pages}
    if r.row.trains_base and not r.row.trains_all:
        settings["freeze_trainable_layers"] = p.trained_layers
    return settings


def estimate(config: Any, *, method: str = DEFAULT, batch_size: int = 1, max_length: int = 512, lora_r: int = 8,
             target_modules=None, dtype: str = "bf16", grad_checkpointing: bool = False, attn: str = "sdpa",
             optimizer: str = "adamw", supervised_fraction: float = 1.0, lora_dropout: float = 0.05,
             freeze_trainable_layers: int = 2, padded: bool = True, device: str = "cuda",
             grad_accum: int = 1, autocast: bool | None = None, long_context: bool = False, offload: bool = False,
             chunked_head: bool = False, rss: bool = False, heap_holes: bool = False,
             huge_pages: bool = False) -> MemoryEstimate:
    """Estimate the peak memory of one training step. See the module docstring for what is counted.

    config: a transformers PretrainedConfig, a config dict, a model directory/config.json/GGUF path, a hub
    id in the local cache, or a built-in name (`builtin_model_names()`).
    target_modules: None for the q/k/v/o projections, "all-linear", or a list of module names.
    supervised_fraction: share of positions where logits are computed (1.0: the standard forward).
    method: a row of roctune.method_rows (default: --method's default, lora).
    freeze_trainable_layers: for a method that trains chosen layers (freeze), how many of the last are trained.
    padded: batches are padded (an attention mask is materialised, SDPA repeats k/v for GQA).
    device: "cuda" (also ROCm) or "cpu": sets dropout-mask size and whether GPU overhead is added.
    autocast: forward under torch.autocast in bf16/fp16 (default: on the GPU, as roctune's trainer does);
    without it, peft's fp32 adapters get fp32 copies of their inputs.
    grad_accum: micro-batches per optimizer step. Above 1, the gradients of earlier micro-batches are alive
    while activations are; with 1, gradients appear only as activations are freed in backward, so the peak
    is the larger of the two (this matters for full/freeze, where gradients are as large as the weights).
    long_context (with grad_checkpointing): the MLP runs in sequence tiles inside the checkpointed layers;
    offload: their inputs wait in host memory (GPU); chunked_head: the frozen output layer runs in chunks (roctune's
    loss at supervised positions); rss: on the CPU, add the process's own memory (for comparing with peak RSS);
    heap_holes (with rss): add the heap's holes beside the activations (CPU_HEAP_HOLES; not where every large
    allocation gets its own mapping, roctune.hardware.allocator); huge_pages: large tensors on huge pages, where
    hidden states of 2 MiB and more leave few holes.
    roctune.memory.plan.estimate_run sets these as `train` does.
    """
    arch = config if isinstance(config, Architecture) else Architecture.from_config(config)
    r = _checked_run(arch, method, batch_size, max_length, lora_r, dtype, grad_checkpointing, attn, optimizer,
                     supervised_fraction, lora_dropout, padded, device, grad_accum, autocast,
                     long_context=long_context, offload=offload, chunked_head=chunked_head, rss=rss,
                     heap_holes=heap_holes, huge_pages=huge_pages)
    notes: list[str] = []
    details: dict[str, str] = {}
    p = _parameters(r, target_modules, freeze_trainable_layers, details)
    grads = p.trainable * 4
    details["gradients"] = f"{p.trainable:,} x 4 bytes"
    opt_bytes = _optimizer_states(r.optimizer, p.trainable, details)
    act, recompute = _activations(r, p, details)
    sup_tokens = r.T * r.supervised_fraction
    if r.chunked_head:
        # kept: d logp / d hidden per position (fp32) and the supervised rows of the hidden state; transient: one
        # chunk's logits, their log-softmax and its gradient
        logits = sup_tokens * arch.hidden * (4 + r.s) + 3 * 4 * HEAD_CHUNK_ELEMENTS
        details["logits_loss"] = (f"chunked output layer: {sup_tokens:,.0f} positions x {arch.hidden:,} hidden kept + "
                                  "one chunk of logits")
    else:
        logits = 12 * sup_tokens * arch.vocab  # fp32 log-softmax output, its gradient and the logits' gradient
        details["logits_loss"] = f"{sup_tokens:,.0f} positions x {arch.vocab:,} vocab x 12 bytes (fp32 loss + gradients)"
    step_ws = _step_workspace(r, p, details)
    not_together = _not_concurrent(r, act, recompute, logits, grads, step_ws, details)
    overhead = _overhead(r, act, logits, details)
    breakdown = {"weights": int(p.weights), "trainable_params": int(p.trainable_bytes),
                 "autocast_copies": int(p.copies), "gradients": int(grads), "optimizer_states": int(opt_bytes),
                 "activations": int(act), "logits_loss": int(logits), "optimizer_step": int(step_ws),
                 "not_concurrent": int(not_together), "overhead": int(overhead)}
    if r.attn == "flash_attention_2" and r.dtype == "fp32":
        notes.append("flash_attention_2 needs bf16/fp16")
    # offloaded: every checkpointed layer's input waits in pinned host memory
    host = (p.trained_layers if not r.lora else arch.layers) * r.T * arch.hidden * r.s if r.offload else 0
    return MemoryEstimate(model=arch.name, settings=_settings(r, p), total_params=arch.total_params,
                          trainable_params=int(p.trainable), breakdown=breakdown, notes=notes,
                          details={k: v for k, v in details.items() if breakdown.get(k)}, host_bytes=int(host))
