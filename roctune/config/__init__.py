"""Training settings, declared once, in sections.

Each setting is one dataclass field made by `setting()` (roctune/config/schema.py): its type, default, help,
choices and bounds. The fields live in sections, one file each, next to the checks of the settings they declare:
data, model and stage, dpo's preference loss, grpo, optimisation, LoRA and freeze, logging and checkpoints,
hardware, processes, long sequences. `TrainConfig` (train.py) is all of them as one flat dataclass, so the flag
and YAML names stay plain (`--lr`, `pref_loss: simpo`). From those declarations come the `roctune train` flags
(`add_flags`), the YAML file and `key=value` overrides (`apply`, with LLaMA-Factory's names as aliases), the web
UI's form (`form_fields`) and the range checks (`TrainConfig.validate`). Order of precedence: defaults, then
--config FILE.yaml, then flags, then key=value overrides.

`trust_remote_code` is taken only from the command line: a YAML file or an override that sets it is refused, so
a config file someone sent you cannot make roctune run a model repository's code.

The sections are one tuple, `SECTIONS` (sections.py): TrainConfig's bases, the order of their checks, and the
YAML aliases and the settings a resumed run must keep, collected from the fields' own declarations. A new stage's
settings are one section file, named by the stage's row in roctune.stages; nothing else in this package changes.
"""
from __future__ import annotations

from roctune.config.grpo import LOSS_TYPES, REWARDS, ROLLOUT_ENGINES
from roctune.config.long import ROPE_TYPES, TRUNCATIONS, rope_scaling_parts
from roctune.config.lora import DEFAULT_TARGET_MODULES
from roctune.config.model import METHODS, STAGES
from roctune.config.pref import PREF_LOSSES, SMOOTHED
from roctune.config.run import TRACKERS
from roctune.config.schema import check_number, check_value, coerce, flag, kind, setting
from roctune.config.sections import ALIASES, RESUME_FIXED, SECTIONS
from roctune.config.sources import (GROUP_TITLES, GROUP_TITLES_ZH, add_flags, apply, check_settings, fields,
                                    form_fields, from_sources, load_yaml, parse_overrides)
from roctune.config.train import TrainConfig

__all__ = ["ALIASES", "DEFAULT_TARGET_MODULES", "GROUP_TITLES", "GROUP_TITLES_ZH", "LOSS_TYPES", "METHODS",
           "PREF_LOSSES", "RESUME_FIXED", "REWARDS", "ROLLOUT_ENGINES", "ROPE_TYPES", "SECTIONS", "SMOOTHED", "STAGES",
           "TRACKERS", "TRUNCATIONS", "TrainConfig", "add_flags", "apply", "check_number", "check_settings",
           "check_value", "coerce", "fields", "flag", "form_fields", "from_sources", "kind", "load_yaml",
           "parse_overrides", "rope_scaling_parts", "setting"]
