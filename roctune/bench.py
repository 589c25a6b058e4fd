"""Throughput and memory of a fixed training workload: roctune's trainer against the standard transformers
`Trainer` + PEFT recipe (labels masked, dynamic padding), on identical examples, order and hyperparameters
(the same seeded shuffle; roctune's length grouping reorders within it unless --no-group-by-length).

Each measured run happens in its own child process (`python -m roctune.bench --worker ...`), so peak memory
is that run's alone (GPU: torch.cuda.max_memory_allocated; CPU: peak RSS of the process) and one run's
allocator state cannot help or hurt the next. The parent prints the comparison table and writes JSON.

With `compiled`, roctune also runs with --compile on (roctune.training.compiled); the parent reports the compiled
run's speed-up and its largest per-step loss difference from the eager run (same seed, same dropout masks).
Every run counts the aten ops of one optimizer step (OpCounter, torch.profiler; GPU kernels too on a GPU): the
launches a launch-bound GPU step pays for. It is the last step, and the run's peak memory is read at its end, before
the profiler turns its records into events: on the CPU that took 0.72 GiB of host memory that glibc and Python's
allocator keep (the bundled model's step, 121k ops: 3.38 GiB peak RSS against 2.65 GiB without the profiler), and
had been counted in the peak of every run since the counter came in. What the peak still holds of the profiler is
its records during that one step (about 0.4 KiB an op; 28 MiB on that step).

MFU counts model FLOPs per trained token the standard way for LoRA with frozen weights: 2·N forward +
2·N backward (input gradients only), N = parameters in matrix multiplies including the output layer,
plus attention; the peak is a large matmul in the training dtype measured on this device.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from roctune.method_rows import DEFAULT as DEFAULT_METHOD, METHODS

WORDS = ("the model learns from data and every answer follows a clear style while training runs on the "
         "graphics card or the processor with memory time speed loss rate batch token layer weight value "
         "question explain describe write list summarize compare short long simple detailed example "
         "river mountain city market garden music history science energy water light system network "
         "people work story plan design result method test report change problem reason idea number").split()


def make_dataset(path: str, n: int, seed: int = 0) -> None:
    """An alpaca-style dataset whose examples average about 200 tokens with the default model's template
    (prompt ~35%, answer ~65%), lengths spread from ~70 to ~450 tokens."""
    rng = random.Random(seed)

    def sentence(k: int) -> str:
        words = [rng.choice(WORDS) for _ in range(k)]
        return " ".join(words).capitalize() + "."

    def text(n_words: int) -> str:
        out, left = [], n_words
        while left > 0:
            k = min(left, rng.randint(6, 16))
            out.append(sentence(k))
            left -= k
        return " ".join(out)

    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            scale = rng.choice([0.4, 0.7, 1.0, 1.3, 1.8])
            row = {"instruction": text(int(rng.randint(15, 45) * scale)),
                   "input": text(int(rng.randint(0, 25) * scale)) if rng.random() < 0.4 else "",
                   "output": text(int(rng.randint(60, 130) * scale))}
            f.write(json.dumps(row) + "\n")


@dataclass
class Workload:
    model: str | None = None
    data: str | None = None
    max_steps: int = 12
    batch_size: int = 2
    grad_accum: int = 4
    max_length: int = 512
    lora_r: int = 8
    lora_alpha: float = 16
    lora_dropout: float = 0.05
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    lr: float = 2e-4
    seed: int = 42
    device: str = "auto"
    dtype: str = "auto"
    attn: str = "sdpa"
    packing: str = "auto"
    loss_on_supervised_only: bool = True
    grad_checkpointing: bool = False
    group_by_length: bool = True
    compile: str = "off"
    method: str = DEFAULT_METHOD  # an adapter method (a quantized one's baseline loads NF4 as QLoRA tutorials do)
    fused_kernels: str = "auto"
    offload: str = "auto"


# The optimizer step whose aten ops are counted (torch.profiler) is the last one (after the first, which compiles
# and warms the allocator, when there are two or more). Both it and the first are left out of tokens/s (the first
# step's time is reported on its own: it holds the compile).
FIRST_STEP = 0


class OpCounter:
    """torch.profiler around one optimizer step: aten ops (every aten:: call, nested ones included) and, on a GPU,
    device kernels. Started and stopped by hooks into the trainer being measured; `held` is the peak memory at the
    end of that step, before the profiler's own bookkeeping (the module docstring)."""

    def __init__(self, device: str):
        self.device = device
        self.prof = None
        self.aten_ops = self.kernels = self.held = 0
        self.step: int | None = None  # which step (0-based) was counted

    def start(self, step: int):
        from torch.profiler import ProfilerActivity, profile

        import torch

        self.step = step
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.prof = profile(activities=acts)
        self.prof.__enter__()

    def stop(self):
        if self.prof is None:
            return
        import torch

        if torch.accelerator.is_available():
            torch.accelerator.synchronize()
        self.held = _peak_memory(self.device)
        self.prof.__exit__(None, None, None)
        events = self.prof.events()
        self.aten_ops = sum(1 for e in events if e.name.startswith("aten::"))
        self.kernels = sum(1 for e in events if str(getattr(e, "device_type", "")).endswith("CUDA"))
        self.prof = None


