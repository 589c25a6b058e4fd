"""metrics.jsonl (one JSON object per logged optimizer step) and the loss.png drawn from it."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from roctune.rundir.atomic import atomic_write_text
from roctune.rundir.layout import LOSS_PLOT, METRICS_FILE


def metrics_path(run_dir: str) -> str:
    return os.path.join(run_dir, METRICS_FILE)


def json_line(row: dict, **kw: Any) -> str:
    """One JSONL line that every JSON reader accepts: a NaN or infinite number (a diverged loss, a step no reward
    scored) is written as null, not as Python's NaN/-Infinity, which are not JSON."""
    def finite(v):
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            return None
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        return [finite(x) for x in v] if isinstance(v, (list, tuple)) else v

    return json.dumps(finite(row), allow_nan=False, **kw) + "\n"


def append_metrics(run_dir: str, row: dict) -> None:
    with open(metrics_path(run_dir), "a", encoding="utf-8") as f:
        f.write(json_line(row))


def read_metrics(run_dir: str) -> list[dict]:
    """Every logged row; [] when there is none yet. A line being written (no newline yet) is skipped."""
    rows = []
    try:
        with open(metrics_path(run_dir), encoding="utf-8") as f:
            for line in f:
                if line.endswith("\n") and line.strip():
                    try:
                        row = json.loads(line)
                    except (ValueError, RecursionError):
                        continue
                    if isinstance(row, dict) and is_number(row.get("step")):  # a damaged row is skipped
                        rows.append(row)
    except FileNotFoundError:
        return []
    return rows


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def reset_metrics(run_dir: str, keep_until_step: int = 0) -> None:
    """Drop the rows after `keep_until_step` (all of them for 0): a resumed run writes them again."""
    path = metrics_path(run_dir)
    if not os.path.isfile(path):
        return
    if keep_until_step <= 0:
        os.unlink(path)
        return
    keep = [json_line(r) for r in read_metrics(run_dir) if r["step"] <= keep_until_step]
    atomic_write_text(path, "".join(keep))


# GRPO's agent episodes (roctune.recipes.grpo_tools): drawn in a second panel under the reward, per episode
TOOL_CURVES = (("valid_tool_calls", "valid tool calls"), ("tool_calls", "tool calls"), ("tool_errors", "tool errors"),
               ("malformed_share", "malformed share"), ("cut_tokens", "cut by tokens"), ("cut_turns", "cut by turns"))


def plot_loss(run_dir: str) -> None:
    """loss.png from metrics.jsonl: train loss per step, eval loss where measured; for a run that logs a mean
    reward (GRPO, whose loss is near 0 by construction) the reward and eval reward instead, and for agent episodes
    their tool figures per episode in a second panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    key = "reward" if rows and all("reward" in r for r in rows) else "loss"
    tools = [(k, label) for k, label in TOOL_CURVES if rows and all(k in r for r in rows)]
    if tools:
        fig, (ax, low) = plt.subplots(2, 1, figsize=(6, 6), dpi=100, sharex=True)
    else:
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    y = lambda r, k: float("nan") if r[k] is None else r[k]  # noqa: E731 - null: a non-finite value (json_line)
    for k, label in tools:
        low.plot([r["step"] for r in rows], [y(r, k) for r in rows], label=label)
    if tools:
        low.set_ylabel("per episode")
        low.set_xlabel("optimizer step")
        low.grid(alpha=0.3)
        low.legend(fontsize="small")
    ax.plot([r["step"] for r in rows], [y(r, key) for r in rows], label=f"train {key}")
    ev = [r for r in rows if f"eval_{key}" in r]
    if ev:
        ax.plot([r["step"] for r in ev], [y(r, f"eval_{key}") for r in ev], "o-", label=f"eval {key}")
    if not tools:
        ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean reward (higher is better)" if key == "reward" else "loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".png", dir=run_dir)
    os.close(fd)
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, os.path.join(run_dir, LOSS_PLOT))
