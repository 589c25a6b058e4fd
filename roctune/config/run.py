"""Logging, evaluation, checkpoints, trackers, and what happens to an existing --output."""
from __future__ import annotations

from dataclasses import dataclass
from roctune.config.schema import setting
from roctune.errors import ConfigError

TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio", "swanlab", "none")


@dataclass
class RunSettings:
    # ---- logging, evaluation, checkpoints
    save_steps: int = setting(0, "save a checkpoint every N steps (0: only at the end)", ge=0, group="run",
                zh=("保存间隔", "每 N 步保存一个检查点（0：只在结束时）"))
    save_total_limit: int = setting(2, "checkpoints to keep (0: all)", ge=0, group="run",
                zh=("保留检查点数", "保留的检查点数量（0：全部）"))
    logging_steps: int = setting(1, "log every N steps", gt=0, group="run",
                zh=("日志间隔", "每 N 步记录一次日志"))
    eval_steps: int = setting(0, "evaluate every N steps (0: at the end only)", ge=0, group="run",
                zh=("评估间隔", "每 N 步评估一次（0：只在结束时）"))
    early_stopping_patience: int = setting(0, "stop when eval loss has not improved for K evaluations (0: never); "
                                           "the best adapter is kept in DIR/best", ge=0, metavar="K", group="run",
                zh=("早停耐心", "评估损失连续 K 次没有改善就停止（0：从不）；最好的适配器保存在 DIR/best"))
    load_best: bool = setting(False, "make the final adapter the one with the best eval loss (kept in DIR/best)",
                              group="run",
                zh=("加载最佳", "让最终适配器成为评估损失最低的那个（保存在 DIR/best）"))
    report_to: list[str] = setting(["none"], "also log to these trackers (comma-separated; metrics.jsonl and "
                                   "loss.png always)", choices=TRACKERS, metavar="NAME", group="run",
                zh=("记录到", "同时记录到这些跟踪工具（逗号分隔；metrics.jsonl 和 loss.png 总会写）"))
    resume: bool = setting(False, "continue from the last checkpoint in --output", group="run",
                zh=("继续训练", "从“输出目录”中最后一个检查点继续"))
    overwrite: bool = setting(False, "replace a previous roctune run in --output", group="run",
                zh=("覆盖", "替换“输出目录”中以前的 roctune 运行"))

    def check(self) -> None:
        if self.resume and self.overwrite:
            raise ConfigError("--resume continues a run and --overwrite replaces it; pass one of them",
                              key="resume_and_overwrite", field="overwrite")
        has_eval = bool(self.eval_data) or self.eval_ratio > 0
        for name, on in (("--early-stopping-patience", self.early_stopping_patience > 0),
                         ("--load-best", self.load_best)):
            if on and not has_eval:
                raise ConfigError(f"{name} needs evaluation data: add --eval-data FILE or --eval-ratio 0.1")
        if self.early_stopping_patience > 0 and not self.eval_steps:
            raise ConfigError("--early-stopping-patience needs --eval-steps N (evaluations during training)")
        if "none" in self.report_to and len(self.report_to) > 1:
            raise ConfigError(f"--report-to {','.join(self.report_to)}: 'none' cannot be combined with trackers; "
                              "drop it")

