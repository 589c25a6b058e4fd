"""The settings sections, in one tuple that everything else is built from: TrainConfig is their union (train.py),
their `check` methods run in this order, and the other names a YAML file may use (ALIASES) and the settings a
resumed run must keep (RESUME_FIXED) are collected from their fields' declarations (`setting(key_aliases=...,
resume_fixed=True)`).

The common sections are listed here; a stage's own section (dpo's preference loss, kto's weights, grpo's
rollouts and rewards) is named by the stage's row in roctune.stages, so a new stage adds its settings with its row
and nothing here changes. Fields are shown (flags, --help, the web UI's form) in this order: data and model first,
then the stages' sections, then the rest.

Components that keep some settings as parameters of their own (the losses) declare those fields with `mirror`, so
the defaults stay the settings' and one `from_config` fills them."""
from __future__ import annotations

import dataclasses
from typing import Any

from roctune import stages
from roctune.config.data import DataSettings
from roctune.config.hardware import HardwareSettings
from roctune.config.long import LongSettings
from roctune.config.lora import LoraSettings
from roctune.config.model import ModelSettings
from roctune.config.optim import OptimSettings
from roctune.config.processes import ProcessSettings
from roctune.config.run import RunSettings
from roctune.config.vision import VisionSettings

SECTIONS = (DataSettings, ModelSettings,
            *(row.load_settings() for row in stages.ROWS if row.settings),
            OptimSettings, LoraSettings, VisionSettings, RunSettings, HardwareSettings, ProcessSettings, LongSettings)

_FIELDS = [f for section in SECTIONS for f in dataclasses.fields(section)]

# Other names users know a setting by (LLaMA-Factory's spelling), from each field's key_aliases.
ALIASES = {alias: f.name for f in _FIELDS for alias in f.metadata["key_aliases"]}

# What defines a run: a resumed run continues the same training, so these must be what run.yaml recorded (the step
# plan, the adapter's shape and the data order depend on them). Schedules, step counts, logging and evaluation may
# change (a larger --max-steps continues a finished run).
RESUME_FIXED = tuple(f.name for f in _FIELDS if f.metadata["resume_fixed"])

_BY_NAME = {f.name: f for f in _FIELDS}


def mirror(name: str) -> Any:
    """A field of a component's own frozen parameters (a loss's settings: roctune.training.pref_losses, kto_loss,
    grpo_loss) that holds the training setting `name`: its default is the one the setting declares, so the two
    cannot disagree, and `from_config` fills it from a run's config."""
    f = _BY_NAME[name]
    assert f.default_factory is dataclasses.MISSING, f"{name}: a list setting cannot be mirrored"
    return dataclasses.field(default=f.default, metadata={"setting": name})


def from_config(cls, cfg) -> Any:
    """An instance of `cls` (a dataclass of `mirror` fields) with the values of `cfg`'s settings."""
    return cls(**{f.name: getattr(cfg, f.metadata["setting"]) for f in dataclasses.fields(cls)
                  if "setting" in f.metadata})
