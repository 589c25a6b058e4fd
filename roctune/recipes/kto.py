"""KTO (Kahneman-Tversky Optimization): learn from single answers marked desirable or undesirable, no pairs needed
(thumbs up / down feedback).

Data: one answer per record with `label: true/false` or LLaMA-Factory's `kto_tag` (roctune.data.kto reads every
supported layout). Prompts are rendered with the model's chat template exactly as in SFT, and only the final
answer's tokens are scored.

The loss is TRL's KTO loss (roctune.training.kto_loss), with `--beta`, `--desirable-weight` and
`--undesirable-weight`. Its reference point is a KL estimate from mismatched pairs: each example also carries its
prompt followed by another example's answer (roctune.data.kto.mismatched), and a micro-batch's estimate is the mean
log-ratio of its examples' mismatched sequences (policy forward without gradients; TRL detaches it too).

The reference is the model as training starts, scored once before the first step on both sequences of every
example this process trains on (and the eval examples), as --stage dpo does (recipes.dpo): no second copy of the
weights, so LoRA, QLoRA, freeze and full all work, and a resumed run scores again from its freshly built starting
model. The mismatched answers are fixed when the data is tokenized (TRL fixes them in its data set as well), so
the reference scores them once, whichever micro-batch an example lands in."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.errors import DataError
from roctune.training import loop, reference, session
from roctune.training.batching import collate
from roctune.training.kto_loss import KTOSettings, kl_estimate, kto_losses
from roctune.training.losses import Head, sequence_logps


@dataclass
class Item:
    ex: object  # Tokenized prompt + the answer judged
    kl: object  # Tokenized prompt + another example's answer (the KL estimate's mismatched pair)
    desirable: bool
    ref: tuple[float, float] | None = None  # reference log-probabilities of (ex, kl), filled before training


def logps(model, seqs: list, pad_id: int, device: str, head: Head | None):
    """Summed answer log-probabilities of tokenized sequences, in one padded forward."""
    return sequence_logps(model, collate(seqs, pad_id, False, device), head)


def items_of(pairs: list, max_length: int) -> list[Item]:
    from roctune.data.kto import mismatched

    kl = mismatched([t for t, _ in pairs], max_length)
    return [Item(t, m, d) for (t, d), m in zip(pairs, kl)]


def run(cfg, records: list, eval_records: list, base_model: str, say, progress: bool) -> dict:
    import torch

    from roctune.data.kto import tokenize_examples

    setup, dist, tokenizer = session.start(cfg, base_model, say)
    session.phase(cfg, dist, "tokenizing")
    say = say if dist.is_main else (lambda *_: None)  # only rank 0 talks
    train_ex, eval_ex = session.tokenize_splits(tokenize_examples, tokenizer, records, eval_records, cfg, say,
                                                "example")
    if len(train_ex) < 2:
        raise DataError(f"--stage kto needs at least 2 training examples (got {len(train_ex)}): its KL estimate "
                        "pairs each prompt with another example's answer; add examples")
    items, eval_items = items_of(train_ex, cfg.max_length), items_of(eval_ex, cfg.max_length)
    s = KTOSettings.from_config(cfg)
    balance(items, s, say)
    session.phase(cfg, dist, "loading")
    model, plan = session.build_trainable(cfg, setup, base_model, say)
    session.open_output(cfg, dist)
    pad_id = tokenizer.pad_token_id
    head = plan.head if cfg.loss_on_supervised_only and not (cfg.fsdp and dist.enabled) else None

    def scored(model, batch: list[Item]):
        """(per-example loss, rewards, desirable mask, KL estimate) of a micro-batch against its reference."""
        with torch.no_grad():
            kl_now = logps(model, [x.kl for x in batch], pad_id, setup.device, head).float()
        lp = logps(model, [x.ex for x in batch], pad_id, setup.device, head).float()
        ref, ref_kl = torch.tensor([x.ref for x in batch], device=lp.device).unbind(1)
        good = torch.tensor([x.desirable for x in batch], device=lp.device)
        kl = kl_estimate(kl_now, ref_kl)
        loss, rewards = kto_losses(lp, ref, good, kl, s)
        return loss, rewards, good, kl

    def loss_sum(model, batch):
        loss, rewards, good, kl = scored(model, batch)
        # device tensors: the loop reads the step's sums from the device once, for its log row
        return loss.sum(), {"rewards_desirable": (rewards * good).sum(), "rewards_undesirable": (rewards * ~good).sum(),
                            "desirable_share": good.float().sum(), "kl": kl * len(batch)}

    def eval_sums(model, batch):
        loss, rewards, good, kl = scored(model, batch)
        return {"loss": float(loss.sum()), "rd": float((rewards * good).sum()), "ru": float((rewards * ~good).sum()),
                "nd": float(good.sum()), "kl": float(kl) * len(batch), "n": len(batch)}

    task = loop.Task(
        items=items, eval_items=eval_items, lengths=[len(x.ex.input_ids) + len(x.kl.input_ids) for x in items],
        loss_sum=loss_sum, weight=lambda x: 1, tokens=lambda x: len(x.ex.input_ids) + len(x.kl.input_ids),
        metric_names=("rewards_desirable", "rewards_undesirable", "desirable_share", "kl"), norm_name="examples",
        derived=per_mark, eval_names=("loss", "rd", "ru", "nd", "kl", "n"), eval_sums=eval_sums,
        eval_metrics=eval_metrics, before_training=reference.before_training(
            items, eval_items, setup, cfg.batch_size, lambda m: reference_scores(m, pad_id, setup, head), progress,
            say, "kto: scoring {n} example(s) and their mismatched pairs with the reference (the starting model)"))
    say(f"examples: {len(items)} train, {len(eval_items)} eval; kto, beta {s.beta}, desirable weight "
        f"{s.desirable_weight}, undesirable weight {s.undesirable_weight}")
    model, summary = loop.fit(cfg, setup, model, task, dist, say, progress,
                              save=lambda m: session.save_final(cfg, m, tokenizer, dist))
    return session.finish(cfg, model, tokenizer, dist, summary, say)


def balance(items: list[Item], s: KTOSettings, say) -> None:
    """TRL's advice: desirable_weight x desirable examples / (undesirable_weight x undesirable) in [1, 4/3]."""
    n_good = sum(x.desirable for x in items)
    n_bad = len(items) - n_good
    say(f"kto: {n_good} desirable and {n_bad} undesirable training example(s)")
    if n_good and n_bad and not 1 <= (s.desirable_weight * n_good) / (s.undesirable_weight * n_bad) <= 4 / 3:
        lo, hi = n_bad / n_good, n_bad / n_good * 4 / 3
        say(f"note: the KTO paper advises desirable-weight x {n_good} / (undesirable-weight x {n_bad}) between 1 "
            f"and 4/3; with --undesirable-weight 1 that is --desirable-weight {lo:.3g} to {hi:.3g}")


