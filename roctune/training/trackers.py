"""Experiment trackers (`--report-to tensorboard,wandb,mlflow,trackio,swanlab`): every row the loop writes to
metrics.jsonl goes to each chosen tracker too, with the same step number and values, so a curve in TensorBoard
or W&B is the curve of metrics.jsonl and loss.png.

Names: `train/<key>` for a training row's values (loss, lr, grad_norm, tokens_per_s, peak_memory_gib, ...) and
`eval/<key>` for its `eval_<key>` values. TensorBoard writes into the run directory (`tensorboard/`); the others
log where their own settings say (WANDB_PROJECT, MLFLOW_TRACKING_URI, ...; the project defaults to "roctune").
Each package is imported only when chosen, and a missing one is reported before the model loads (`check`)."""
from __future__ import annotations

import functools
import importlib.util
import logging
import os

from roctune import rundir
from roctune.errors import EnvironmentProblem

log = logging.getLogger(__name__)

# tracker -> the module it needs and the package that installs it
PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
            "mlflow": ("mlflow", "mlflow"), "trackio": ("trackio", "trackio"), "swanlab": ("swanlab", "swanlab")}
SKIP = ("step", "epoch", "micro_batch_size")  # the x axis, and a setting rather than a measurement


def chosen(names: list[str]) -> list[str]:
    return [n for n in names if n != "none"]


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def check(names: list[str]) -> None:
    """Refuse a tracker whose package is not installed, with the one-line fix."""
    for name in chosen(names):
        module, package = PACKAGES[name]
        if not installed(module):
            raise EnvironmentProblem(f"--report-to {name} needs the {package} package: pip install {package} "
                                     f"(or drop {name} from --report-to)")


def scalars(row: dict) -> dict[str, float]:
    """A metrics.jsonl row as tracker scalars: train/<key> and eval/<key> (no step: it is the x axis)."""
    out = {}
    for k, v in row.items():
        if k in SKIP or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        out[f"eval/{k[5:]}" if k.startswith("eval_") else f"train/{k}"] = float(v)
    return out


class _TensorBoard:
    def __init__(self, run_dir: str, config: dict, start: int):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: a resumed run drops the events after its checkpoint, as metrics.jsonl drops its rows
        self.w = SummaryWriter(log_dir=rundir.tensorboard_dir(run_dir), purge_step=start or None)
        if not start:
            self.w.add_text("config", "\n".join(f"    {k}: {v}" for k, v in config.items()))

    def log(self, values: dict, step: int) -> None:
        for k, v in values.items():
            self.w.add_scalar(k, v, step)

    def close(self) -> None:
        self.w.close()


class _WandbLike:
    """A tracker whose package has wandb's calls (wandb, trackio, swanlab): init(project, run name, config), then
    log(values, step=...) and finish() at module level. The project comes from `project_env`, default "roctune"."""

    def __init__(self, run_dir: str, config: dict, start: int, *, tracker: str, project_env: str,
                 name_key: str = "name", dir_key: str | None = None):
        import importlib

        self.m = importlib.import_module(PACKAGES[tracker][0])
        where = {dir_key: run_dir} if dir_key else {}
        self.m.init(project=os.environ.get(project_env, "roctune"), **{name_key: _name(run_dir)}, config=config,
                    **where)

    def log(self, values: dict, step: int) -> None:
        self.m.log(values, step=step)

    def close(self) -> None:
        self.m.finish()


class _Mlflow:
    def __init__(self, run_dir: str, config: dict, start: int):
        import mlflow

        self.m = mlflow
        mlflow.start_run(run_name=_name(run_dir))
        mlflow.log_params({k: str(v)[:500] for k, v in config.items()})

    def log(self, values: dict, step: int) -> None:
        self.m.log_metrics({k.replace("/", "_"): v for k, v in values.items()}, step=step)

    def close(self) -> None:
        self.m.end_run()


BACKENDS = {"tensorboard": _TensorBoard, "mlflow": _Mlflow,
            "wandb": functools.partial(_WandbLike, tracker="wandb", project_env="WANDB_PROJECT", dir_key="dir"),
            "trackio": functools.partial(_WandbLike, tracker="trackio", project_env="TRACKIO_PROJECT"),
            "swanlab": functools.partial(_WandbLike, tracker="swanlab", project_env="SWANLAB_PROJECT",
                                         name_key="experiment_name")}


def _name(run_dir: str) -> str:
    return os.path.basename(os.path.abspath(run_dir))


class Trackers:
    """The chosen trackers of one run (none: every call does nothing). Only the process that writes
    metrics.jsonl opens them."""

    def __init__(self, names: list[str], run_dir: str, config: dict, start: int = 0):
        self.backends = [BACKENDS[n](run_dir, config, start) for n in chosen(names)]

    def log(self, row: dict) -> None:
        if self.backends:
            values = scalars(row)
            for b in self.backends:
                b.log(values, int(row["step"]))

    def close(self) -> None:
        for b in self.backends:
            try:
                b.close()
            except Exception as e:  # noqa: BLE001 - a tracker failing to flush must not lose the trained model
                log.warning("closing a tracker failed: %s", e)
