"""Regional torch.compile: the decoder layers compiled once per model, not per layer and not the whole model.

Why regional. Compiling the whole model takes minutes and breaks on the parts that are not graph-friendly (mask
building, the loss, peft's wrappers); every decoder layer of a model runs the same code on same-shaped tensors,
so one compiled layer serves all of them in seconds.

Why not `layer.compile()` on each layer. That compiles each module's own `_call_impl`: the compiled code guards on
the module object, so layer 2 misses layer 1's cache and recompiles, and after dynamo's recompile limit (8) the
remaining layers run eager (measured on the bundled 30-layer model). Here one function takes the layer as an
argument (`_run_layer`); dynamo inlines nn modules and treats their parameters as inputs, so its guards are on the
layer's class and structure, and every layer of the model (LoRA attached: peft's LoRA Linear is an nn.Module like
the rest) hits the same compiled code. Families whose layers differ (Gemma 2/3: sliding and global layers) compile
once per kind.

Dynamic lengths. `dynamic=True` compiles with symbolic sizes from the first call, so a new batch length does not
recompile (tests/test_compile.py counts dynamo's compiles across two lengths).

The output layer's chunks (roctune.training.losses.compile_head) are compiled beside the layers: outside them they
were a tenth of a compiled step (five passes over a [rows x vocabulary] tensor that inductor fuses); with them,
variable-length SFT on the CPU went from a median 1.10x eager to 1.17x-1.26x (scripts/compile_varlen.py --repeat 3).

What it wraps: the layer's `forward` as a whole, set on the instance. What runs inside it is traced: peft's LoRA and
roctune's MLP shortcuts (set as classes, not as forwards on each instance, so every layer passes the same guards:
roctune.training.activations.with_forward). Checkpointed layers (long sequences, --grad-checkpointing) are left
eager: torch.utils.checkpoint disables dynamo inside its call, so a compiled forward there would silently run eager
(`apply` says so instead).

When (`--compile auto`): once the run is long enough to earn the compile's seconds. On a GPU the step is
launch-bound (docs/gpu-check-h200.md: ~4,200 kernel launches per micro-batch, the GPU busy 25 of 268 ms) and fused
kernels pay. On the CPU (inductor's C++ kernels, so a C++ compiler is needed) the compiled step measured 1.25x eager
(bundled model, `roctune bench --compile --max-steps 20`: 4.68 against 5.86 s per step, the first step 11.7 s
longer), which earns the compile back after about 10 such steps; the same step threshold serves both, so short runs
(the demo, tests) stay eager and start at once.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from roctune.stages import DEFAULT, STAGES

log = logging.getLogger(__name__)

# --compile auto compiles when the run has at least this many optimizer steps: the compile takes ~10-60 s, a step
# of a small model on a GPU well under a second (on the CPU the bundled model's compile is earned back after ~10
# steps of 4.7 s), so shorter runs would spend more time compiling than the compiled steps save.
AUTO_MIN_STEPS = 200


@dataclass(frozen=True)
class Choice:
    value: bool
    reason: str


def choose_compile(setting: str, device: str, total_steps: int, stage: str = DEFAULT,
                   sequence_parallel: int = 1) -> Choice:
    """Whether to compile the decoder layers, and why (printed like the dtype choice)."""
    if setting == "on":
        return Choice(True, "--compile on")
    if setting == "off":
        return Choice(False, "--compile off")
    if STAGES[stage].samples:  # a new shape every token: compiled code would chase it
        return Choice(False, f"auto: {stage} generates through the layers (a new shape per token)")
    if sequence_parallel > 1:  # all-to-all collectives inside attention: not proven under compile
        return Choice(False, "auto: --sequence-parallel (its collectives run inside the layers; --compile on forces it)")
    if total_steps < AUTO_MIN_STEPS:
        return Choice(False, f"auto: {total_steps} steps is too short to earn the compile time "
                             f"(< {AUTO_MIN_STEPS}; --compile on forces it)")
    if device == "cpu":
        if not cpp_compiler():
            return Choice(False, "auto: CPU without a C++ compiler (inductor builds its CPU kernels with one: "
                                 "apt install g++, or set CXX)")
        return Choice(True, f"auto: CPU and {total_steps} steps (1.25x eager once compiled; one compile serves "
                            "every layer)")
    return Choice(True, f"auto: GPU and {total_steps} steps (launch-bound step; one compile serves every layer)")


def cpp_compiler() -> str | None:
    """The C++ compiler inductor would build CPU kernels with ($CXX, else g++ or clang++ on the PATH), or None."""
    import os
    import shutil

    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")


def _run_layer(layer, *args, **kwargs):
    """The layer's own class forward; compiled once, with the layer as an argument (see the module docstring)."""
    return type(layer).forward(layer, *args, **kwargs)


