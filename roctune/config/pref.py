"""--stage dpo's preference loss (roctune.training.pref_losses implements one function per name: its table
must cover exactly PREF_LOSSES, tests/test_pref_losses.py) and the checks of its settings."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.config.schema import LOSS_SCALE_LIMIT, setting
from roctune.errors import ConfigError

# Declared here because the settings layer sits below the training engine and may not import it.
PREF_LOSSES = ("sigmoid", "ipo", "hinge", "robust", "orpo", "simpo")
SMOOTHED = ("sigmoid", "robust", "simpo")  # the losses --label-smoothing changes


@dataclass
class PrefSettings:
    DOES = "sets the preference loss of"  # for the refusal on another stage (config/model.py)
    # ---- dpo: how far the policy may move, and the loss (roctune.training.pref_losses)
    beta: float = setting(0.1, "dpo, kto: how far the policy may move from the reference", gt=0,
                          le=LOSS_SCALE_LIMIT, group="model",
                key_aliases=("pref_beta",),
                zh=("β 系数", "dpo、kto：策略可以偏离参考模型多远"))
    # ---- dpo's loss (roctune.training.pref_losses declares the choices and implements them)
    pref_loss: str = setting("sigmoid", "dpo: preference loss: sigmoid (DPO), ipo, hinge, robust (label-flip "
                             "noise), or without a reference model (no reference pass): orpo (odds ratio + SFT "
                             "loss of the chosen answer), simpo (length-normalised margin; try --beta 2)",
                             choices=PREF_LOSSES, group="model",
                resume_fixed=True,
                zh=("偏好损失", "dpo：偏好损失：sigmoid（DPO）、ipo、hinge、robust（标签翻转噪声），或不需要参考模型（省去参考打分）："
                    "orpo（几率比 + 选中回答的 SFT 损失）、simpo（按长度归一化的差距；可试把“β 系数”设为 2）"))
    label_smoothing: float = setting(0.0, "dpo: probability in [0, 0.5) that a preference label is flipped "
                                     "(--pref-loss robust, simpo, and sigmoid as conservative DPO)", ge=0, lt=0.5,
                                     group="model",
                key_aliases=("dpo_label_smoothing",), resume_fixed=True,
                zh=("标签平滑", "dpo：偏好标签被翻转的概率，取值 [0, 0.5)（“偏好损失”robust、simpo，以及 sigmoid 即保守 DPO）"))
    simpo_gamma: float = setting(0.5, "dpo: --pref-loss simpo's target reward margin (TRL's simpo_gamma)", ge=0,
                                 le=LOSS_SCALE_LIMIT,
                                 group="model",
                resume_fixed=True,
                zh=("SimPO gamma", "dpo：“偏好损失”simpo 的目标奖励差距（TRL 的 simpo_gamma）"))

    def check(self) -> None:
        """--label-smoothing changes only some of the losses, --simpo-gamma one of them (these settings on another
        stage than dpo are refused by ModelSettings.check, from the stages' rows)."""
        if self.label_smoothing and self.pref_loss not in SMOOTHED:
            raise ConfigError(f"--label-smoothing applies to --pref-loss {', '.join(SMOOTHED)}, not "
                              f"{self.pref_loss}; drop it")
        if self.simpo_gamma != PrefSettings.simpo_gamma and self.pref_loss != "simpo":
            raise ConfigError(f"--simpo-gamma is the margin of --pref-loss simpo; drop it for --pref-loss "
                              f"{self.pref_loss}")

