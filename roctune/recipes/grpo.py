"""Group Relative Policy Optimization: learn from rewards computed on the model's own completions.

Data: prompts (roctune.data.prompts; any format, a final answer optional) and the columns the rewards read.
Rewards: roctune.eval.rewards (built-ins and the user's --reward-file). Loss: roctune.training.grpo_loss (TRL's
arithmetic, checked against TRL in tests/test_grpo.py).

Each optimizer step, on the shared loop (roctune.training.loop, Task.rollout):
1. rollout, outside DDP and autocast and without gradients: the step's prompts (batch_size x grad_accum per
   process) each get `num_generations` completions, sampled together with a KV cache by roctune.decoding (the code
   `serve` decodes with), from the model being trained (LoRA applied unmerged, dropout off), with a generator
   seeded by (seed, step, rank) so a resumed run samples what the uninterrupted one did; with --rollout-engine vllm
   (LoRA only) a vLLM server started for the run samples them instead, given the adapter each step
   (roctune.recipes.grpo_vllm; evaluation still decodes with roctune);
2. rewards, weighted and summed, become group-relative advantages; with --kl-beta the reference log-probs come
   from the same model with the adapter switched off (no second copy of the weights);
3. the micro-batches of completions are scored (log-probs at the sampling temperature) and back-propagated; the
   step's normaliser is the rollout's (completion tokens for dapo, completions otherwise).
One optimizer step per rollout (TRL's num_iterations 1), so the old log-probs are the current ones, detached, and
the ratio is 1 in value with its gradient; clipping matters only with more iterations, which this recipe does not
offer yet.

Logged per step: the mean reward (total and per function), the mean group std of the rewards, the completion
length, the fraction cut at --max-completion-length, the clipped fraction and the KL. Evaluation (eval data or
--eval-ratio) decodes one greedy completion per held-out prompt and logs eval_reward, which --load-best and
--early-stopping-patience maximise. --max-length bounds the prompt's tokens (longer prompts are dropped)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from types import SimpleNamespace

from roctune import rundir
from roctune.training import loop, session
from roctune.training.grpo_loss import LossSettings, completion_logprobs, group_advantages, micro_batch_loss


@dataclass
class Prompt:
    record: object  # roctune.data.prompts.PromptRecord
    ids: list[int]  # the rendered prompt's tokens
    index: int = 0  # its place in the data (agent episodes draw their samples keyed by it)


@dataclass
class Completion:
    item: object  # Tokenized: prompt + completion ids, labels on the completion
    advantage: float
    n: int  # completion tokens
    ref: object = None  # reference log-probs of its tokens (--kl-beta > 0)


def tokenize_prompts(tokenizer, records: list, max_length: int, tools: list | None = None) -> tuple[list[Prompt], int]:
    """The prompts rendered (with the tool list of an agent run) and tokenized; those over max_length dropped."""
    from roctune.data.render import render_prompt

    out, dropped = [], 0
    for i, r in enumerate(records):
        ids = tokenizer(render_prompt(tokenizer, r.messages, tools), add_special_tokens=False)["input_ids"]
        if len(ids) > max_length:
            dropped += 1
        else:
            out.append(Prompt(r, ids, i))
    return out, dropped


def check_inputs(cfg, records: list) -> None:
    """Before the model loads (recipes.prepare): the reward functions (and a --reward-file's import), the data
    columns they read, and vLLM's python for --rollout-engine vllm."""
    from roctune.eval.rewards import build, check_columns

    extra = ()
    if cfg.uses_tools:  # the tool files import and define tools (in their own process), before the model loads
        from roctune.agents.files import env_rewards
        from roctune.recipes import grpo_tools

        extra = env_rewards(cfg, grpo_tools.check(cfg))
    build(cfg, cfg.reward_file, extra)
    check_columns(cfg, records)
    if cfg.rollout_engine == "vllm":
        from roctune.recipes.grpo_vllm import find_python

        find_python()


def run(cfg, records: list, eval_records: list, base_model: str, say, progress: bool) -> dict:
    import functools

    from roctune.eval import rewards as rw

    catalog, extra = None, ()
    if cfg.uses_tools:
        from roctune.agents.files import env_rewards
        from roctune.recipes import grpo_tools

        catalog = grpo_tools.check(cfg)
        extra = env_rewards(cfg, catalog)
    funcs = rw.build(cfg, cfg.reward_file, extra)  # a broken reward file fails before the model loads
    setup, dist, tokenizer = session.start(cfg, base_model, say)
    say = say if dist.is_main else (lambda *_: None)  # only rank 0 talks
    tokenize = functools.partial(tokenize_prompts, tools=catalog.schemas if catalog else None)
    prompts, eval_prompts = session.tokenize_splits(tokenize, tokenizer, records, eval_records, cfg, say,
                                                    "prompt", too_long="the prompt")
    model, plan = session.build_trainable(cfg, setup, base_model, say)
    session.open_output(cfg, dist)
    g = _Grpo(cfg, setup, dist, tokenizer, model, plan, funcs, say)
    if cfg.uses_tools:
        g.tools = grpo_tools.ToolRollouts(cfg, tokenizer, setup.tool_format, g.eos, say)
    if cfg.rollout_engine == "vllm":
        from roctune.recipes import grpo_vllm

        g.vllm = grpo_vllm.start(cfg, base_model, setup)
        say("rollouts: sampled by a vLLM server started for this run (it loads while training starts)")
    try:
        return _train(cfg, setup, dist, tokenizer, model, prompts, eval_prompts, g, say, progress)
    finally:
        if g.vllm is not None:
            g.vllm.close()


def _train(cfg, setup, dist, tokenizer, model, prompts, eval_prompts, g, say, progress: bool) -> dict:
    funcs = g.funcs
    task = loop.Task(
        items=prompts, eval_items=eval_prompts, lengths=[len(p.ids) for p in prompts],
        loss_sum=g.loss_sum, weight=lambda c: g.loss.item_weight(c.n), tokens=lambda c: len(c.item.input_ids),
        metric_names=("clip_ratio",) + (("kl",) if cfg.kl_beta else ()),
        norm_name=g.norm_name,
        rollout=g.rollout, expand=cfg.num_generations, derived=g.derived,
        eval_names=("reward", "n") + tuple(f"reward_{f.name}" for f in funcs), eval_sums=g.eval_sums,
        eval_metrics=lambda s: {f"eval_{k}": round(v / max(1, s["n"]), 6) for k, v in s.items() if k != "n"},
        best_metric="eval_reward", higher_is_better=True, show="reward")
    say(f"prompts: {len(prompts)} train, {len(eval_prompts)} eval; {cfg.num_generations} completions each of up to "
        f"{cfg.max_completion_length} tokens; rewards: {', '.join(f'{f.name} x{f.weight:g}' for f in funcs)}; "
        f"loss {cfg.loss_type}")
    model, summary = loop.fit(cfg, setup, model, task, dist, say, progress,
                              save=lambda m: session.save_final(cfg, m, tokenizer, dist))
    return session.finish(cfg, model, tokenizer, dist, summary, say)


class _Grpo:
    """The recipe's moving parts: rollout, loss and metrics (a class only to keep each function short)."""

    def __init__(self, cfg, setup, dist, tokenizer, model, plan, funcs: list, say):
        from roctune.models import stop_token_ids

        self.cfg, self.setup, self.dist, self.tokenizer, self.funcs, self.say = cfg, setup, dist, tokenizer, funcs, say
        self.loss = LossSettings.from_config(cfg)
        self.norm_name = "completion_tokens" if cfg.loss_type == "dapo" else "completions"
        self.head = plan.head if cfg.loss_on_supervised_only else None
        self.eos = set(stop_token_ids(model, tokenizer))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos)
        self.vllm = None  # roctune.recipes.grpo_vllm.VllmRollouts with --rollout-engine vllm
        self.tools = None  # roctune.recipes.grpo_tools.ToolRollouts with --tools / --environment

    # ---- rollout
    @staticmethod
    def completion(item, advantage: float, n: int) -> Completion:
        return Completion(item, advantage, n)

    def sample(self, model, prompt_ids: list[list[int]], temperature: float, gen, limits=None,
               keys=None) -> list[list[int]]:
        from roctune.decoding import sample_completions

        was = model.training
        model.eval()  # no dropout while sampling
        try:
            return sample_completions(model, prompt_ids, limits or self.cfg.max_completion_length, temperature,
                                      self.cfg.top_p, self.eos, self.pad_id, gen, self.setup.device, keys)
        finally:
            model.train(was)

    def score(self, prompts: list[Prompt], comps: list[list[int]], per: int, step: int):
        """(per-function values, weighted totals) of the completions."""
        from roctune.eval import rewards as rw

        texts = [self.tokenizer.decode(c, skip_special_tokens=True) for c in comps]
        ps, cs, columns = rw.reward_inputs([p.record for p in prompts], texts, per)
        per_func = rw.score(self.funcs, ps, cs, comps, columns, trainer_state=SimpleNamespace(global_step=step))
        return per_func, rw.combine(per_func, self.funcs), texts

    def rollout(self, model, prompts: list[Prompt], step: int):
        import torch

        from roctune.data.render import Tokenized

        if self.tools is not None:
            return self.tools.rollout(self, model, prompts, step)
        G = self.cfg.num_generations
        # seeded by (seed, step, rank): a resumed run samples what the uninterrupted one did, ranks sample apart
        seed = (self.cfg.seed * 1_000_003 + step) * 4099 + self.dist.rank
        gen = torch.Generator(device=self.setup.device).manual_seed(seed)
        if self.vllm is not None:
            settings = {"temperature": self.cfg.temperature, "top_p": self.cfg.top_p,
                        "max_tokens": self.cfg.max_completion_length}
            comps = self.vllm.sample(model, [p.ids for p in prompts], G, settings, seed, step, self.eos)
        else:
            comps = self.sample(model, [p.ids for p in prompts for _ in range(G)], self.cfg.temperature, gen)
        per_func, total, texts = self.score(prompts, comps, G, step)
        # float64: the group std squares the rewards, which may be as large as float32 allows (rewards.combine)
        rewards = torch.tensor(total, dtype=torch.float64)
        adv, std = group_advantages(rewards, G, self.cfg.scale_rewards)
        made = [Completion(Tokenized(p.ids + c, [-100] * len(p.ids) + c, p.record.source), float(a), len(c))
                for p, c, a in zip([p for p in prompts for _ in range(G)], comps, adv.tolist())]
        if self.cfg.kl_beta:
            self.reference(model, made)
        self.write_samples(step, prompts, texts, total)
        return made, self.sums(per_func, rewards, std, comps, G)

    def sums(self, per_func, rewards, std, comps, G: int) -> dict[str, float]:
        import torch

        n = len(comps)
        out = {"completions": n, "reward": float(torch.nan_to_num(rewards).sum()),
               "reward_std": float(torch.nan_to_num(std).sum()),
               "completion_length": float(sum(len(c) for c in comps)),
               "truncated": float(sum(1 for c in comps if c[-1] not in self.eos)),
               "zero_std_groups": float(sum(1 for s in std[::G].tolist() if s == 0 or s != s) * G)}
        for f, vals in zip(self.funcs, per_func):
            out[f"reward_{f.name}"] = float(sum(v for v in vals if v == v))
        return out

    def reference(self, model, made: list[Completion]) -> None:
        """Each completion's log-probs under the reference: the same model with its adapter switched off."""
        import torch

        from roctune.training.batching import collate

        was = model.training
        model.eval()
        try:
            with torch.no_grad(), model.disable_adapter():
                for s in range(0, len(made), self.cfg.batch_size * self.cfg.num_generations):
                    chunk = made[s:s + self.cfg.batch_size * self.cfg.num_generations]
                    batch = collate([c.item for c in chunk], self.pad_id, False, self.setup.device)
                    with loop.autocast(self.setup):
                        logp, _ = completion_logprobs(model, batch, self.head, self.cfg.temperature)
                    for c, part in zip(chunk, logp.float().split([c.n for c in chunk])):
                        c.ref = part
        finally:
            model.train(was)

    # ---- training
    def loss_sum(self, model, batch: list[Completion]):
        import torch

        from roctune.training.batching import collate

        b = collate([c.item for c in batch], self.pad_id, False, self.setup.device)
        logp, rows = completion_logprobs(model, b, self.head, self.cfg.temperature)
        logp = logp.float()
        ref = torch.cat([c.ref for c in batch]).to(logp.device) if self.cfg.kl_beta else None
        adv = torch.tensor([c.advantage for c in batch], dtype=torch.float32, device=logp.device)
        return micro_batch_loss(self.loss, logp, logp.detach(), ref, adv, rows, len(batch))

    def derived(self, row: dict) -> None:
        """Per-completion means from the step's sums (the loop divided the loss's metrics by its normaliser)."""
        norm = row[self.norm_name]  # the loop's normaliser (for all but dapo, the completions: the same count)
        n = max(1, row.pop("completions", 0))
        for k in ("clip_ratio", "kl"):
            if k in row:
                row[k] = round(row[k] * norm / n, 6)
        for k in [k for k in row if k.startswith("reward") or k in ("completion_length", "truncated")]:
            row[k] = round(row[k] / n, 6)
        row["zero_std_fraction"] = round(row.pop("zero_std_groups", 0.0) / n, 6)
        row["completions"] = int(n)
        if self.tools is not None:
            from roctune.recipes.grpo_tools import derived

            derived(row, n)

    # ---- evaluation and samples
    def eval_sums(self, model, items: list[Prompt]) -> dict[str, float]:
        if self.tools is not None:
            return self.tools.eval_sums(self, model, items)
        comps = self.sample(model, [p.ids for p in items], 0.0, None)  # greedy: one deterministic answer each
        per_func, total, _ = self.score(items, comps, 1, -1)
        out = {"reward": sum(v for v in total if v == v), "n": len(items)}
        for f, vals in zip(self.funcs, per_func):
            out[f"reward_{f.name}"] = sum(v for v in vals if v == v)
        return out

    def write_samples(self, step: int, prompts: list[Prompt], texts: list[str], total: list[float]) -> None:
        every = self.cfg.completion_samples_steps
        if not every or (step + 1) % every or not self.dist.is_main:
            return
        G = self.cfg.num_generations
        with open(os.path.join(self.cfg.output, rundir.COMPLETIONS_FILE), "a", encoding="utf-8") as f:
            for j in range(min(G, len(texts))):
                f.write(rundir.json_line({"step": step + 1, "prompt": prompts[0].record.messages[-1]["content"],
                                          "completion": texts[j], "reward": total[j]}, ensure_ascii=False))
