"""Optimisation: steps, learning rate and its schedule, batches, packing, memory savers."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.config.schema import setting
from roctune.errors import ConfigError


@dataclass
class OptimSettings:
    # ---- optimisation
    # the upper bounds: far beyond any real run, low enough that the step plan (a list per step) is built at once
    max_steps: int = setting(-1, "optimizer steps (overrides --epochs when > 0)", le=10_000_000, unset=-1,
                zh=("最大步数", "优化器步数（大于 0 时覆盖“训练轮数”）"))
    epochs: float = setting(1.0, "passes over the training data", ge=0, le=100_000,
                zh=("训练轮数", "遍历训练数据的次数"))
    lr: float = setting(2e-4, "peak learning rate", gt=0,
                zh=("学习率", "峰值学习率"))
    lr_scheduler: str = setting("linear", "learning-rate schedule after warm-up", choices=("linear", "cosine", "constant"),
                zh=("学习率调度", "预热之后的学习率变化方式"))
    warmup_ratio: float = setting(0.0, "fraction of steps spent warming up the learning rate", ge=0, le=1,
                zh=("预热比例", "用于预热学习率的步数比例"))
    weight_decay: float = setting(0.0, "AdamW weight decay", ge=0,
                zh=("权重衰减", "AdamW 权重衰减"))
    max_grad_norm: float = setting(1.0, "gradient clipping norm (0 turns it off)", ge=0,
                zh=("梯度裁剪", "梯度裁剪的范数（0 表示关闭）"))
    batch_size: int = setting(2, "examples per micro-batch", gt=0,
                resume_fixed=True,
                zh=("批大小", "每个微批次的样本数"))
    grad_accum: int = setting(4, "micro-batches per optimizer step", gt=0,
                resume_fixed=True,
                zh=("梯度累积", "每个优化器步骤累积的微批次数"))
    seed: int = setting(42, "random seed (data order, LoRA init, dropout)", ge=0, lt=2**63,
                resume_fixed=True,
                zh=("随机种子", "随机种子（数据顺序、LoRA 初始化、dropout）"))
    group_by_length: bool = setting(True, "batch examples of similar length together (less padding)",
                zh=("按长度分组", "把长度相近的样本放在同一批（更少填充）"))
    packing: str = setting("auto", "padding-free micro-batches", choices=("auto", "on", "off"),
                zh=("序列打包", "无填充的微批次"))
    loss_on_supervised_only: bool = setting(True, "compute the output layer only where labels are trained",
                zh=("只在监督位置计算输出层", "只在需要学习的标签位置计算输出层"))
    grad_checkpointing: bool = setting(False, "recompute activations in backward: less memory, ~30% slower",
                zh=("梯度检查点", "反向传播时重新计算激活：更省内存，约慢 30%"))
    offload: str = setting("auto", "checkpointed layer inputs in pinned host memory, copied while layers compute "
                           "(GPU); auto: from 16k tokens; on implies checkpointing", choices=("auto", "on", "off"),
                zh=("卸载到主机内存", "检查点层的输入放在锁页主机内存中，复制与计算重叠（GPU）；auto：从 16k 词元起；on 隐含梯度检查点"))
    auto_batch: bool = setting(False, "after an out-of-memory error, retry with half the micro-batch and twice the "
                               "accumulation (same examples per step)",
                zh=("自动批大小", "显存不足后，以一半的微批次和两倍的累积重试（每步样本数不变）"))

    def check(self) -> None:
        if self.max_steps <= 0 and self.epochs <= 0:
            raise ConfigError("set --epochs > 0 or --max-steps > 0", key="no_steps", field="max_steps")
