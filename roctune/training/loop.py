"""The one training loop. It knows nothing about SFT or DPO: a recipe hands it a `Task` (the items, their lengths,
and a function giving the summed loss of a micro-batch), and the loop owns, once, for every recipe: the batch
plan, gradient accumulation, autocast, clipping, the schedule, out-of-memory auto-batch, evaluation, metrics,
checkpoints, exact resume and several processes.

How a step is computed. Each optimizer step takes the planned micro-batches of the step; every micro-batch's
summed loss is divided by the step's normaliser (the sum of `Task.weight` over all the step's items: supervised
tokens for SFT, pairs for DPO), so accumulation gives exactly the gradient of the whole step's mean.

Several processes (torchrun; see roctune.training.distributed):
- The plan is the one-process plan with grad_accum x world_size micro-batches per step, and rank r computes
  micro-batches r, r + world_size, ... of each step. Every rank knows the plan, hence the normaliser.
- The model is wrapped in DistributedDataParallel, which averages gradients while backward runs; the loss is
  multiplied by world_size so the average becomes the sum, i.e. exactly the gradient one process gets with
  grad_accum x world_size accumulation. Only the last micro-batch of a step synchronises (`no_sync` before).
- With --fsdp the model is sharded instead; FSDP reduce-scatters the gradients itself (same scaling).
- Only rank 0 writes run.yaml, metrics.jsonl and checkpoints; the others wait at barriers.
- With --sequence-parallel P, the P ranks of a sequence group split the tokens of the same micro-batches
  (roctune.training.sequence_parallel): the plan is shared over the world_size / P groups (`dp_rank`, `dp_size`),
  each rank's loss is the sum over its own tokens, and the same DDP sum over every rank gives the gradient of the
  group's whole examples, summed over the groups. Token counts are taken from the first rank of each group.

Best weights and early stopping. With --early-stopping-patience K or --load-best, every evaluation whose eval loss
is the lowest so far (the Task's best_metric: GRPO keeps the highest eval reward) writes the trainable weights to DIR/best (a loadable adapter); K evaluations in a row without
a lower eval loss end training there. With --load-best, each process also keeps a CPU copy of its own trainable
tensors at the best evaluation (its shards under FSDP) and puts them back when training ends, so the model that
`session.save_final` saves is the best one, whatever the method or number of processes. Every rank computes the same eval loss (summed over ranks), so all ranks take the same decision.
Rows logged to metrics.jsonl also go to the --report-to trackers (roctune.training.trackers).
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from roctune import rundir
from roctune.errors import ConfigError
from roctune.progress import Progress
from roctune.training import checkpoint, distributed, numerics
from roctune.training.batching import plan_steps
from roctune.training.distributed import Context
from roctune.training.oom import free_memory, is_out_of_memory, out_of_memory_error
from roctune.training.optim import make_optimizer, make_scheduler, optimizer_step
from roctune.training.session import Setup, write_run_yaml
from roctune.training.trackers import Trackers

log = logging.getLogger(__name__)


@dataclass
class Task:
    """What a recipe gives the loop.

    loss_sum(model, items) -> (summed loss tensor, {name: summed metric}) for one micro-batch (a metric may stay a
    device tensor: the loop reads the step's sums from the device once, for the log row); each metric is
    logged as its step sum divided by the step's normaliser. weight(item) is the item's share of that
    normaliser (logged as `norm_name`), tokens(item) its token count. eval_sums(model, items) -> {name: sum} (the names in eval_names) for a
    batch of eval items (no gradients); eval_metrics turns the summed dict into logged values. derived(row) adds
    metrics computed from others (e.g. DPO's reward margin). before_training(model, items) runs once, before a
    resumed checkpoint's weights are loaded, with the indices this process will train on (DPO scores its
    reference there)."""

    items: list
    eval_items: list
    lengths: list[int]
    loss_sum: Callable[[Any, list], tuple[Any, dict[str, float]]]
    weight: Callable[[Any], float]
    tokens: Callable[[Any], int]
    metric_names: tuple[str, ...] = ()
    norm_name: str = "weight"
    eval_names: tuple[str, ...] = ("loss", "n")
    eval_sums: Callable[[Any, list], dict[str, float]] | None = None
    eval_metrics: Callable[[dict[str, float]], dict[str, float]] = field(default=lambda s: {})
    derived: Callable[[dict], None] = field(default=lambda row: None)
    before_training: Callable[[Any, list[int]], None] | None = None
    rollout: Callable[[Any, list, int], tuple[list, dict[str, float]]] | None = None
    expand: int = 1
    best_metric: str = "eval_loss"
    higher_is_better: bool = False
    show: str = "loss"  # the metric the progress line shows


def autocast(setup: Setup):
    """bf16/fp16 autocast on GPUs when that dtype was chosen; nothing on the CPU (fp32 there)."""
    from roctune.hardware import accel

    return accel.autocast(setup.device, setup.dtype)


def _engine(model, task: Task, cfg, setup: Setup, dist: Context):
    """(forward, model, ddp): forward(items) -> (loss, sums), through DistributedDataParallel when several
    processes keep full copies (the task's loss, which may call the decoder directly, then runs inside DDP's
    forward); with --fsdp the model is sharded in place instead."""
    import torch

    if dist.enabled and cfg.fsdp:
        model = distributed.shard_model(model)
    if not dist.enabled or cfg.fsdp:
        return (lambda items: task.loss_sum(model, items)), model, None

    class StepModule(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, items):
            return task.loss_sum(self.inner, items)

    ddp = distributed.wrap_ddp(StepModule(model), dist, setup.device)
    return ddp, model, ddp


def fit(cfg, setup: Setup, model, task: Task, dist: Context, say, progress: bool, save=None) -> tuple[Any, dict]:
    """Train `model` on `task` as cfg says; returns (the trained model, a summary). `save(model)` saves the final
    model; given, it runs right after the last step, before that step's evaluation, so an interrupt during the
    evaluation keeps the trained model (summary["saved_final"] says whether it ran and still holds)."""
    import torch

    steps, steps_per_epoch = plan_steps(task.lengths, cfg, dist.dp_size)
    # LoRA weights train in fp32 even when the base model is bf16/fp16 (stable updates, tiny cost).
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()
    blob = checkpoint.load(cfg.output, dist) if cfg.resume else None
    start = blob["step"] if blob else 0
    if start >= len(steps):
        if rundir.final_adapter_saved(cfg.output):
            raise ConfigError(f"--resume: {cfg.output} has already trained {start} of the {len(steps)} steps these "
                              "settings plan; give a larger --max-steps or --epochs to continue it")
        return checkpoint.finish_interrupted_save(cfg, model, blob, len(steps), say)
    if task.before_training:
        mine = sorted({i for s in steps[start:] for mb in s[dist.dp_rank::dist.dp_size] for i in mb})
        task.before_training(model, mine)
    if blob:  # weights go in before sharding; every rank got the same checkpoint from rank 0
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, blob["weights"])
    from roctune.training import compiled, fused

    # before DDP/FSDP wrap the model: kernels and the layers' forward are replaced in place, whatever wraps them
    # later; the fused kernels first, so the compiled layers trace them
    say(fused.apply(model, cfg.fused_kernels, setup.device, setup.dtype))
    say(compiled.apply(model, cfg.compile, setup.device, len(steps) - start, cfg.stage, cfg.sequence_parallel))
    forward, model, ddp = _engine(model, task, cfg, setup, dist)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, cfg, setup.device)
    scheduler = make_scheduler(optimizer, cfg, len(steps))
    if dist.enabled:
        torch.manual_seed(cfg.seed + dist.rank)  # dropout masks differ between ranks, as between micro-batches
    if blob:
        checkpoint.restore(blob, model, optimizer, scheduler, dist)
        say(f"resumed from step {start}")
    if dist.is_main:
        rundir.reset_metrics(cfg.output, keep_until_step=start)
        write_run_yaml(cfg, setup, len(task.items), len(task.eval_items), len(steps), dist.world_size)
    _describe(cfg, setup, task, dist, len(steps), say)
    state = _State(cfg, setup, task, dist, steps, steps_per_epoch, forward, ddp, params)
    state.trackers = Trackers(cfg.report_to if dist.is_main else [], cfg.output, cfg.to_dict(), start)
    state.save = save
    try:
        summary = state.run(model, optimizer, scheduler, start, say, progress)
    finally:
        state.trackers.close()
    if summary.get("best_step") is not None:
        say(f"best {task.best_metric.replace('_', ' ')} {summary['best_value']:.4f} at step {summary['best_step']}: "
            f"kept in {rundir.best_dir(cfg.output)}")
        if cfg.load_best:
            said = state.load_best(model)
            summary["saved_final"] = summary["saved_final"] and state.best_weights is None
            say(said)
    return model, summary


def _describe(cfg, setup: Setup, task: Task, dist: Context, total: int, say) -> None:
    eff = cfg.batch_size * cfg.grad_accum * dist.dp_size
    procs = f" x {dist.dp_size} processes" if dist.dp_size > 1 else ""
    say(f"examples: {len(task.items)} train, {len(task.eval_items)} eval; {total} optimizer steps of {eff} examples "
        f"({cfg.batch_size} per micro-batch x {cfg.grad_accum} accumulation{procs}); "
        f"{'packed (padding-free)' if setup.packed else 'padded'} batches")
    if dist.enabled:
        how = "FSDP: sharded model" if cfg.fsdp else "DDP: a full model copy in each, gradients all-reduced"
        say(f"processes: {dist.world_size} ({dist.backend}; {how})")
    if dist.sp_size > 1:
        say(f"sequence parallel: {dist.dp_size} group(s) of {dist.sp_size} processes, each process keeps 1/"
            f"{dist.sp_size} of every example's tokens")


class _State:
    """The loop's moving parts for one run (a class only to keep each function short)."""

    def __init__(self, cfg, setup: Setup, task: Task, dist: Context, steps, steps_per_epoch: int, forward, ddp,
                 params: list):
        self.cfg, self.setup, self.task, self.dist = cfg, setup, task, dist
        self.steps, self.steps_per_epoch = steps, steps_per_epoch
        self.forward, self.ddp, self.params = forward, ddp, params
        self.scale = dist.world_size if dist.enabled else 1  # DDP/FSDP average gradients; we want their sum
        self.micro_size = cfg.batch_size  # halved by --auto-batch after an out-of-memory error
        self.say = lambda *_: None  # run() sets the caller's
        self.keep_best = cfg.early_stopping_patience > 0 or cfg.load_best
        # a resumed run continues from the best it had kept (the count of evaluations without improvement restarts)
        self.best = rundir.read_best(cfg.output) if cfg.resume and self.keep_best else None
        self.bad = 0
        self.best_weights: dict | None = None  # --load-best: this process's trainable tensors at the best eval
        self.trackers = Trackers([], cfg.output, {})
        self.save = None  # fit() sets the recipe's final save
        self.status_at = 0.0  # when status.json was last written
        self.model = None  # run() sets the model the rollouts sample from
        self.rollout_sums: dict[str, float] = {}  # the last rollout's sums over ranks, for the step's row

    def run(self, model, optimizer, scheduler, start: int, say, progress: bool) -> dict:
        self.say, self.model = say, model
        total = len(self.steps)
        bar = Progress(total, start, enabled=progress and self.dist.is_main)
        t_start, tokens_done, losses, last, done, stop = time.perf_counter(), 0, [], {}, start, False
        saved = False
        model.train()
        try:
            for step in range(start, total):
                t0 = time.perf_counter()
                sums, n_tok, norm = self.accumulate(step, say)
                lr, grad_norm = optimizer_step(self.params, optimizer, scheduler, self.cfg.max_grad_norm)
                tokens_done, done = tokens_done + n_tok, step + 1
                last = self.row(done, sums, norm, n_tok, lr, grad_norm, time.perf_counter() - t0)
                numerics.check_step(last, self.cfg)
                if self.task.eval_items and self.eval_due(done):
                    self.status("evaluating", done, total, last, t_start, start, force=True)
                    if done == total and self.save is not None:
                        say("saving the final model before the last evaluation")
                        self.save(model)
                        saved = True
                    last.update(self.evaluate(model))
                    stop = self.after_eval(model, last, say)
                losses.append(last["loss"])
                self.log_row(last, force=stop)
                self.status("training", done, total, last, t_start, start, force=stop or done == total)
                bar.update(done, f"{self.task.show} {last[self.task.show]:.4f}  "
                           f"{tokens_done / (time.perf_counter() - t_start):,.0f} tok/s", say)
                if stop:
                    break
                # the last step is checkpointed too (as transformers' Trainer does): a finished run can be continued
                # with --resume and a larger --max-steps or --epochs
                if self.cfg.save_steps and (done % self.cfg.save_steps == 0 or done == total):
                    checkpoint.save(self.cfg.output, done, model, optimizer, scheduler, self.dist,
                                    self.cfg.save_total_limit)
        finally:
            bar.close()
        elapsed = time.perf_counter() - t_start
        best = self.best or {}
        return {"steps": done, "planned_steps": total, "stopped_early": stop, "saved_final": saved,
                "best_step": best.get("step"), "best_eval_loss": best.get("eval_loss"),
                "best_value": best.get(self.task.best_metric),
                "final_loss": losses[-1] if losses else None,
                "mean_loss": sum(losses) / len(losses) if losses else None,
                "tokens_per_s": tokens_done / elapsed if elapsed > 0 else 0.0, "seconds": elapsed,
                "output": self.cfg.output, **{k: v for k, v in last.items() if k.startswith("eval_")}}

    def status(self, phase: str, done: int, total: int, row: dict, t_start: float, start: int,
               force: bool = False) -> None:
        """The run's status.json (rank 0): phase, step of total, ETA and the last row; at most twice a second, so
        a tiny model's many steps per second do not turn into as many file writes."""
        now = time.perf_counter()
        if not self.dist.is_main or (not force and now - self.status_at < 0.5):
            return
        self.status_at = now
        eta = (now - t_start) / max(1, done - start) * (total - done)
        rundir.status.write_status(self.cfg.output, phase, step=done, total=total, eta_s=round(eta, 1),
                                   metrics={k: v for k, v in row.items() if isinstance(v, (int, float)) and v == v})

    def after_eval(self, model, row: dict, say) -> bool:
        """Keep the best weights (with --early-stopping-patience or --load-best); True when training should stop:
        K evaluations in a row without a better Task.best_metric (a lower eval loss; GRPO: a higher eval reward)."""
        m = self.task.best_metric
        if not self.keep_best or m not in row:
            return False
        if self.best is None or m not in self.best or self.better(row[m], self.best[m]):
            self.best, self.bad = {"step": row["step"], m: row[m]}, 0
            if self.cfg.load_best:
                self.best_weights = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()
                                     if p.requires_grad}
            weights = distributed.full_trainable_state(model)  # every rank joins the gather of a sharded model
            if self.dist.is_main:
                rundir.save_best(self.cfg.output, lambda folder: checkpoint.save_weights(model, folder, weights),
                                 self.best)
            distributed.barrier(self.dist)
            return False
        self.bad += 1
        patience = self.cfg.early_stopping_patience
        if patience and self.bad >= patience:
            say(f"early stopping at step {row['step']}: {m.replace('_', ' ')} has not improved for {self.bad} "
                f"evaluations (best {self.best[m]:.4f} at step {self.best['step']})")
            return True
        return False

    def load_best(self, model) -> str:
        """--load-best: put the best evaluation's weights back into the model; returns what was done."""
        import torch

        if self.best_weights is None:  # the best came before a resume and was not beaten since
            return (f"--load-best: the best weights (step {self.best['step']}) are from before the resume; they "
                    f"stay in {rundir.best_dir(self.cfg.output)} and the final adapter is the last step's")
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in self.best_weights:
                    p.copy_(self.best_weights[n].to(p.device))
        m = self.task.best_metric
        return (f"--load-best: the final adapter is the best one (step {self.best['step']}, "
                f"{m.replace('_', ' ')} {self.best[m]:.4f})")

    def better(self, value: float, best: float) -> bool:
        return value > best if self.task.higher_is_better else value < best

    def eval_due(self, done: int) -> bool:
        return (self.cfg.eval_steps and done % self.cfg.eval_steps == 0) or done == len(self.steps)

    def accumulate(self, step: int, say) -> tuple[dict[str, float], int, float]:
        """Forward and backward of this rank's micro-batches of `step`; returns (metric sums over all ranks,
        tokens over all ranks, the step's normaliser). An out-of-memory error drops the half-accumulated step
        and, with --auto-batch, retries it with half the micro-batch (the rollout is not redone)."""
        task, plan = self.task, self.steps[step]
        mine = plan[self.dist.dp_rank::self.dist.dp_size]
        if task.rollout is not None:
            groups, fallback, norm = self.rollout(mine, plan, step)
        else:
            groups = [[task.items[i] for i in mb] for mb in mine]
            fallback = task.items[plan[0][0]]
            norm = max(1e-12, sum(task.weight(task.items[i]) for mb in plan for i in mb))
        while True:
            size = self.micro_size * task.expand
            micro = [g[s:s + size] for g in groups for s in range(0, len(g), size)]
            try:
                sums, n_tok = self.backward_all(micro, fallback, norm)
                break
            except Exception as e:  # noqa: BLE001 - only out-of-memory errors are handled
                if not is_out_of_memory(e):
                    raise
                self.recover(e, step, say)
        if self.dist.enabled:
            sums = host_numbers(sums)
            values = distributed.sum_numbers(self.dist, [sums[k] for k in sums] + [n_tok], self.setup.device)
            sums, n_tok = dict(zip(sums, values[:-1])), int(values[-1])
        return sums, n_tok, norm

    def rollout(self, mine: list, plan: list, step: int) -> tuple[list[list], Any, float]:
        """The task's rollout of this rank's prompts on the bare model, without gradients (outside DDP and
        autocast); returns (the trained items of each micro-batch, an item for a rank with none, the step's
        normaliser over every rank). The rollout's sums over ranks are kept for the step's row."""
        import torch

        task = self.task
        prompts = [task.items[i] for mb in mine for i in mb] or [task.items[plan[0][0]]]  # a rank with none joins
        with torch.no_grad():
            made, sums = task.rollout(self.model, prompts, step)
        if not mine:
            groups, sums = [], {k: 0.0 for k in sums}
        else:
            bounds = [0]
            for mb in mine:
                bounds.append(bounds[-1] + len(mb) * task.expand)
            groups = [made[a:b] for a, b in zip(bounds, bounds[1:])]
        weight = sum(task.weight(x) for g in groups for x in g)
        if self.dist.enabled:
            values = distributed.sum_numbers(self.dist, [weight] + list(sums.values()), self.setup.device)
            weight, sums = values[0], dict(zip(sums, values[1:]))
        self.rollout_sums = sums
        return groups, made[0], max(1e-12, weight)

    def backward_all(self, micro: list[list], fallback, norm: float) -> tuple[dict[str, float], int]:
        sums = {k: 0.0 for k in ("loss",) + self.task.metric_names}
        n_tok = 0
        if not micro:  # a rank with nothing left in a short last step still joins the gradient all-reduce
            micro, weight = [[fallback]], 0.0
        else:
            weight = 1.0
        for j, items in enumerate(micro):
            sync = self.ddp is None or j == len(micro) - 1
            with (contextlib.nullcontext() if sync else self.ddp.no_sync()):
                with autocast(self.setup):
                    loss, extra = self.forward(items)
                (loss * (weight * self.scale / norm)).backward()
            if weight:  # device tensors: summed without waiting for the device; row() reads them once per step
                sums["loss"] = sums["loss"] + loss.detach()
                for k, v in extra.items():
                    sums[k] += v
                if self.dist.sp_rank == 0:  # a sequence group's ranks share its items
                    n_tok += sum(self.task.tokens(x) for x in items)
        return sums, n_tok

    def recover(self, e: BaseException, step: int, say) -> None:
        for p in self.params:  # drop the half-accumulated step and free its memory
            p.grad = None
        free_memory(self.setup.device)
        if not self.cfg.auto_batch or self.micro_size == 1 or self.dist.enabled:
            raise out_of_memory_error(self.cfg, self.setup, step + 1, self.micro_size) from None
        import math

        self.micro_size = (self.micro_size + 1) // 2
        say(f"out of memory at step {step + 1}: retrying with {self.micro_size} examples per micro-batch and "
            f"{math.ceil(self.cfg.batch_size / self.micro_size) * self.cfg.grad_accum}x accumulation "
            f"(same {self.cfg.batch_size * self.cfg.grad_accum} examples per optimizer step)")

    def row(self, done: int, sums: dict, norm: float, n_tok: int, lr: float, grad_norm, dt: float) -> dict:
        # the step's one wait for the device, for what the log shows
        sums = host_numbers({**sums, "grad_norm": grad_norm} if grad_norm is not None else sums)
        row = {"step": done, "epoch": round(done / self.steps_per_epoch, 4), "loss": round(sums["loss"] / norm, 6),
               "lr": lr}
        for k in self.task.metric_names:
            row[k] = round(sums[k] / norm, 6)
        row[self.task.norm_name] = round(norm, 6) if norm != int(norm) else int(norm)
        row.update(self.rollout_sums)
        self.task.derived(row)
        if grad_norm is not None:
            row["grad_norm"] = round(sums["grad_norm"], 6)
        row.update({"tokens_per_s": round(n_tok / dt, 1), "step_time_s": round(dt, 3), "tokens": n_tok,
                    "micro_batch_size": self.micro_size,
                    "peak_memory_gib": round(peak_memory_gib(self.setup.device), 3)})
        return row

    def log_row(self, row: dict, force: bool = False) -> None:
        if self.dist.is_main and (force or row["step"] % self.cfg.logging_steps == 0
                                  or row["step"] == len(self.steps) or self.task.best_metric in row):
            rundir.append_metrics(self.cfg.output, row)
            self.trackers.log(row)

    def evaluate(self, model) -> dict[str, float]:
        return evaluate(model, self.task, self.cfg.batch_size, self.setup,
                        distributed.SINGLE if self.cfg.fsdp else self.dist, self.say)