# ------------------------------------------------------------------------------------------------ worker
def _peak_memory(device: str) -> int:
    from roctune.hardware import accel

    return accel.peak_memory_bytes(device)


def _train_config(w: Workload, output: str):
    from roctune.config import TrainConfig

    return TrainConfig(
        data=[w.data], output=output, model=w.model, max_steps=w.max_steps, batch_size=w.batch_size,
        grad_accum=w.grad_accum, max_length=w.max_length, lora_r=w.lora_r, lora_alpha=w.lora_alpha,
        lora_dropout=w.lora_dropout, target_modules=list(w.target_modules), lr=w.lr, seed=w.seed,
        device=w.device, dtype=w.dtype, attn=w.attn, packing=w.packing, overwrite=True,
        loss_on_supervised_only=w.loss_on_supervised_only, grad_checkpointing=w.grad_checkpointing,
        group_by_length=w.group_by_length, compile=w.compile, method=w.method, fused_kernels=w.fused_kernels,
        offload=w.offload)


def run_roctune(w: Workload) -> dict:
    from roctune import rundir
    from roctune.hardware import choose_device
    from roctune.recipes import train
    from roctune.training import loop

    counter, calls = OpCounter(choose_device(w.device).value), {"step": 0}
    accumulate, optimizer_step = loop._State.accumulate, loop.optimizer_step

    def counted_accumulate(self, step, say):
        if step == len(self.steps) - 1:
            counter.start(step)
        return accumulate(self, step, say)

    def counted_optimizer_step(*a, **k):
        out = optimizer_step(*a, **k)
        if calls["step"] == counter.step:
            counter.stop()
        calls["step"] += 1
        return out

    loop._State.accumulate, loop.optimizer_step = counted_accumulate, counted_optimizer_step
    with tempfile.TemporaryDirectory(prefix="roctune-bench-") as out:
        cfg = _train_config(w, out)
        summary = train(cfg, log=lambda s: print(s, file=sys.stderr), progress=False)
        rows = rundir.read_metrics(out)
        resolved = rundir.read_run(out)["resolved"]
    return {"losses": [r["loss"] for r in rows], "step_times": [r["step_time_s"] for r in rows],
            "step_tokens": [r["tokens"] for r in rows], "step_supervised": [r["supervised_tokens"] for r in rows],
            "aten_ops": counter.aten_ops, "kernels": counter.kernels, "profiled_step": counter.step,
            "held_peak_bytes": counter.held,
            "tokens": sum(r["tokens"] for r in rows), "supervised_tokens": sum(r["supervised_tokens"] for r in rows),
            "device": resolved["device"], "dtype": resolved["dtype"], "attn": resolved["attn"],
            "packed": resolved["packed"], "summary_seconds": summary["seconds"]}


