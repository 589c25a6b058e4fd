"""A run that breaks numerically stops as failed, never as done: a step's loss or gradient norm, and the trainable
weights at every save, must be finite numbers. NaN spreads: one overflowing step (a huge learning rate or loss
weight, a fp16 overflow) turns every later step and the saved adapter into NaN while the loop would carry on."""
from __future__ import annotations

from roctune.errors import TrainingError
from roctune.training import distributed
from roctune.training.distributed import Context


def check_step(row: dict, cfg) -> None:
    """A loss or gradient norm that is not a finite number (an overflow, a NaN in the data's numbers, a learning
    rate that blew up) has already spread into the weights through this step's update, and every later step would
    be NaN too: the run stops here as failed (status.json), the step is not logged as trained and nothing of it is
    saved; the checkpoints written before stay. Every rank sees the same summed loss and global gradient norm,
    so all stop together."""
    import math

    bad = next((k for k in ("loss", "grad_norm") if k in row and not math.isfinite(row[k])), None)
    if bad is not None:
        raise TrainingError(f"step {row['step']}: the {bad.replace('_', ' ')} is {row[bad]}, not a finite number; "
                            f"the run stopped as failed without saving these weights: lower --lr (now "
                            f"{cfg.lr:g}), keep --max-grad-norm on, or check the data's numbers", key="not_finite",
                            field=bad, step=row["step"])


def check_weights(model, dist: Context, what: str) -> None:
    """Refuse to save trainable weights that hold a NaN or an infinity (a last update that overflowed leaves a
    finite loss behind it): the run fails instead of reporting broken weights as done. Collective: every rank
    checks its own tensors (its shards under FSDP) and all take the same decision."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return
    bad = torch.stack([torch.isfinite(p.detach()).all() for p in params]).logical_not().sum()
    (bad,) = distributed.sum_numbers(dist, [float(bad)], str(params[0].device))
    if bad:
        raise TrainingError(f"{what}: {int(bad)} trainable tensor(s) hold NaN or infinite values; the run stopped "
                            "as failed without saving them: lower --lr or keep --max-grad-norm on",
                            key="not_finite_weights")
