"""The base model, the method (lora, qlora, freeze, full) and the stage (roctune.stages' rows)."""
from __future__ import annotations

from dataclasses import dataclass
from roctune import stages

from roctune.config.schema import setting

METHODS = ("lora", "qlora", "freeze", "full")
STAGES = stages.NAMES  # roctune.stages: one row and one recipe each


@dataclass
class ModelSettings:
    # ---- model and method
    model: str | None = setting(None, "base model: local dir or hub id (default: bundled SmolLM2-135M-Instruct)",
                                metavar="NAME", group="model",
                resume_fixed=True,
                zh=("基础模型", "基础模型：本地目录或 Hub ID（默认：自带的 SmolLM2-135M-Instruct）"))
    method: str = setting("lora", "lora; qlora: LoRA on a 4-bit NF4 base (bitsandbytes); freeze: train only the "
                          "last N layers; full: every parameter", choices=METHODS, group="model",
                key_aliases=("finetuning_type",), resume_fixed=True,
                zh=("微调方法", "lora；qlora：在 4 位 NF4 基础模型上做 LoRA（bitsandbytes）；freeze：只训练最后 N 层；full：训练全部参数"))
    stage: str = setting("sft", stages.help_text(), choices=STAGES, group="model",
                         resume_fixed=True,
                         zh=("训练阶段", stages.help_text(zh=True)))
    adapter: str | None = setting(None, "start from this LoRA adapter (e.g. the SFT run before dpo)", metavar="DIR",
                                  group="model",
                resume_fixed=True,
                zh=("起始适配器", "从这个 LoRA 适配器开始训练（例如 dpo 之前的 SFT 运行）"))
    trust_remote_code: bool = setting(False, "run code from the model repository (off by default; command line only)",
                                      group="model", cli_only=True,
                zh=("信任远程代码", "运行模型仓库中的代码（默认关闭；只能在命令行开启）"))
