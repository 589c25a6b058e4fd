"""GRPO whose rollouts are agent episodes (`--tools FILE.py`, `--environment FILE.py:Class`, `--max-tool-turns`):
each completion is a whole episode of model turns and tool results (roctune.agents.episodes), sampled by the model
being trained (roctune.decoding, keyed per episode) or by the run's vLLM server given the adapter once per step
(roctune.recipes.grpo_vllm); the tools run in one tool process per rollout batch (roctune.agents.sandbox).

What the loss sees: the episode's tokens after the prompt, with labels only on the model's own tokens: tool-result
tokens are context (never learned, no advantage), as TRL's tool_mask makes them. The rewards read the whole episode:
`completions` are its messages (assistant turns with their tool_calls, tool turns with the results, the final
answer: TRL's format; the built-in rewards read the final answer), `completion_ids` all its tokens; an environment's
get_reward() is one more reward, after the others (TRL's order).

Logged per step, per episode: tool_calls (parsed), valid_tool_calls (returned a result), tool_errors (failed:
unknown tool, bad arguments, raised, timed out, out of memory, crashed the tool process), malformed_share (call
blocks that did not parse, of all attempted), cut_tokens and cut_turns (episodes the limits ended)."""
from __future__ import annotations

import logging

from roctune.agents import episodes as ep
from roctune.agents.files import catalog_of, env_rewards, hand_over, spec_of
from roctune.agents.sandbox import Catalog, ToolSession
from roctune.errors import ConfigError

log = logging.getLogger(__name__)
PER_EPISODE = ("tool_calls", "valid_tool_calls", "tool_errors", "cut_tokens", "cut_turns")


def check(cfg) -> Catalog:
    """Before the model loads: the files import and define tools (ToolError), the rewards fit."""
    catalog = catalog_of(spec_of(cfg))
    env_rewards(cfg, catalog)
    return catalog


class ToolRollouts:
    """The agent episodes of a GRPO run: `rollout` and `eval_sums` stand in for the single-turn ones of
    roctune.recipes.grpo._Grpo (`g`), which keeps the model, the loss and the metrics."""

    def __init__(self, cfg, tokenizer, tool_format: str | None, stop_ids: set, say):
        from roctune.data.tool_turns import results_ids

        if tool_format is None:
            raise ConfigError("--tools: this model's chat template writes tool calls in a format roctune cannot "
                              "parse; use --template chatml (roctune's fallback tool format) or a template that "
                              "writes <tool_call> blocks")
        self.cfg, self.tokenizer, self.tool_format = cfg, tokenizer, tool_format
        self.spec = spec_of(cfg)
        self.catalog = catalog_of(self.spec)
        self.limits = ep.Limits(cfg.max_tool_turns, cfg.max_completion_length)
        # a template that cannot carry tool results turn by turn is refused now, not at the first call
        results_ids(tokenizer, [{"role": "tool", "name": self.catalog.names[0], "content": "x"}],
                    [tokenizer.decode([t]) for t in stop_ids])
        say(f"tools: {', '.join(self.catalog.names)} ({tool_format} calls; network {self.catalog.network}; "
            f"{cfg.tool_timeout:g} s and {cfg.tool_memory_mb} MB per call; up to {cfg.max_tool_turns} tool turns "
            f"per episode)")

    def episodes(self, g, model, prompts: list, per: int, step: int, temperature: float) -> list[ep.Episode]:
        from roctune.decoding import sample_key

        keys = [sample_key(self.cfg.seed, step, p.index, j) for p in prompts for j in range(per)]
        with ToolSession(self.spec) as session:
            made = ep.start(self.tokenizer, self.catalog, session, [p.record for p in prompts], per, keys)
            generate = self._generate(g, model, temperature, step)
            ep.run(made, generate, self.tokenizer, self.tool_format, session, self.limits, g.eos)
            values = ep.rewards_of(session, made) if self.catalog.reward else []
            if session.restarts:
                log.warning("step %d: the tool process was restarted %d time(s) (a tool crashed or hung)", step + 1,
                            session.restarts)
        hand_over(g.funcs, values)
        return made

    def _generate(self, g, model, temperature: float, step: int) -> ep.Generate:
        if g.vllm is not None and temperature > 0:
            name = g.vllm.load_adapter(model, step)
            settings = {"temperature": temperature, "top_p": self.cfg.top_p}
            return lambda prompts, limits, keys: g.vllm.complete(name, prompts, limits, keys, settings, g.eos)
        return lambda prompts, limits, keys: g.sample(model, prompts, temperature, None, limits, keys)

    def score(self, g, prompts: list, made: list[ep.Episode], per: int, step: int):
        """(per-function values, weighted totals) of the episodes; the rewards read their messages."""
        from types import SimpleNamespace

        from roctune.eval import rewards as rw

        ps, _, columns = rw.reward_inputs([p.record for p in prompts], [""] * len(made), per)
        per_func = rw.score(g.funcs, ps, [e.messages for e in made], [e.ids for e in made], columns,
                            trainer_state=SimpleNamespace(global_step=step))
        return per_func, rw.combine(per_func, g.funcs)

    def rollout(self, g, model, prompts: list, step: int):
        import torch

        from roctune.data.render import Tokenized
        from roctune.training.grpo_loss import group_advantages

        G = self.cfg.num_generations
        made = self.episodes(g, model, prompts, G, step, self.cfg.temperature)
        per_func, total = self.score(g, prompts, made, G, step)
        rewards = torch.tensor(total, dtype=torch.float64)
        adv, std = group_advantages(rewards, G, self.cfg.scale_rewards)
        sources = [p.record.source for p in prompts for _ in range(G)]
        out = [g.completion(Tokenized(e.prompt + e.ids, [-100] * len(e.prompt) + [t if m else -100 for t, m in
                                                                                 zip(e.ids, e.mask)], src),
                          float(a), e.model_tokens) for e, a, src in zip(made, adv.tolist(), sources)]
        if self.cfg.kl_beta:
            g.reference(model, out)
        g.write_samples(step, prompts, [e.messages for e in made], total)
        sums = g.sums(per_func, rewards, std, [e.ids for e in made], G)
        sums["completion_length"] = float(sum(e.model_tokens for e in made))  # the model's tokens (TRL's figure)
        sums.update(ep.sums(made))
        return out, sums

    def eval_sums(self, g, model, items: list) -> dict[str, float]:
        made = self.episodes(g, model, items, 1, -1, 0.0)  # greedy: one deterministic episode each
        per_func, total = self.score(g, items, made, 1, -1)
        out = {"reward": sum(v for v in total if v == v), "n": len(items)}
        for f, vals in zip(g.funcs, per_func):
            out[f"reward_{f.name}"] = sum(v for v in vals if v == v)
        return out


def derived(row: dict, n: int) -> None:
    """The tool figures per episode (their sums divided by the step's episodes) and the malformed share."""
    for k in PER_EPISODE:
        if k in row:
            row[k] = round(row[k] / max(1, n), 6)
    if "call_attempts" in row:
        attempts, malformed = row.pop("call_attempts"), row.pop("malformed_calls", 0.0)
        row["malformed_share"] = round(malformed / attempts, 6) if attempts else 0.0