def run_baseline(w: Workload) -> dict:
    """The standard recipe: transformers Trainer + PEFT get_peft_model, DataCollatorForSeq2Seq padding,
    labels with the prompt masked (the tutorial's bug fixed). It is fed the same examples in the same seeded
    shuffled order roctune starts from, batched in that order as the Trainer's sampler would; roctune then
    groups by length within that order (its own speed option). With --no-group-by-length both get identical
    micro-batches."""
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.utils.data import Dataset, SequentialSampler
    from transformers import (AutoModelForCausalLM, DataCollatorForSeq2Seq, Trainer, TrainerCallback,
                              TrainingArguments)

    from roctune.data.records import load_records
    from roctune.data.render import tokenize_records
    from roctune.hardware import choose_device, choose_dtype, torch_dtype
    from roctune.models import load_tokenizer, resolve_model
    from roctune.training.batching import plan_steps, supervised_count

    cfg = _train_config(w, "unused")
    base = resolve_model(w.model)
    device = choose_device(w.device).value
    dtype = choose_dtype(w.dtype, device).value
    tok = load_tokenizer(base)
    examples, _ = tokenize_records(tok, load_records(w.data), w.max_length)
    steps, _ = plan_steps([len(e.input_ids) for e in examples], dataclasses.replace(cfg, group_by_length=False))
    order = [i for step in steps for mb in step for i in mb]

    class Ordered(Dataset):
        def __len__(self):
            return len(order)

        def __getitem__(self, k):
            e = examples[order[k]]
            return {"input_ids": e.input_ids, "attention_mask": [1] * len(e.input_ids), "labels": e.labels}

    class InOrder(Trainer):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    timing = {"losses": [], "t0": None, "t1": None, "steps": [], "step_t0": 0.0}
    counter = OpCounter(device)

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            timing["t0"] = time.perf_counter()

        def on_step_begin(self, args, state, control, **k):
            if state.global_step == state.max_steps - 1:
                counter.start(state.global_step)
            timing["step_t0"] = time.perf_counter()

        def on_step_end(self, args, state, control, **k):
            timing["steps"].append(time.perf_counter() - timing["step_t0"])
            if state.global_step == state.max_steps:
                counter.stop()

        def on_train_end(self, *a, **k):
            timing["t1"] = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **k):
            if logs and "loss" in logs:
                timing["losses"].append(float(logs["loss"]))

    torch.manual_seed(w.seed)
    if METHODS[w.method].quantized:  # the QLoRA recipe: NF4 base, double quantization, then peft's k-bit preparation
        from peft import prepare_model_for_kbit_training
        from transformers import BitsAndBytesConfig

        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch_dtype(dtype))
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype(dtype), attn_implementation=w.attn,
                                                     quantization_config=quant, device_map={"": device})
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=w.grad_checkpointing)
    else:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype(dtype),
                                                     attn_implementation=w.attn).to(device)
    torch.manual_seed(w.seed)
    model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=w.lora_r, lora_alpha=w.lora_alpha,
                                             lora_dropout=w.lora_dropout, target_modules=list(w.target_modules)))
    with tempfile.TemporaryDirectory(prefix="baseline-bench-") as out:
        args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=w.batch_size, gradient_accumulation_steps=w.grad_accum,
            learning_rate=w.lr, max_steps=w.max_steps, lr_scheduler_type="linear", warmup_steps=0,
            weight_decay=0.0, max_grad_norm=1.0, logging_steps=1, save_strategy="no", report_to=[],
            bf16=dtype == "bf16", fp16=dtype == "fp16", use_cpu=device == "cpu", seed=w.seed,
            data_seed=w.seed, dataloader_drop_last=False, remove_unused_columns=False,
            gradient_checkpointing=w.grad_checkpointing, disable_tqdm=True,
        )
        trainer = InOrder(model=model, args=args, train_dataset=Ordered(),
                          data_collator=DataCollatorForSeq2Seq(tok, padding=True, label_pad_token_id=-100),
                          callbacks=[Clock()])
        trainer.train()
    seconds = timing["t1"] - timing["t0"]
    n_tok = sum(len(examples[i].input_ids) for i in order)
    n_sup = sum(sum(1 for x in examples[i].labels[1:] if x != -100) for i in order)
    per_step = [[i for mb in step for i in mb] for step in steps][:len(timing["steps"])]
    return {"losses": timing["losses"], "step_times": timing["steps"],
            "step_tokens": [sum(len(examples[i].input_ids) for i in s) for s in per_step],
            "step_supervised": [sum(supervised_count(examples[i].labels) for i in s) for s in per_step],
            "aten_ops": counter.aten_ops, "kernels": counter.kernels, "profiled_step": counter.step,
            "held_peak_bytes": counter.held, "tokens": n_tok, "supervised_tokens": n_sup, "device": device,
            "dtype": dtype, "attn": w.attn, "packed": False, "summary_seconds": seconds}


