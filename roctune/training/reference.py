"""The reference model's scores, computed once before preference training (dpo, kto) so that no second copy of
the model is kept: the starting model scores every item without gradients, and the loss compares against them."""
from __future__ import annotations

from roctune.training import loop


def before_training(items: list, eval_items: list, setup, batch_size: int, scorer, progress: bool, say,
                    line: str):
    """Task.before_training of a recipe that compares with the reference: the starting model scores the items
    this process trains on (their indices, `mine`) and every eval item, once, before the first step.
    `scorer(model)` gives score(chunk) (reference_pass); `line` is logged first, with {n} the number scored."""
    from roctune.progress import Progress

    def score_all(model, mine: list[int]) -> None:
        todo = [items[i] for i in mine] + eval_items
        say(line.format(n=len(todo)))
        reference_pass(model, todo, setup, batch_size, scorer(model), Progress(len(todo), 0, progress, "reference"),
                       say)

    return score_all


def reference_pass(model, todo: list, setup, batch_size: int, score, bar, say) -> None:
    """The reference's scores, once before training (dpo, kto): `score(chunk)` gives each item of a chunk its
    `ref` from the model as it is now, run without gradients in eval mode and the run's autocast; `bar` counts."""
    import torch

    model.eval()
    with torch.no_grad():
        for s in range(0, len(todo), batch_size):
            chunk = todo[s:s + batch_size]
            with loop.autocast(setup):
                refs = score(chunk)
            for x, ref in zip(chunk, refs):
                x.ref = ref
            bar.update(s + len(chunk), "", say)
    bar.close()
    model.train()
