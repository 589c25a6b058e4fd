"""The tool and environment files a command was given (--tools, --environment; TRL's conventions): read from the
settings into a ToolSpec, listed once per process (their schemas, cached), and an environment's get_reward() as one
more reward function. Shared by GRPO (roctune.recipes.grpo_tools), `roctune eval --tools` and `roctune chat --tools`."""
from __future__ import annotations

import functools

from roctune.agents.sandbox import Catalog, ToolSpec, describe, parse_spec
from roctune.errors import ConfigError


def spec_of(cfg) -> ToolSpec:
    """The tools, environment and limits of `cfg` (roctune.config.agents.ToolSettings' fields)."""
    return parse_spec(cfg.tools, cfg.environment, cfg.tool_timeout, cfg.tool_memory_mb)


@functools.lru_cache(maxsize=8)
def catalog_of(spec: ToolSpec) -> Catalog:
    """The tools' schemas (one worker run; cached: a command's checks and its run ask for the same files)."""
    return describe(spec)


class EnvReward:
    """An environment's get_reward() as a reward function (TRL's convention): the values are asked from the tool
    process at the end of the episodes, handed over in `values`, and returned when the rewards are scored."""

    def __init__(self):
        self.values: list = []

    def __call__(self, completions, **kwargs):
        return self.values


def env_rewards(cfg, catalog: Catalog) -> tuple:
    """The extra reward of an environment with get_reward() (for roctune.eval.rewards.build), or (); ConfigError when
    there would be no reward at all."""
    from roctune.eval.rewards import Reward

    if catalog.reward:
        return (Reward(catalog.environment, EnvReward(), path=cfg.environment.partition(":")[0]),)
    if not cfg.rewards and not cfg.reward_file and not getattr(cfg, "reward_model", None):
        raise ConfigError(f"--environment {cfg.environment}: {catalog.environment} has no get_reward(), and no "
                          "other reward is given; add get_reward() or --reward/--reward-file")
    return ()


def hand_over(funcs: list, values: list) -> None:
    """Give the episodes' environment rewards to the reward function that returns them."""
    for f in funcs:
        if isinstance(f.fn, EnvReward):
            f.fn.values = values
