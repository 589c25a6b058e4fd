"""TrainConfig: every training setting, one flat dataclass assembled from the sections (roctune/config/*.py),
each of which declares its fields and checks them next to them. The flag and YAML names are the field names, so
old config files and run.yaml files keep loading. `validate()` checks each field's own rules, then each section's
checks of the settings that depend on each other (the model section's: what the stage's and the method's rows
say). The sections are roctune.config.sections.SECTIONS: the common ones and those the stages' rows name."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from roctune.config.schema import _check_utf8, check_value
from roctune.config.sections import SECTIONS


# The bases are the sections last first, so the fields (flags, --help, the web UI's form) come in SECTIONS' order.
@dataclass
class TrainConfig(*reversed(SECTIONS)):
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> "TrainConfig":
        """Bounds and choices of every field, then each section's checks of the settings that depend on each
        other (its `check` method, beside its fields), in SECTIONS' order."""
        for f in dataclasses.fields(self):
            check_value(f, getattr(self, f.name))
            _check_utf8(f.name, getattr(self, f.name))
        self.check()
        return self

    def check(self) -> None:
        """Each section's own checks (its `check` method), in SECTIONS' order."""
        for section in SECTIONS:
            if "check" in vars(section):
                section.check(self)
