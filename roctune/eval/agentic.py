"""`roctune eval --tools ...`: the base model and the fine-tune as agents on held-out prompts. Each prompt gets one
greedy episode from each side (the base: the adapter switched off) with the same tools, limits and tool process
(roctune.agents), the way GRPO's evaluation runs them; the rewards (built-ins, --reward-file, an environment's
get_reward()) score each episode, and the mean reward is the success rate when the reward is 0/1.

Returns per side the mean reward (in total and per function) and the tool figures per episode: calls parsed, valid
calls (returned a result), tool errors, the share of malformed call blocks, episodes cut by the token and turn
limits; and every episode's messages, base and tuned, for reading."""
from __future__ import annotations

import contextlib

from roctune.agents import episodes as ep
from roctune.agents.files import catalog_of, env_rewards, hand_over, spec_of
from roctune.agents.sandbox import ToolSession


def greedy(loaded, use_adapter: bool, eos: set, pad: int) -> ep.Generate:
    """A `Generate` that decodes greedily with `loaded`'s model, its adapter on or off."""
    from roctune.decoding import sample_completions

    def generate(prompts, limits, keys):
        ctx = (loaded.model.disable_adapter() if not use_adapter and hasattr(loaded.model, "disable_adapter")
               else contextlib.nullcontext())
        with ctx:  # greedy: the keys draw nothing, they only say where each episode is
            return sample_completions(loaded.model, prompts, limits, 0.0, 1.0, eos, pad, None, loaded.device, keys)
    return generate


def tool_format_of(loaded, adapter: str | None) -> str | None:
    """How the model writes calls: what its run recorded (run.yaml), else what its chat template writes."""
    from roctune import rundir
    from roctune.data.render import detect_tool_format

    recorded = rundir.tool_format(adapter) if adapter and rundir.is_run_dir(adapter) else None
    return recorded or detect_tool_format(loaded.tokenizer)


def figures(made: list[ep.Episode]) -> dict[str, float]:
    """The tool figures of a side, per episode (the malformed share of all attempted calls)."""
    s, n = ep.sums(made), max(1, len(made))
    out = {k: round(s[k] / n, 4) for k in ("tool_calls", "valid_tool_calls", "tool_errors", "cut_tokens",
                                           "cut_turns")}
    out["malformed_share"] = round(s["malformed_calls"] / s["call_attempts"], 4) if s["call_attempts"] else 0.0
    return out


def evaluate_tools(cfg, loaded, data: list[str], batch_size: int, say, adapter: str | None = None) -> dict:
    """{n, base: {reward, reward_<fn>..., tool figures}, tuned: {...}, examples: [...]} on the prompts of `data`;
    `cfg` holds the reward and tool settings; max_completion_length bounds each episode's tokens."""
    from roctune.data.prompts import load_prompts
    from roctune.errors import ConfigError
    from roctune.eval import rewards as rw
    from roctune.eval.rewarded import _means
    from roctune.models import stop_token_ids

    spec = spec_of(cfg)
    catalog = catalog_of(spec)
    funcs = rw.build(cfg, cfg.reward_file, env_rewards(cfg, catalog))
    prompts = load_prompts(data)
    tok = loaded.tokenizer
    fmt = tool_format_of(loaded, adapter)
    if fmt is None:
        raise ConfigError("--tools: this model's chat template writes tool calls in a format roctune cannot parse")
    eos = set(stop_token_ids(loaded.model, tok))
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    limits = ep.Limits(cfg.max_tool_turns, cfg.max_completion_length)
    result: dict = {"n": len(prompts)}
    episodes = {}
    for side, use in (("base", False), ("tuned", True)):
        say(f"{side}: {len(prompts)} greedy episodes with tools {', '.join(catalog.names)}")
        made, values = [], []
        for s in range(0, len(prompts), batch_size):
            chunk = prompts[s:s + batch_size]
            with ToolSession(spec) as session:
                part = ep.start(tok, catalog, session, chunk, 1, [0] * len(chunk))
                ep.run(part, greedy(loaded, use, eos, pad), tok, fmt, session, limits, eos)
                values += ep.rewards_of(session, part) if catalog.reward else []
            made += part
        hand_over(funcs, values)
        ps, _, columns = rw.reward_inputs(prompts, [""] * len(made), 1)
        per_func = rw.score(funcs, ps, [e.messages for e in made], [e.ids for e in made], columns)
        total = rw.combine(per_func, funcs)
        result[side] = {**_means(funcs, per_func, total), **figures(made)}
        episodes[side] = (made, total)
    result["examples"] = [{"prompt": p.messages[-1]["content"], "base": b.messages, "tuned": t.messages,
                           "base_reward": rb, "tuned_reward": rt}
                          for p, b, t, rb, rt in zip(prompts, episodes["base"][0], episodes["tuned"][0],
                                                     episodes["base"][1], episodes["tuned"][1])]
    return result
