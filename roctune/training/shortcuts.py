"""Which of roctune's shortcuts a model gets: opt-in per family (roctune.families), never guessed.

The shortcuts replace parts of the model's own computation (activations.py: LoRA dropout, the gated MLP;
losses.py: the output layer at supervised positions, chunked). Each computes exactly what the model's code computes
only for the code it was written against, so a model gets a shortcut only when
- its config's model_type is a family in the table and the family lists the shortcut as proven (the matrix test,
  tests/test_families.py, checks it against plain transformers + PEFT), and
- its modules are the transformers classes the family names (a repository's own code with the same model_type,
  loaded with --trust-remote-code, is not what was proven).
Everything else runs the plain transformers + PEFT path, and `describe` says so in one line.
"""
from __future__ import annotations

from dataclasses import dataclass

from roctune.families import Family, config_value, family_of, known_names
from roctune.training.losses import Head


@dataclass(frozen=True)
class Plan:
    family: Family | None
    on: frozenset            # the shortcuts this model gets
    why_plain: str = ""      # why it gets none, when it gets none
    head: Head | None = None  # the supervised-positions output layer, when "supervised_head" is on

    def describe(self) -> str:
        if self.family is None or not self.on:
            return f"plain transformers + PEFT path ({self.why_plain})"
        return f"model family {self.family.name}: shortcuts {', '.join(sorted(self.on))}"


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _is_transformers_class(obj, name: str) -> bool:
    cls = type(obj)
    return cls.__name__ == name and cls.__module__.startswith("transformers.models.")


def plan(model) -> Plan:
    """The shortcuts `model` (a transformers model, under a peft wrapper or not) may use, and its output Head."""
    base = _base(model)
    config = base.config
    family = family_of(config)
    if family is None:
        return Plan(None, frozenset(), f"model type {config.model_type!r} is not in roctune's family table "
                                       f"({known_names()})")
    if not _is_transformers_class(base, family.causal_lm):
        return Plan(family, frozenset(), f"{type(base).__module__}.{type(base).__name__} is not transformers' "
                                         f"{family.causal_lm}, which roctune's shortcuts were proven on")
    on = set(family.shortcuts)
    if not any(type(m).__name__ in family.mlp_classes and type(m).__module__.startswith("transformers.models.")
               for m in base.modules()):
        on.discard("gated_mlp")
    head = None
    if "supervised_head" in on and hasattr(base, "get_decoder") and base.get_output_embeddings() is not None:
        divisor = config_value(config, family.logits_divisor)
        head = Head(divisor=float(divisor) if divisor else 1.0,
                    softcap=float(config_value(config, family.logits_softcap) or 0) or None,
                    chunked="chunked_head" in on)
    else:
        on -= {"supervised_head", "chunked_head"}
    return Plan(family, frozenset(on), "" if on else "no shortcut applies", head)


def output_head(model, supervised_only: bool = True) -> Head | None:
    """The Head for the loss functions, or None for the model's own forward (the plain path)."""
    return plan(model).head if supervised_only else None
