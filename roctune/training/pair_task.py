"""The loop's task for a recipe that scores preference pairs (dpo, rm): per micro-batch a loss per pair and a
reward for each answer; logged are the mean rewards of chosen and rejected answers, their margin, and the share of
pairs whose chosen answer scores higher (its name is the recipe's: dpo's reward_accuracy, rm's accuracy). `scores`:
a scalar head's score of each example, as a reward model trains (recipes/rm.py) and is used (eval/reward_model.py)."""
from __future__ import annotations

from roctune.training import loop
from roctune.training.batching import collate


def scores(model, examples: list, pad_id: int, device: str):
    """One float score per tokenized example, in one right-padded forward (the head reads the last non-pad token)."""
    batch = collate(examples, pad_id, False, device)
    return model(input_ids=batch.input_ids, use_cache=False).logits.squeeze(-1).float()


def pair_task(items: list, eval_items: list, scored, accuracy: str, **more) -> loop.Task:
    """`scored(model, batch) -> (per-pair loss, chosen rewards, rejected rewards)`; items have `chosen` and
    `rejected` Tokenized examples; `more`: the Task's other fields (before_training)."""
    def loss_sum(model, batch):
        loss, ch, rj = scored(model, batch)
        # device tensors: the loop reads the step's sums from the device once, for its log row
        return loss.sum(), {"rewards_chosen": ch.detach().sum(), "rewards_rejected": rj.detach().sum(),
                            accuracy: (ch > rj).float().sum()}

    def eval_sums(model, batch):
        loss, ch, rj = scored(model, batch)
        return {"loss": float(loss.sum()), "margin": float((ch - rj).sum()), "acc": float((ch > rj).float().sum()),
                "n": len(batch)}

    def eval_metrics(s: dict) -> dict:
        n = max(1, s["n"])
        return {"eval_loss": round(s["loss"] / n, 6), "eval_reward_margin": round(s["margin"] / n, 6),
                f"eval_{accuracy}": round(s["acc"] / n, 4)}

    def tokens(x) -> int:
        return len(x.chosen.input_ids) + len(x.rejected.input_ids)

    return loop.Task(
        items=items, eval_items=eval_items, lengths=[tokens(x) for x in items], loss_sum=loss_sum,
        weight=lambda x: 1, tokens=tokens, metric_names=("rewards_chosen", "rewards_rejected", accuracy),
        norm_name="pairs",
        derived=lambda row: row.update(reward_margin=round(row["rewards_chosen"] - row["rewards_rejected"], 6)),
        eval_names=("loss", "margin", "acc", "n"), eval_sums=eval_sums, eval_metrics=eval_metrics, **more)
