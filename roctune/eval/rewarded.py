"""`roctune eval --reward ...`: score the base model and the fine-tune by GRPO's rewards on held-out prompts.

Each prompt gets one greedy completion from each side (the base: the adapter switched off), decoded in batches
with a KV cache by roctune.decoding, as GRPO's rollouts and its eval_reward are; the same reward functions
(roctune.eval.rewards, built-ins and --reward-file) score both. Returns the mean reward per side, in total and per
function, and every example."""
from __future__ import annotations

import contextlib


def _side(loaded, ids: list[list[int]], use_adapter: bool, max_new: int, batch_size: int, eos: set, pad: int):
    from roctune.decoding import sample_completions

    ctx = (loaded.model.disable_adapter() if not use_adapter and hasattr(loaded.model, "disable_adapter")
           else contextlib.nullcontext())
    out: list[list[int]] = []
    with ctx:
        for s in range(0, len(ids), batch_size):
            out += sample_completions(loaded.model, ids[s:s + batch_size], max_new, 0.0, 1.0, eos, pad, None,
                                      loaded.device)
    return out


def _means(funcs, per_func: list[list[float]], total: list[float]) -> dict[str, float]:
    n = max(1, len(total))
    out = {"reward": round(sum(v for v in total if v == v) / n, 4)}
    for f, vals in zip(funcs, per_func):
        out[f"reward_{f.name}"] = round(sum(v for v in vals if v == v) / n, 4)
    return out


def evaluate_rewards(cfg, loaded, data: list[str], batch_size: int, say) -> dict:
    """{n, base: {reward, reward_<fn>...}, tuned: {...}, examples: [...]} for the prompts of `data`; `cfg` holds
    the reward settings (rewards, reward_weights, reward_file, answer_column, format_regex, max_completion_length,
    length_penalty_window); completions are at most max_completion_length tokens."""
    from roctune.data.prompts import load_prompts
    from roctune.data.render import render_prompt
    from roctune.eval import rewards as rw
    from roctune.models import stop_token_ids

    funcs = rw.build(cfg, cfg.reward_file)
    prompts = load_prompts(data)
    tok = loaded.tokenizer
    ids = [tok(render_prompt(tok, p.messages), add_special_tokens=False)["input_ids"] for p in prompts]
    eos = set(stop_token_ids(loaded.model, tok))
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    result: dict = {"n": len(prompts)}
    texts = {}
    for side, use in (("base", False), ("tuned", True)):
        say(f"{side}: {len(prompts)} greedy completions")
        comps = _side(loaded, ids, use, cfg.max_completion_length, batch_size, eos, pad)
        texts[side] = [tok.decode(c, skip_special_tokens=True) for c in comps]
        ps, cs, columns = rw.reward_inputs(prompts, texts[side], 1)
        per_func = rw.score(funcs, ps, cs, comps, columns)
        total = rw.combine(per_func, funcs)
        result[side] = _means(funcs, per_func, total)
        result[f"{side}_rewards"] = total
    result["examples"] = [{"prompt": p.messages[-1]["content"], "base": b, "tuned": t, "base_reward": rb,
                           "tuned_reward": rt} for p, b, t, rb, rt in
                          zip(prompts, texts["base"], texts["tuned"], result.pop("base_rewards"),
                              result.pop("tuned_rewards"))]
    return result