def measure_peak_flops(device: str, dtype: str, size: int = 2048, seconds: float = 1.5) -> float:
    """FLOP/s of a large square matmul in the training dtype on this device (the MFU denominator)."""
    import torch

    from roctune.hardware import accel, torch_dtype

    dev = accel.device_type(device)
    n = size if dev == "cpu" else 8192
    a = torch.randn(n, n, device=dev, dtype=torch_dtype(dtype))
    b = torch.randn(n, n, device=dev, dtype=torch_dtype(dtype))
    (a @ b).sum().item()
    iters, t0 = 0, time.perf_counter()
    while True:
        c = a @ b
        iters += 1
        accel.synchronize(device)
        if time.perf_counter() - t0 > seconds:
            break
    del c
    return 2 * n ** 3 * iters / (time.perf_counter() - t0)


def model_flops_per_token(model_dir: str, seq_len: float, lora_r: int, n_targets: int) -> float:
    """4·N (forward + input-gradient backward of frozen weights) + attention, per token."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model_dir)
    h, layers = c.hidden_size, c.num_hidden_layers
    heads = c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", heads) or heads
    hd = getattr(c, "head_dim", None) or h // heads
    attn_proj = h * heads * hd * 2 + h * kv * hd * 2
    mlp = 3 * h * c.intermediate_size
    n = layers * (attn_proj + mlp) + h * c.vocab_size
    attn_scores = layers * 2 * heads * hd * seq_len  # QK^T and AV per token (causal: half of full length)
    return 4 * n + 4 * attn_scores


def worker(kind: str, spec: str) -> None:
    from roctune.hardware import allocator

    w = Workload(**json.loads(spec))
    result = run_roctune(w) if kind == "roctune" else run_baseline(w)
    # the peak at the end of the last (profiled) step, before the profiler's bookkeeping; without one, now
    result["peak_memory_bytes"] = result.pop("held_peak_bytes") or _peak_memory(result["device"])
    result["huge_pages"] = allocator.huge_pages_on()
    print("BENCH_RESULT " + json.dumps(result))


# ------------------------------------------------------------------------------------------------ parent
def run_child(kind: str, w: Workload) -> dict:
    from roctune.hardware.allocator import users_environment

    cmd = [sys.executable, "-m", "roctune.bench", "--worker", kind, json.dumps(asdict(w))]
    # the baseline runs as its users run it: without the huge-page setting roctune made for itself
    proc = subprocess.run(cmd, capture_output=True, text=True, env=users_environment() if kind == "baseline" else None)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            return json.loads(line[len("BENCH_RESULT "):])
    tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
    from roctune.errors import RoctuneError

    raise RoctuneError(f"bench run '{kind}' failed (exit {proc.returncode}):\n{tail}", exit_code=1)


def summarize(name: str, r: dict, peak_flops: float, flops_per_token: float) -> dict:
    """Throughput over the timed steps (all but the first, which compiles, and the profiled one)."""
    untimed = (FIRST_STEP, r.get("profiled_step"))
    timed = [i for i in range(len(r["step_times"])) if i not in untimed] or list(range(len(r["step_times"])))
    seconds = sum(r["step_times"][i] for i in timed) or r["summary_seconds"]
    tps = sum(r["step_tokens"][i] for i in timed) / seconds
    return {"run": name, "attn": r["attn"], "packed": r["packed"], "tokens_per_s": tps,
            "supervised_tokens_per_s": sum(r["step_supervised"][i] for i in timed) / seconds,
            "s_per_step": seconds / max(1, len(timed)), "mfu": tps * flops_per_token / peak_flops,
            "first_step_s": r["step_times"][0] if r["step_times"] else None,
            "aten_ops_per_step": r["aten_ops"], "kernels_per_step": r["kernels"],
            "peak_memory_bytes": r["peak_memory_bytes"], "huge_pages": r.get("huge_pages", False),
            "final_loss": r["losses"][-1],
            "mean_loss": sum(r["losses"]) / len(r["losses"]), "losses": r["losses"], "tokens": r["tokens"]}


def main_bench(w: Workload, attns: list[str], baseline: bool, json_out: str | None, log=print,
               compiled: bool = False) -> dict:
    """The runs: roctune per attention kernel (eager; with `compiled`, also --compile on), then the baseline."""
    tmpdir = tempfile.mkdtemp(prefix="roctune-bench-data-")
    try:
        return _bench(w, attns, baseline, json_out, log, tmpdir, compiled)
    finally:  # the generated data set goes, also when a run fails
        import shutil

        shutil.rmtree(tmpdir, ignore_errors=True)


def _bench(w: Workload, attns: list[str], baseline: bool, json_out: str | None, log, tmpdir: str,
           compiled: bool = False) -> dict:
    from roctune.hardware import choose_device, choose_dtype
    from roctune.models import resolve_model

    if w.data is None:
        w.data = os.path.join(tmpdir, "bench.jsonl")
        make_dataset(w.data, w.max_steps * w.batch_size * w.grad_accum, seed=0)
    model_dir = resolve_model(w.model)
    device = choose_device(w.device).value
    dtype = choose_dtype(w.dtype, device).value
    peak = measure_peak_flops(device, dtype)
    log(f"device {device}, dtype {dtype}; measured peak {peak / 1e9:,.1f} GFLOP/s (matmul)")
    rows = []
    for attn in attns:
        w.attn = attn
        r = run_child("roctune", w)
        fpt = model_flops_per_token(model_dir, r["tokens"] / max(1, w.max_steps * w.batch_size * w.grad_accum) / 2,
                                    w.lora_r, len(w.target_modules))
        rows.append(summarize(f"roctune ({attn})", r, peak, fpt))
        log(f"  roctune/{attn}: {rows[-1]['tokens_per_s']:,.1f} tok/s")
        if compiled:
            r = run_child("roctune", dataclasses.replace(w, compile="on"))
            rows.append(summarize(f"roctune compiled ({attn})", r, peak, fpt))
            log(f"  roctune compiled/{attn}: {rows[-1]['tokens_per_s']:,.1f} tok/s "
                f"(first step {rows[-1]['first_step_s']:.1f} s)")
    if baseline:
        w.attn = attns[0]
        r = run_child("baseline", w)
        rows.append(summarize(f"transformers Trainer + PEFT ({w.attn})", r, peak, fpt))
        log(f"  baseline/{w.attn}: {rows[-1]['tokens_per_s']:,.1f} tok/s")
    result = {"workload": asdict(w), "device": device, "dtype": dtype, "peak_flops": peak, "runs": rows}
    if baseline:
        ours, base = rows[0], rows[-1]
        result["speedup_tokens_per_s"] = ours["tokens_per_s"] / base["tokens_per_s"]
        result["mean_loss_rel_diff"] = abs(ours["mean_loss"] - base["mean_loss"]) / base["mean_loss"]
        result["memory_ratio"] = ours["peak_memory_bytes"] / base["peak_memory_bytes"]
    if compiled:
        eager, comp = rows[0], rows[1]
        result["compiled_speedup"] = comp["tokens_per_s"] / eager["tokens_per_s"]
        result["compiled_max_loss_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(comp["losses"], eager["losses"]))
    if json_out:
        from roctune.rundir.atomic import atomic_write_text

        atomic_write_text(json_out, json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        print("usage: python -m roctune.bench --worker roctune|baseline SPEC_JSON (use `roctune bench`)", file=sys.stderr)
        sys.exit(2)
