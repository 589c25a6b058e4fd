"""`roctune train`: fine-tune a model (LoRA, QLoRA, freeze or full; SFT or DPO). Settings come from defaults,
then --config FILE.yaml, then flags, then key=value overrides. The flags are generated from roctune.config."""
from __future__ import annotations

import argparse

from roctune.config import TrainConfig, add_flags, from_sources


def register(sub) -> None:
    p = sub.add_parser("train", help="fine-tune a model (LoRA, QLoRA, freeze, full; SFT or DPO)",
                       description=__doc__, argument_default=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="extra settings, e.g. lr=1e-4 warmup_ratio=0.03")
    p.add_argument("--config", metavar="FILE.yaml", help="YAML file of settings (keys as the flags, with _ or -)")
    add_flags(p)
    p.set_defaults(func=run)


def config_from_args(args) -> TrainConfig:
    flags = {k: v for k, v in vars(args).items() if k in TrainConfig.field_names()}
    return from_sources(getattr(args, "config", None), flags, getattr(args, "overrides", []))


def run(args) -> int:
    from roctune.recipes import train
    from roctune.training import launch

    cfg = config_from_args(args).validate()
    if cfg.selftest:  # here, not in recipes.train: the self-test lives in doctor/, a layer above recipes/
        from roctune.doctor.selftest import require

        require(cfg, say=print)
    if launch.wants_launch(cfg):
        from roctune.recipes import prepare

        launch.check_launch(cfg)
        prepare(cfg, check_output=cfg.node_rank == 0)  # everything is validated before any process starts
        return launch.launch(cfg, print)
    train(cfg, log=print)
    return 0
