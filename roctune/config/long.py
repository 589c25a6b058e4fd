"""Long sequences (issue 36): one example over several processes, positions past the native context,
what happens to an example longer than --max-length."""
from __future__ import annotations

from dataclasses import dataclass
import math

from roctune.config.schema import setting
from roctune.errors import ConfigError

TRUNCATIONS = ("right", "left", "split")  # roctune.data.render.truncate
ROPE_TYPES = ("linear", "dynamic", "yarn", "llama3")  # transformers' rope_type names (modeling_rope_utils)


@dataclass
class LongSettings:
    # ---- long sequences (issue 36): one example over several processes, positions past the native context
    sequence_parallel: int = setting(1, "split each example's tokens over N processes (Ulysses: an all-to-all over "
                                     "attention heads; where the heads do not divide by N, an all-gather of keys "
                                     "and values); N divides --nproc x --nnodes; the other factor is data "
                                     "parallelism (sft)", ge=1, metavar="N", group="processes",
                zh=("序列并行", "把每个样本的 token 分到 N 个进程（Ulysses：按注意力头做 all-to-all；头数不能被 N 整除时改为收集所有进程的键和值）；N 须整除进程总数；剩下的倍数是数据并行（sft）"))
    truncation: str = setting("right", "an example longer than --max-length: right cuts its end, left its start "
                              "(keeps the latest turns), split makes it several examples of --max-length tokens "
                              "(documents, long answers; the prompt is not repeated) (sft)", choices=TRUNCATIONS,
                              group="data",
                resume_fixed=True,
                zh=("截断方式", "超过最大长度的样本：right 截掉结尾，left 截掉开头（保留最近几轮），split 切成多个最大长度的样本（文档、长回答；不重复提示词）（sft）"))
    rope_scaling: str = setting("", "stretch the rotary positions past the model's native context, TYPE:FACTOR "
                                f"with TYPE one of {', '.join(ROPE_TYPES)} (e.g. yarn:4); kept in run.yaml and the "
                                "merged/exported model", metavar="TYPE:FACTOR", group="data",
                resume_fixed=True,
                zh=("RoPE 缩放", "把旋转位置编码拉伸到模型原生上下文之外，TYPE:FACTOR，TYPE 为 linear、dynamic、yarn、llama3（例如 yarn:4）；记录在 run.yaml 和合并/导出的模型中"))

    def check(self) -> None:
        """--sequence-parallel and --rope-scaling against the other settings (the model's heads and context are
        checked before it loads, in roctune.training.sequence_parallel and roctune.models)."""
        rope_scaling_parts(self.rope_scaling)
        if self.truncation == "split" and self.max_length < 2:
            raise ConfigError("--truncation split needs --max-length 2 or more (windows overlap by one token)")
        p, world = self.sequence_parallel, self.nproc * self.nnodes
        if p == 1:
            return
        if world % p:
            raise ConfigError(f"--sequence-parallel {p} must divide the {world} processes (--nproc x --nnodes); "
                              f"use --nproc {p} (or a multiple of it)")
        for on, what, fix in ((self.fsdp, "--fsdp", "drop --fsdp (it composes with DDP: each group keeps a copy)"),
                              (self.packing == "on", "--packing on", "use --packing off or auto")):
            if on:
                raise ConfigError(f"--sequence-parallel does not support {what} yet; {fix}")



def rope_scaling_parts(text: str) -> tuple[str, float] | None:
    """--rope-scaling TYPE:FACTOR as (type, factor), None when empty; a ConfigError naming the fix otherwise."""
    if not text:
        return None
    kind_, _, factor = text.partition(":")
    try:
        value = float(factor)
    except ValueError:
        value = float("nan")
    if kind_ not in ROPE_TYPES or not math.isfinite(value) or value <= 1:
        raise ConfigError(f"--rope-scaling {text!r}: expected TYPE:FACTOR with TYPE one of {', '.join(ROPE_TYPES)} "
                          "and FACTOR > 1 (e.g. yarn:4 for four times the native context)")
    return kind_, value

