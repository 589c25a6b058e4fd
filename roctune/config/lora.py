"""LoRA's shape and the freeze method's trainable layers."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.config.schema import setting
from roctune.errors import ConfigError

DEFAULT_TARGET_MODULES = ["auto"]


@dataclass
class LoraSettings:
    # ---- LoRA and freeze
    lora_r: int = setting(8, "LoRA rank", gt=0, group="lora",
                resume_fixed=True,
                zh=("LoRA 秩", "LoRA 秩"))
    lora_alpha: float = setting(16, "LoRA alpha (scale = alpha / r)", gt=0, group="lora",
                resume_fixed=True,
                zh=("LoRA alpha", "LoRA alpha（缩放 = alpha / r）"))
    lora_dropout: float = setting(0.05, "LoRA dropout", ge=0, lt=1, group="lora",
                zh=("LoRA dropout", "LoRA 的 dropout 比例"))
    target_modules: list[str] = setting(DEFAULT_TARGET_MODULES, "modules to adapt: auto (the model family's attention "
                                        "projections: q/k/v/o_proj, Phi-3's qkv_proj/o_proj), all-linear, or names",
                                        metavar="NAME", shape="name",
                                        group="lora", aliases=("--lora-target",),
                key_aliases=("lora_target",), resume_fixed=True,
                zh=("目标模块", "要适配的模块：auto（该模型家族的注意力投影：q/k/v/o_proj，Phi-3 的 qkv_proj/o_proj）、all-linear 或模块名"))
    use_dora: bool = setting(False, "DoRA: weight-decomposed LoRA (slower, often better at low rank)", group="lora",
                resume_fixed=True,
                zh=("使用 DoRA", "DoRA：权重分解的 LoRA（更慢，低秩时常常更好）"))
    use_rslora: bool = setting(False, "rank-stabilized LoRA (scale = alpha / sqrt(r))", group="lora",
                resume_fixed=True,
                zh=("使用 rsLoRA", "秩稳定的 LoRA（缩放 = alpha / sqrt(r)）"))
    modules_to_save: list[str] = setting([], "modules trained in full next to LoRA (e.g. lm_head)", metavar="NAME",
                                         shape="name",
                                         group="lora",
                resume_fixed=True,
                zh=("完整训练的模块", "在 LoRA 之外完整训练的模块（例如 lm_head）"))
    freeze_trainable_layers: int = setting(2, "freeze: train the last N layers (N < 0: the first |N|)", group="lora",
                resume_fixed=True,
                zh=("可训练层数", "freeze：训练最后 N 层（N < 0：最前面的 |N| 层）"))
    freeze_trainable_modules: list[str] = setting(["all"], "freeze: modules inside those layers to train (e.g. mlp), "
                                                  "or all", metavar="NAME", shape="name", group="lora",
                resume_fixed=True,
                zh=("可训练模块", "freeze：这些层中要训练的模块（例如 mlp），或 all"))
    freeze_extra_modules: list[str] = setting([], "freeze: modules outside the layers to train too (e.g. norm)",
                                              metavar="NAME", shape="name", group="lora",
                zh=("额外可训练模块", "freeze：这些层之外也要训练的模块（例如 norm）"))

    def check(self) -> None:
        if not self.freeze_trainable_modules:
            raise ConfigError("freeze-trainable-modules is empty; name modules (e.g. mlp self_attn) or all")
        if not self.target_modules:
            raise ConfigError("target-modules is empty; name modules (e.g. q_proj v_proj), auto or all-linear")
