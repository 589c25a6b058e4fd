"""The reference model's scores, computed once before preference training (dpo, kto) so that no second copy of
the model is kept: the starting model scores every item without gradients, and the loss compares against them."""
from __future__ import annotations

from roctune.training import loop


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
