"""The measuring pieces of scripts/gpu_bench.py, each run in its own process (`python scripts/gpu_bench_work.py KIND
JSON_ARGS`) so a step's peak memory is its own, a timeout kills only it, and the GPU is empty for the next. Each
prints one line `RESULT <json>` at the end. Everything goes through torch.cuda, which is HIP on ROCm: the same code
on AMD and NVIDIA cards. `device` "cpu" (scripts/gpu_bench.py --smoke) runs the same pieces on tiny shapes.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Qwen2.5's shapes (config.json of Qwen/Qwen2.5-0.5B and -7B), random weights; "tiny" for the CPU smoke run
SHAPES = {
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
    "tiny": dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
}
COMMON = dict(max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6, use_cache=False)
GiB = 2 ** 30


def tokenizer_dir() -> str:
    """$TOKENIZER (a tokenizer folder: a GPU machine without the bundled model's package), else the bundled one."""
    from roctune.models import default_model_dir

    return os.environ.get("TOKENIZER") or default_model_dir()


def card(a: dict) -> dict:
    """The device: name, memory, versions, and the measured bf16 matmul peak (MFU's denominator)."""
    import torch

    from roctune.bench import measure_peak_flops

    out = {"torch": torch.__version__, "hip": getattr(torch.version, "hip", None), "cuda": torch.version.cuda}
    if a["device"] == "cuda":
        p = torch.cuda.get_device_properties(0)
        out.update(name=p.name, arch=getattr(p, "gcnArchName", ""), total_bytes=p.total_memory)
    else:
        out.update(name="CPU", arch="", total_bytes=0)
    out["peak_flops"] = measure_peak_flops(a["device"], a["dtype"])
    for pkg in ("transformers", "peft", "bitsandbytes", "liger_kernel", "triton", "flash_attn"):
        try:
            out[pkg] = __import__(pkg).__version__
        except Exception:  # noqa: BLE001 - absent or broken: the table says so
            out[pkg] = None
    return out


def build(a: dict) -> dict:
    """A model folder of shape `a["shape"]` with random bf16 weights, initialised on the device (a 7B in seconds),
    and the bundled tokenizer. An existing folder of that shape is kept."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    folder, shape = a["folder"], a["shape"]
    stamp = os.path.join(folder, "gpu_bench_shape.txt")
    if os.path.isfile(stamp) and open(stamp).read() == shape:
        return {"folder": folder, "kept": True}
    cfg = Qwen2Config(**SHAPES[shape], **COMMON)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(a["device"]):
        model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(folder, max_shard_size="4GB")
    AutoTokenizer.from_pretrained(tokenizer_dir()).save_pretrained(folder)
    with open(stamp, "w") as f:
        f.write(shape)
    return {"folder": folder, "parameters": sum(p.numel() for p in model.parameters()), "kept": False}


def _text(rng: random.Random, words: int) -> str:
    from roctune.bench import WORDS

    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def data(a: dict) -> dict:
    """The alpaca-style throughput set (roctune.bench.make_dataset) and its longest example in tokens."""
    from roctune.bench import make_dataset
    from roctune.data.records import load_records
    from roctune.data.render import tokenize_records
    from roctune.models import load_tokenizer

    make_dataset(a["path"], a["examples"], seed=0)
    items, _ = tokenize_records(load_tokenizer(tokenizer_dir()), load_records(a["path"]), a["max_length"])
    return {"path": a["path"], "examples": len(items), "longest": max(len(e.input_ids) for e in items)}


def long_examples(path: str, tokens: int, n: int) -> None:
    """`n` conversations whose answers alone are longer than `tokens` (training cuts them at --max-length)."""
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            f.write(json.dumps({"messages": [{"role": "user", "content": _text(rng, 20)},
                                             {"role": "assistant", "content": _text(rng, tokens)}]}) + "\n")


def _cap(a: dict) -> None:
    """Hold this process to `cap_gib` of the card's memory (the 24 GiB card on a bigger one)."""
    if a.get("cap_gib") and a["device"] == "cuda":
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, a["cap_gib"] * GiB / total))