@functools.lru_cache(maxsize=4)
def _compiled(backend: str):
    import torch
    import torch._inductor.config

    # random ops (LoRA dropout's masks) call torch's own generator as eager does, instead of inductor's: a compiled
    # run draws the eager run's masks for the same seed, so it reproduces it and resumes exactly (tested losses)
    torch._inductor.config.fallback_random = True
    # inductor's generated CPU kernels keep its default: as many threads as torch's own ops (one OpenMP runtime,
    # torch's libgomp, serves both). Measured alone, bundled model, 2 cores: the compiled layers took 2.72 s of two
    # profiled steps on one thread and 1.29 s on two, with aten::mm unchanged (8.1 / 7.5 s): 1.13x eager on one
    # thread, 1.21x on two. (One thread was set earlier after aten::mm ran 10x slower beside multi-threaded
    # kernels; alone, with the shortcuts set as classes, that does not happen: the figures above.)
    return torch.compile(_run_layer, dynamic=True, backend=backend)


def decoder_layers(model) -> list:
    """The decoder layers of a transformers model (under peft or not): the entries of its `layers` ModuleList."""
    import torch.nn as nn

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else getattr(base, "model", base)
    layers = getattr(decoder, "layers", None)
    return list(layers) if isinstance(layers, nn.ModuleList) else []


def compile_layers(model, backend: str = "inductor") -> int:
    """Route every decoder layer's forward through the one compiled `_run_layer` (`backend`: torch.compile's;
    tests use aot_eager to check the capture without inductor's C++ build). Returns how many layers."""
    layers = decoder_layers(model)
    fn = _compiled(backend)
    for layer in layers:
        layer.forward = functools.partial(fn, layer)
    return len(layers)


def apply(model, setting: str, device: str, total_steps: int, stage: str = DEFAULT, sequence_parallel: int = 1) -> str:
    """Choose (`choose_compile`) and, when on, compile the layers; returns the line for the log."""
    choice = choose_compile(setting, device, total_steps, stage, sequence_parallel)
    if not choice.value:
        return f"compile: off ({choice.reason})"
    if any(getattr(layer, "gradient_checkpointing", False) for layer in decoder_layers(model)):
        # torch.utils.checkpoint runs the layer with dynamo disabled (torch._disable_dynamo): compiled layers
        # inside it would run eager (tests/test_compile.py counts no graph), so say so instead of pretending
        return (f"compile: off (checkpointed layers: torch's checkpoint runs them with torch.compile disabled; "
                f"{choice.reason})")
    if setting == "auto":  # a compile roctune chose falls back to eager where dynamo or inductor fails (a warning)
        import torch._dynamo

        torch._dynamo.config.suppress_errors = True
    n = compile_layers(model)
    if not n:
        return f"compile: off (no decoder layers found in {type(model).__name__}; {choice.reason})"
    same_inputs(model)
    from roctune.training.losses import compile_head

    compile_head(model)
    return (f"compile: on ({choice.reason}); {n} decoder layers share one compiled forward; the output layer's "
            "chunks compiled too")


def same_inputs(model) -> None:
    """Make the first decoder layer's input require grad like every later layer's.

    Why: dynamo guards on each tensor input's requires_grad. With frozen embeddings (LoRA, QLoRA, freeze) layer 0
    gets a hidden state that needs no grad and layers 1.. one that does, so the shared forward compiled twice (the
    "requires_grad guard" recompile logged on variable-length SFT: steps 1-8 ran at 0.85-0.96x eager). One forward
    hook on the input embeddings (transformers' `enable_input_require_grads`) gives every layer the same guards:
    one graph; the LoRA gradients are unchanged (only the embedding output's grad is computed, and dropped)."""
    enable = getattr(model, "enable_input_require_grads", None)
    if enable is not None and any(not p.requires_grad for p in model.get_input_embeddings().parameters()):
        enable()


def uncompile_layers(model) -> None:
    """Back to the class forward (eager), and the output layer's chunks too."""
    from roctune.training.losses import uncompile_head

    for layer in decoder_layers(model):
        layer.__dict__.pop("forward", None)
    uncompile_head(model)
