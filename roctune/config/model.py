"""The base model, the method (roctune.method_rows' rows) and the stage (roctune.stages' rows), and the checks their
rows make: the flags a stage's recipe or a method cannot honour, and the settings of a stage's own section given to
another stage, each refused in one line naming the flag and where it works."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from roctune import method_rows, stages
from roctune.config.schema import flag, setting
from roctune.errors import ConfigError, either

METHODS = method_rows.NAMES  # roctune.method_rows: one row and one file each
STAGES = stages.NAMES  # roctune.stages: one row and one recipe each


@dataclass
class ModelSettings:
    # ---- model and method
    model: str | None = setting(None, "base model: local dir or hub id (default: bundled SmolLM2-135M-Instruct)",
                                metavar="NAME", group="model",
                resume_fixed=True,
                zh=("基础模型", "基础模型：本地目录或 Hub ID（默认：自带的 SmolLM2-135M-Instruct）"))
    method: str = setting(method_rows.DEFAULT, method_rows.help_text(), choices=METHODS, group="model",
                key_aliases=("finetuning_type",), resume_fixed=True,
                zh=("微调方法", method_rows.help_text(zh=True)))
    stage: str = setting(stages.DEFAULT, stages.help_text(), choices=STAGES, group="model",
                         resume_fixed=True,
                         zh=("训练阶段", stages.help_text(zh=True)))
    adapter: str | None = setting(None, "start from this LoRA adapter (e.g. the SFT run before dpo)", metavar="DIR",
                                  group="model",
                resume_fixed=True,
                zh=("起始适配器", "从这个 LoRA 适配器开始训练（例如 dpo 之前的 SFT 运行）"))
    trust_remote_code: bool = setting(False, "run code from the model repository (off by default; command line only)",
                                      group="model", cli_only=True,
                zh=("信任远程代码", "运行模型仓库中的代码（默认关闭；只能在命令行开启）"))

    def check(self) -> None:
        """--adapter's folder, then what the stage's and the method's rows say about the other settings."""
        if self.adapter and not os.path.isdir(self.adapter):
            raise ConfigError(f"--adapter {self.adapter}: no such directory", key="no_such_dir", field="adapter",
                              path=self.adapter)
        self._check_stage()
        self._check_method()
        self._check_stage_settings()

    def _check_stage(self) -> None:
        """The flags the stage's recipe does not implement (roctune.stages: its row's capabilities)."""
        row = stages.STAGES[self.stage]
        used = {"streaming": self.streaming, "truncation": self.truncation != "right",
                "sequence_parallel": self.sequence_parallel > 1, "fsdp": self.fsdp}
        for capability, name in stages.CAPABILITIES:
            if used[capability] and not getattr(row, capability):
                shown = {"truncation": f"--truncation {self.truncation}",
                         "sequence_parallel": f"--sequence-parallel {self.sequence_parallel}"}.get(capability, name)
                raise ConfigError(f"{shown} is for --stage {either(stages.able(capability))} (it does not support "
                                  f"--stage {self.stage}); drop {name}")

    def _check_method(self) -> None:
        """The flags the method cannot honour (roctune.method_rows: its row)."""
        method = method_rows.METHODS[self.method]
        if self.fsdp and not method.fsdp:
            raise ConfigError(f"--fsdp cannot shard a 4-bit ({self.method}) base model; use --method "
                              f"{either(method_rows.able('fsdp'))} with --fsdp, or {self.method} without --fsdp")
        if self.resume and not method.resume:
            raise ConfigError(f"--resume is not supported with --method {self.method} yet (checkpoints of a "
                              "whole model are saved but not reloaded); start a new run")
        if self.use_dora and not method.adapter:
            raise ConfigError(f"--use-dora is a LoRA variant; it does not apply to --method {self.method}")

    def _check_stage_settings(self) -> None:
        """A setting of a stage's own section (its row names it; another row may share one, as kto shares dpo's
        --beta) changed on a stage that does not use it: refused in one line naming the flag and the stages that use
        it. The settings that say what they do come first (--rollout-engine before the rollouts' sizes)."""
        refused = []
        for owner in stages.ROWS:
            section = owner.load_settings()
            if section is None or owner.name == self.stage:
                continue
            for f in dataclasses.fields(section):
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                users = [r.name for r in stages.ROWS if r.owns(section) or f.name in r.shares]
                if getattr(self, f.name) != default and self.stage not in users:
                    refused.append((f.metadata["does"] is None, f.metadata["does"] or section.DOES, f.name, users))
        if refused:
            _, does, name, users = min(refused, key=lambda r: r[0])
            raise ConfigError(f"{flag(name)} {does} --stage {either(users)}; drop it for --stage {self.stage}")