def fixed(a: dict) -> dict:
    """`roctune train` on one example of exactly `length` tokens, `steps` steps (batch 1), under the memory cap:
    whether it trains, the peak, tokens/s after the first step, and roctune's estimate for the same settings."""
    from roctune import rundir
    from roctune.config import TrainConfig
    from roctune.hardware import accel
    from roctune.memory.plan import estimate_run
    from roctune.recipes import train

    _cap(a)
    work = a["work"]
    os.makedirs(work, exist_ok=True)
    data_path = os.path.join(work, f"long-{a['length']}.jsonl")
    long_examples(data_path, a["length"], a["steps"])
    cfg = TrainConfig(data=[data_path], output=os.path.join(work, "run"), model=a["model"],
                      method=a["method"], max_steps=a["steps"], batch_size=1, grad_accum=1, max_length=a["length"],
                      device=a["device"], dtype=a["dtype"], attn="sdpa", overwrite=True, offload=a["offload"],
                      group_by_length=False, save_steps=0, data_cache=False, compile="off")
    lines: list[str] = []
    t0 = time.perf_counter()
    try:
        train(cfg, log=lambda s: (lines.append(s), print(s, file=sys.stderr)), progress=False)
    except Exception as e:  # noqa: BLE001 - out of memory is a result here, not a crash
        return {"trained": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                "peak_bytes": accel.peak_memory_bytes(a["device"]), "lines": lines[-8:]}
    rows = [r for r in rundir.read_metrics(cfg.output) if "tokens" in r]
    timed = rows[1:] or rows
    est = estimate_run(a["model"], cfg, device=a["device"], dtype=a["dtype"], attn="sdpa")
    return {"trained": True, "seconds": time.perf_counter() - t0, "tokens": [r["tokens"] for r in rows],
            "step_times": [r["step_time_s"] for r in rows],
            "tokens_per_s": sum(r["tokens"] for r in timed) / sum(r["step_time_s"] for r in timed),
            "loss": rows[-1]["loss"], "peak_bytes": accel.peak_memory_bytes(a["device"]),
            "estimate_peak_tensor_bytes": est.peak_tensor_bytes, "estimate_total_bytes": est.total_bytes,
            "estimate_host_bytes": est.host_bytes,
            "plan": [x for x in lines if x.startswith(("checkpointing:", "offload:", "fused kernels:"))]}


def hf_longest(a: dict) -> dict:
    """transformers + PEFT as their docs set up long-sequence QLoRA (4-bit NF4 base, prepare_model_for_kbit_training
    with gradient checkpointing, SDPA, LoRA on q/k/v/o): one forward and backward per length of `ladder`, shortest
    first, under the memory cap, until one runs out of memory. The longest that trained is the result."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    _cap(a)
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(a["model"], dtype=torch.bfloat16, attn_implementation="sdpa",
                                                 quantization_config=quant, device_map={"": a["device"]})
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
                                            gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                  "o_proj"], task_type="CAUSAL_LM"))
    model.train()
    from roctune.hardware import accel

    tried, dev = [], a["device"]
    for length in a["ladder"]:
        if dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        ids = torch.randint(0, 49152, (1, length), device=dev)
        t0 = time.perf_counter()
        try:
            with torch.autocast(dev, torch.bfloat16):
                model(input_ids=ids, labels=ids).loss.backward()
            accel.synchronize(dev)
        except torch.OutOfMemoryError:
            tried.append({"length": length, "trained": False})
            break
        finally:
            model.zero_grad(set_to_none=True)
        tried.append({"length": length, "trained": True, "seconds": time.perf_counter() - t0,
                      "peak_bytes": accel.peak_memory_bytes(dev)})
    ok = [t["length"] for t in tried if t["trained"]]
    return {"longest": max(ok) if ok else None, "tried": tried}


WORKERS = {"card": card, "build": build, "data": data, "fixed": fixed, "hf-longest": hf_longest}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in WORKERS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(WORKERS)} JSON_ARGS (run by scripts/gpu_bench.py)")
    result = WORKERS[sys.argv[1]](json.loads(sys.argv[2]))
    print("RESULT " + json.dumps(result), flush=True)
