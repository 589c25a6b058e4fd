"""--stage kto's loss weights (roctune.training.kto_loss; TRL's KTOConfig names and defaults). On another stage they
are refused (ModelSettings.check, from the stages' rows)."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.config.schema import LOSS_SCALE_LIMIT, setting


@dataclass
class KtoSettings:
    DOES = "weighs the loss of"  # for the refusal on another stage (config/model.py)
    desirable_weight: float = setting(1.0, "kto: weight of the desirable examples' loss (the KTO paper advises "
                                      "desirable-weight x desirable / (undesirable-weight x undesirable) in "
                                      "[1, 4/3])", gt=0, le=LOSS_SCALE_LIMIT,
                                      group="model", key_aliases=("kto_chosen_weight",), resume_fixed=True,
                zh=("好样本权重", "kto：好样本损失的权重（KTO 论文建议 好样本权重 × 好样本数 / (坏样本权重 × 坏样本数) 在 [1, 4/3] 之间）"))
    undesirable_weight: float = setting(1.0, "kto: weight of the undesirable examples' loss", gt=0,
                                        le=LOSS_SCALE_LIMIT, group="model",
                key_aliases=("kto_rejected_weight",), resume_fixed=True,
                zh=("坏样本权重", "kto：坏样本损失的权重"))