def host_numbers(sums: dict) -> dict[str, float]:
    """{name: float} from a step's sums, some of them device tensors; one transfer for all the tensors (a
    stack), not one wait per value."""
    import torch

    keys = [k for k, v in sums.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in sums.items() if k not in keys}
    if keys:
        values = torch.stack([sums[k].float().reshape(()) for k in keys]).tolist()
        out.update(zip(keys, values))
    return out


def peak_memory_gib(device: str) -> float:
    """Peak memory so far: allocated GPU memory on a GPU (this process), this process's own peak resident memory
    on the CPU (accel.peak_memory_bytes)."""
    from roctune.hardware import accel

    return accel.peak_memory_bytes(device) / 2**30


def evaluate(model, task: Task, batch_size: int, setup: Setup, dist: Context = distributed.SINGLE,
             say=lambda *_: None) -> dict:
    """The task's eval metrics over its eval items; with several processes each takes every world_size-th batch
    (FSDP passes SINGLE: every rank must run the same forward passes; the ranks of a sequence group take the same
    batches, and their sums add up to the batches'). A long evaluation reports its progress."""
    import torch

    from roctune.progress import counted

    model.eval()
    sums = {k: 0.0 for k in task.eval_names}
    items = task.eval_items
    with torch.no_grad():
        starts = range(dist.dp_rank * batch_size, len(items), batch_size * dist.dp_size)
        for s in counted(starts, "evaluating batch", say if dist.is_main else (lambda *_: None)):
            with autocast(setup):
                part = task.eval_sums(model, items[s:s + batch_size])
            for k in task.eval_names:
                sums[k] += part[k]
    model.train()
    if dist.enabled:
        sums = dict(zip(sums, distributed.sum_numbers(dist, list(sums.values()), setup.device)))
    return task.eval_metrics(sums)
