"""Direct Preference Optimization: prefer the chosen answer over the rejected one for the same prompt.

Data: preference pairs (roctune.data.preference reads every supported layout). Prompts are rendered with the
model's chat template exactly as in SFT, and only the final answer's tokens are scored.

The loss is `--pref-loss` (roctune.training.pref_losses): by default the sigmoid DPO loss,
-log sigmoid(beta * ((log pi(c) - log ref(c)) - (log pi(r) - log ref(r)))), or ipo, hinge, robust; orpo and simpo
need no reference, so for them the reference scoring pass below is skipped entirely (a forward pass over every
pair saved; memory was one model copy either way).

The reference is the model as training starts (the base model, or base + the `--adapter` it starts from). Its
log-probabilities are computed once, before the first step, with the same model, so no second copy of the weights
is ever held; only the pairs this process will train on are scored (a few steps cost a few pairs, whatever the
data set's size), and a resumed run scores its remaining pairs again from the freshly built starting model."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.training import loop, reference, session
from roctune.training.batching import collate
from roctune.training.losses import Head, sequence_logps
from roctune.training.pair_task import pair_task
from roctune.training.pref_losses import REFERENCE_FREE, PairLogps, PrefSettings, pair_losses


@dataclass
class Item:
    chosen: object  # Tokenized prompt + chosen answer
    rejected: object  # Tokenized prompt + rejected answer
    ref: tuple[float, float] | None = None  # reference log-probabilities, filled before training


def pair_logps(model, pairs: list, pad_id: int, device: str, head: Head | None):
    """(chosen logps, rejected logps) for a micro-batch of (chosen, rejected) pairs, in one padded forward."""
    n = len(pairs)
    batch = collate([c for c, _ in pairs] + [r for _, r in pairs], pad_id, False, device)
    lp = sequence_logps(model, batch, head)
    return lp[:n], lp[n:]


def answer_tokens(batch: list[Item], device):
    """(chosen, rejected) answer token counts of a micro-batch, as float tensors (ipo, simpo and orpo average)."""
    import torch

    count = [[x.chosen.n_supervised for x in batch], [x.rejected.n_supervised for x in batch]]
    return torch.tensor(count, dtype=torch.float32, device=device).unbind(0)


def run(cfg, records: list, eval_records: list, base_model: str, say, progress: bool) -> dict:
    import torch

    from roctune.data.preference import tokenize_pairs

    setup, dist, tokenizer = session.start(cfg, base_model, say)
    session.phase(cfg, dist, "tokenizing")
    say = say if dist.is_main else (lambda *_: None)  # only rank 0 talks
    pairs, eval_pairs = session.tokenize_splits(tokenize_pairs, tokenizer, records, eval_records, cfg, say, "pair")
    items, eval_items = [Item(c, r) for c, r, _ in pairs], [Item(c, r) for c, r, _ in eval_pairs]
    session.phase(cfg, dist, "loading")
    model, plan = session.build_trainable(cfg, setup, base_model, say)
    session.open_output(cfg, dist)
    pad_id = tokenizer.pad_token_id
    head = plan.head if cfg.loss_on_supervised_only and not (cfg.fsdp and dist.enabled) else None
    pref = PrefSettings.from_config(cfg)
    needs_ref = pref.loss not in REFERENCE_FREE

    def scored(model, batch: list[Item]):
        """(per-pair loss, chosen rewards, rejected rewards) of a micro-batch (against its reference)."""
        pc, pr = pair_logps(model, [(x.chosen, x.rejected) for x in batch], pad_id, setup.device, head)
        lp = PairLogps(pc.float(), pr.float(), *answer_tokens(batch, pc.device))
        if needs_ref:
            lp.ref_chosen = torch.tensor([x.ref[0] for x in batch], device=pc.device)
            lp.ref_rejected = torch.tensor([x.ref[1] for x in batch], device=pc.device)
        return pair_losses(lp, pref)

    score_reference = reference.before_training(
        items, eval_items, setup, cfg.batch_size, lambda m: reference_scores(m, pad_id, setup, head), progress, say,
        "dpo: scoring {n} pair(s) with the reference (the starting model)")
    task = pair_task(items, eval_items, scored, "reward_accuracy",
                     before_training=score_reference if needs_ref else None)
    say(f"pairs: {len(items)} train, {len(eval_items)} eval; loss {pref.loss}, beta {cfg.beta}"
        + ("" if needs_ref else " (no reference model)"))
    model, summary = loop.fit(cfg, setup, model, task, dist, say, progress,
                              save=lambda m: session.save_final(cfg, m, tokenizer, dist))
    return session.finish(cfg, model, tokenizer, dist, summary, say)


def reference_scores(model, pad_id: int, setup, head: Head | None):
    """score(chunk) for reference.reference_pass: each pair's (chosen, rejected) log-probabilities."""
    def score(chunk: list[Item]) -> list[tuple[float, float]]:
        c, r = pair_logps(model, [(x.chosen, x.rejected) for x in chunk], pad_id, setup.device, head)
        return list(zip(c.float().tolist(), r.float().tolist()))

    return score

