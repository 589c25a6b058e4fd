"""TrainConfig: every training setting, one flat dataclass assembled from the sections (roctune/config/*.py),
each of which declares its fields and checks them next to them. The flag and YAML names are the field names, so
old config files and run.yaml files keep loading. `validate()` checks each field's own rules, then the settings
that depend on each other: the stage's capabilities (roctune.stages), then each section's checks. The sections are
roctune.config.sections.SECTIONS: the common ones and those the stages' rows name."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from roctune import stages
from roctune.config.schema import _check_utf8, check_value
from roctune.config.sections import SECTIONS
from roctune.errors import ConfigError


# The bases are the sections last first, so the fields (flags, --help, the web UI's form) come in SECTIONS' order.
@dataclass
class TrainConfig(*reversed(SECTIONS)):
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> "TrainConfig":
        """Bounds and choices of every field, then the settings that conflict with each other."""
        for f in dataclasses.fields(self):
            check_value(f, getattr(self, f.name))
            _check_utf8(f.name, getattr(self, f.name))
        if not self.data:
            raise ConfigError("no training data: pass --data FILE (alpaca, messages, sharegpt or prompt/completion "
                              "JSON/JSONL)", key="no_data", field="data")
        if not self.output:
            raise ConfigError("no output directory: pass --output DIR", key="no_output", field="output")
        self._check_conflicts()
        return self

    def _check_conflicts(self) -> None:
        if self.max_steps <= 0 and self.epochs <= 0:
            raise ConfigError("set --epochs > 0 or --max-steps > 0", key="no_steps", field="max_steps")
        self._check_stage()
        if self.streaming and not self.data_cache:
            raise ConfigError("--streaming tokenizes into the data cache; drop --no-data-cache (or --streaming)")
        if self.resume and self.overwrite:
            raise ConfigError("--resume continues a run and --overwrite replaces it; pass one of them",
                              key="resume_and_overwrite", field="overwrite")
        if self.method == "qlora" and self.fsdp:
            raise ConfigError("--fsdp cannot shard a 4-bit (qlora) base model; use --method lora with --fsdp, "
                              "or qlora without --fsdp")
        if self.resume and self.method in ("freeze", "full"):
            raise ConfigError(f"--resume is not supported with --method {self.method} yet (checkpoints of a "
                              "whole model are saved but not reloaded); start a new run")
        if self.adapter and not os.path.isdir(self.adapter):
            raise ConfigError(f"--adapter {self.adapter}: no such directory", key="no_such_dir", field="adapter",
                              path=self.adapter)
        if self.use_dora and self.method not in ("lora", "qlora"):
            raise ConfigError(f"--use-dora is a LoRA variant; it does not apply to --method {self.method}")
        if not self.freeze_trainable_modules:
            raise ConfigError("freeze-trainable-modules is empty; name modules (e.g. mlp self_attn) or all")
        if self.node_rank >= self.nnodes:
            raise ConfigError(f"--node-rank must be in 0..{self.nnodes - 1} for --nnodes {self.nnodes} (got {self.node_rank})")
        if self.fsdp and self.nproc * self.nnodes < 2:
            raise ConfigError("--fsdp shards the model over several processes; add --nproc N (N >= 2)")
        if not self.target_modules:
            raise ConfigError("target-modules is empty; name modules (e.g. q_proj v_proj), auto or all-linear")
        self._check_pt()
        self.check()

    def check(self) -> None:
        """Each section's own checks (its `check` method), in SECTIONS' order."""
        for section in SECTIONS:
            if "check" in vars(section):
                section.check(self)

    def _check_stage(self) -> None:
        """The flags the stage's recipe does not implement (roctune.stages: its row's capabilities)."""
        row = stages.STAGES[self.stage]
        used = {"streaming": self.streaming, "truncation": self.truncation != "right",
                "sequence_parallel": self.sequence_parallel > 1, "fsdp": self.fsdp}
        for capability, name in stages.CAPABILITIES:
            if used[capability] and not getattr(row, capability):
                shown = {"truncation": f"--truncation {self.truncation}",
                         "sequence_parallel": f"--sequence-parallel {self.sequence_parallel}"}.get(capability, name)
                *rest, last = stages.able(capability)
                able = f"{', '.join(rest)} or {last}" if rest else last
                raise ConfigError(f"{shown} is for --stage {able} (it does not support --stage {self.stage}); "
                                  f"drop {name}")

    def _check_pt(self) -> None:
        """A stage that learns raw text (pt): the chat template and the settings of answers have nothing to act on."""
        if stages.STAGES[self.stage].chat:
            return
        for on, name in ((self.template is not None, f"--template {self.template}"),
                         (not self.learn_reasoning, "--no-learn-reasoning"),
                         (self.empty_think != "learn", f"--empty-think {self.empty_think}")):
            if on:
                raise ConfigError(f"{name} acts on chat conversations; --stage {self.stage} learns raw text "
                                  f"without a chat template: drop {name.split()[0]}")
