"""The training methods, one row each: what a method trains, what it needs, and what its run can be used for.

A method is a file (roctune/methods/NAME.py with `check(cfg, meta, leaves)` and `build(cfg, setup, base_model, log,
scalar_head)`) and a row here. Everything that depends on the method asks its row instead of naming it: the
settings (`--method`'s choices and help, FSDP, --resume, --kl-beta and --use-dora need an adapter), the checks
before loading (an --adapter to continue, the bitsandbytes probe of a 4-bit base), the memory estimate (what is
stored per parameter, what trains), the out-of-memory advice, GRPO's vLLM rollouts, and every consumer of a run
(a 4-bit base loaded as trained for chat, eval and merge). Nothing else lists the methods.

DoRA and rsLoRA are LoRA's options (--use-dora, --use-rslora), not methods: peft builds them from LoRA's config.

The method files are named as "module" strings and imported where they are used: this table sits in the facts
layer, below the settings, the memory estimate and the run directory that ask it (tests/test_layers.py), and
importing it costs nothing (the memory estimate imports no torch).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    """One training method. The flags a method cannot honour are refused from these fields."""
    name: str
    help: str  # --method's help after the name ("" for none)
    zh: str
    module: str  # roctune.methods.NAME: check() before loading, build() the trainable model
    adapter: bool = False  # trains a LoRA adapter on a frozen base: saved as adapter files, --adapter continues
    #                        one, --use-dora/--modules-to-save apply, the base with the adapter off is a free reference
    quantized: bool = False  # the frozen base is stored in 4 bits (bitsandbytes): probed before loading, computed in
    #                          half precision, loaded 4-bit again to answer as trained, merged dequantized, no FSDP
    trains_base: bool = False  # base weights train (in fp32, under autocast): a whole model is saved
    trains_all: bool = False  # every parameter trains, the embedding and output layer too (else: chosen layers)
    fsdp: bool = True  # --fsdp can shard it
    resume: bool = True  # --resume reloads its checkpoints
    vllm_loadable: bool = False  # vLLM holds the policy as trained (its base as stored + the adapter sent each step):
    #                              GRPO's --rollout-engine vllm
    lighter: tuple[str, ...] = ()  # the methods to try, in this order, when a run does not fit in memory

    def load(self):
        return importlib.import_module(self.module)


ROWS = (
    Method("lora", "", "", "roctune.methods.lora", adapter=True, vllm_loadable=True, lighter=("qlora",)),
    Method("qlora", "LoRA on a 4-bit NF4 base (bitsandbytes)", "在 4 位 NF4 基础模型上做 LoRA（bitsandbytes）",
           "roctune.methods.qlora", adapter=True, quantized=True, fsdp=False),
    Method("freeze", "train only the last N layers", "只训练最后 N 层", "roctune.methods.freeze", trains_base=True,
           resume=False, lighter=("lora",)),
    Method("full", "every parameter", "训练全部参数", "roctune.methods.full", trains_base=True,
           trains_all=True, resume=False,
           lighter=("lora", "qlora")),
)
METHODS = {m.name: m for m in ROWS}
NAMES = tuple(METHODS)
DEFAULT = NAMES[0]  # --method's default, and the method of an adapter folder that does not say (a plain PEFT one)


def able(capability: str) -> tuple[str, ...]:
    """The methods whose row has `capability` (a Method field), for messages naming where a flag works."""
    return tuple(m.name for m in ROWS if getattr(m, capability))


def help_text(zh: bool = False) -> str:
    """--method's help: each method and what it trains, from the rows."""
    sep, colon = ("；", "：") if zh else ("; ", ": ")
    return sep.join(m.name + (colon + (m.zh if zh else m.help) if m.help else "") for m in ROWS)