def per_mark(row: dict) -> None:
    """The log row's reward sums (over all examples) as means over the desirable and undesirable examples."""
    share = row["desirable_share"]  # a step without one kind logs no reward for it
    for name, part in (("rewards_desirable", share), ("rewards_undesirable", 1 - share)):
        total = row.pop(name)
        if part > 0:
            row[name] = round(total / part, 6)
    if 0 < share < 1:
        row["reward_margin"] = round(row["rewards_desirable"] - row["rewards_undesirable"], 6)


def eval_metrics(s: dict) -> dict:
    n, nd = max(1, s["n"]), s["nd"]
    out = {"eval_loss": round(s["loss"] / n, 6), "eval_kl": round(s["kl"] / n, 6)}
    if nd > 0:
        out["eval_rewards_desirable"] = round(s["rd"] / nd, 6)
    if s["n"] - nd > 0:
        out["eval_rewards_undesirable"] = round(s["ru"] / (s["n"] - nd), 6)
    if 0 < nd < s["n"]:
        out["eval_reward_margin"] = round(out["eval_rewards_desirable"] - out["eval_rewards_undesirable"], 6)
    return out


def reference_scores(model, pad_id: int, setup, head: Head | None):
    """score(chunk) for reference.reference_pass: each example's and its mismatched pair's log-probabilities."""
    def score(chunk: list[Item]) -> list[tuple[float, float]]:
        lp = logps(model, [x.ex for x in chunk] + [x.kl for x in chunk], pad_id, setup.device, head).float().tolist()
        return list(zip(lp[:len(chunk)], lp[len(chunk):]))

    return score
