"""Regional compile (roctune.training.compiled): the compiled decoder layers give the eager path's loss and LoRA
gradients on the model roctune builds (its shortcuts on), one compile serves every layer and a new length does not
recompile; --compile auto's choice and its reason; the step's sums stay on the device until the log row.

Inductor's C++ compile takes tens of seconds on the 2-core test machine, so the suite compiles two representative
families (llama: plain GQA with the gated-MLP shortcut; gemma2: soft-capping and alternating sliding/global
layers) with inductor, once each; `python tests/test_compile.py` runs every family of the table (minutes)."""
from __future__ import annotations

import sys

import pytest
import torch

import family_models
from conftest import read_metrics, run_train, write_jsonl
from test_families import CHATS, _batch, _loss_grads, _randomize_lora_b, _roctune_model, _worst

SUITE_FAMILIES = ("llama", "gemma2")


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _compare_family(model_dir: str, data_file: str, tmp_path, backend: str = "inductor") -> dict:
    """Eager vs compiled on the same model (roctune's build, lora_B random, dropout 0), at two batch lengths."""
    from roctune.training import compiled
    from roctune.training.losses import token_loss_sum

    lines: list[str] = []
    _cfg, _setup, model, plan = _roctune_model(model_dir, data_file, 0.0, tmp_path, lines)
    _randomize_lora_b(model)
    model.train()
    full = _batch(model_dir, data_file)
    cut = full.input_ids.shape[1] - 5
    shorter = type(full)(**{k: (v[:, :cut] if isinstance(v, torch.Tensor) and v.dim() == 2 else v)
                            for k, v in vars(full).items()})
    out = {"layers": len(compiled.decoder_layers(model))}
    for name, batch in (("full", full), ("short", shorter)):
        n = int((batch.labels[:, 1:] != -100).sum())
        fn = lambda m, b=batch, n=n: token_loss_sum(m, b, plan.head) / n  # noqa: E731
        compiled.uncompile_layers(model)
        eager = _loss_grads(model, fn)
        compiled.compile_layers(model, backend=backend)
        before = _graphs()
        comp = _loss_grads(model, fn)
        out[name] = {"loss_diff": abs(eager[0] - comp[0]), "grad_diff": _worst(comp[1], eager[1]),
                     "new_graphs": _graphs() - before}
    compiled.uncompile_layers(model)
    return out


@pytest.fixture(scope="module")
def sft_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("compile-data") / "sft.jsonl", [{"messages": c} for c in CHATS])


@pytest.mark.slow
@pytest.mark.parametrize("family", SUITE_FAMILIES)
def test_compiled_layers_equal_eager_and_do_not_recompile_per_length(family, family_dir, sft_file, tmp_path):
    torch._dynamo.reset()
    r = _compare_family(family_dir(family), sft_file, tmp_path)
    for name in ("full", "short"):
        assert r[name]["loss_diff"] < 1e-5, r
        assert r[name]["grad_diff"] < 1e-4, r
    # the first length compiles (a graph per kind of layer, forward only once for every layer); the second reuses it
    assert r["full"]["new_graphs"] > 0, r
    assert r["short"]["new_graphs"] == 0, r


@pytest.mark.parametrize("shortcuts", ["none", "slim", "long"])
def test_one_compile_serves_every_layer_of_a_deep_model(shortcuts):
    """12 layers (over dynamo's recompile limit of 8, which plain per-layer `layer.compile()` hits): at most two
    graphs (layer 0's input does not require grad, the others' do), and the second length adds none, with
    roctune's shortcuts on the model as training puts them (`slim`: LoRA dropout in lora_A and the recomputed MLP
    activation; `long`: checkpointed layers and tiled MLPs). A shortcut set as a forward on each instance made one
    graph per layer and ran the layers past the 8th eager. Compiled with aot_eager: the graph capture and its
    guards are what is tested here, not inductor's kernels."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from roctune.families import family_of
    from roctune.training import activations, compiled

    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()  # dynamo's counters outlive reset(): the earlier tests' graphs are not this model's
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=12,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]))
    model.train()
    if shortcuts == "slim":
        assert "12 MLPs recompute" in activations.slim(model, ("lora_dropout", "gated_mlp"), family_of("llama"))
    elif shortcuts == "long":
        assert "12 MLPs run in sequence tiles" in activations.long_sequence_layers(model, False, family_of("llama"))
    if shortcuts == "long":  # torch's checkpoint disables dynamo inside: apply leaves such layers eager, and says so
        assert "compile: off (checkpointed layers" in compiled.apply(model, "on", "cpu", 100)
        assert all("forward" not in layer.__dict__ for layer in compiled.decoder_layers(model))
        return
    assert compiled.compile_layers(model, backend="aot_eager") == 12
    counts = []
    for length in (9, 23):
        x = torch.randint(0, 128, (2, length))
        model(input_ids=x, labels=x, use_cache=False).loss.backward()
        counts.append(_graphs())
    assert 1 <= counts[0] <= 2 and counts[1] == counts[0], counts
    assert not any("recompile limit" in k for k in counters["unimplemented"]), dict(counters["unimplemented"])
    compiled.uncompile_layers(model)
    assert all("forward" not in layer.__dict__ for layer in compiled.decoder_layers(model))


def test_auto_compiles_long_enough_runs_where_inductor_can_build(monkeypatch):
    from roctune.training import compiled
    from roctune.training.compiled import AUTO_MIN_STEPS, choose_compile

    assert choose_compile("on", "cpu", 1).value and not choose_compile("off", "cuda", 10**6).value
    for device in ("cpu", "cuda"):
        short = choose_compile("auto", device, AUTO_MIN_STEPS - 1)
        assert not short.value and "too short" in short.reason
        assert choose_compile("auto", device, AUTO_MIN_STEPS).value
        assert not choose_compile("auto", device, 10**6, "grpo").value  # it samples token by token (roctune.stages)
        assert all(choose_compile("auto", device, 10**6, s).value for s in ("sft", "pt", "dpo", "kto"))
        assert not choose_compile("auto", device, 10**6, "sft", sequence_parallel=2).value
    assert "CPU and 200 steps" in choose_compile("auto", "cpu", AUTO_MIN_STEPS).reason
    monkeypatch.setattr(compiled, "cpp_compiler", lambda: None)  # inductor cannot build CPU kernels: eager, and why
    cpu = choose_compile("auto", "cpu", 10**6)
    assert not cpu.value and "without a C++ compiler" in cpu.reason and "g++" in cpu.reason
    assert choose_compile("auto", "cuda", 10**6).value  # GPU kernels are Triton's, not C++


def test_step_sums_are_read_from_the_device_once():
    from roctune.training.loop import host_numbers

    out = host_numbers({"loss": torch.tensor(2.5), "grad_norm": torch.tensor([0.5]), "n": 3})
    assert out == {"loss": 2.5, "grad_norm": 0.5, "n": 3.0}


@pytest.mark.slow
def test_train_with_compile_on_logs_the_choice_and_eager_losses(family_dir, sft_file, tmp_path):
    """`roctune train --compile on` through the whole loop (shortcuts, optimizer, log rows): the same losses as
    --compile off over 3 steps, and the choice printed with its reason."""
    from roctune.config import TrainConfig

    losses = {}
    for setting in ("off", "on"):
        out = tmp_path / setting
        cfg = TrainConfig(data=[sft_file], output=str(out), model=family_dir("llama"), max_steps=3, batch_size=2,
                          grad_accum=1, max_length=256, lora_r=4, lora_alpha=8, lora_dropout=0.0, lr=1e-3,
                          device="cpu", seed=1, compile=setting).validate()
        _summary, lines = run_train(cfg)
        assert any(line.startswith(f"compile: {setting} (--compile {setting})") for line in lines), lines
        losses[setting] = [r["loss"] for r in read_metrics(out) if "loss" in r]
    assert len(losses["on"]) == 3
    assert losses["on"] == pytest.approx(losses["off"], rel=1e-5, abs=1e-6)


def test_fused_kernels_are_opt_in_per_family_and_off_on_the_cpu_with_the_reason():
    from roctune.families import FAMILIES, FUSED_KERNELS
    from roctune.training.fused import candidates, choose_fused, triton_problem

    for fam in FAMILIES:
        assert set(fam.fused_kernels) <= set(FUSED_KERNELS), fam.name
        assert not ({"swiglu", "geglu"} <= set(fam.fused_kernels)), fam.name  # one gated activation
    assert triton_problem("cpu") == "CPU: Triton kernels run on GPUs only"
    llama = choose_fused("auto", "cpu", {"model_type": "llama"})
    assert llama.kernels == () and "CPU" in llama.reason
    assert "opts in to no fused kernel" in choose_fused("auto", "cuda", {"model_type": "granite"}).reason
    assert choose_fused("off", "cuda", {"model_type": "llama"}).reason == "--fused-kernels off"
    assert candidates("off", "cuda", {"model_type": "llama"}).kernels == ()


def _simulated_gpu(monkeypatch, tmp_path, card: dict, results: dict):
    """A GPU as fused.py sees it: Triton present, the card's name, and the self-test's result per (card, dtype)."""
    from roctune.training import fused

    monkeypatch.setenv("ROCTUNE_HOME", str(tmp_path))
    monkeypatch.setattr(fused, "triton_problem", lambda device: None)
    monkeypatch.setattr(fused, "card_name", lambda: card["name"])
    calls = []

    def check(config, device, dtype, kernels):
        calls.append((card["name"], dtype, config.model_type, kernels))
        ok = results[(card["name"], dtype)]
        return ok, "relative error vs float64 CPU: loss 1.0e-03" + ("" if ok else " > 3e-02")

    monkeypatch.setattr(fused, "check_kernels", check)
    return calls


def test_fused_kernels_are_on_by_default_where_the_numeric_selftest_passes_on_that_card_and_dtype(monkeypatch,
                                                                                                  tmp_path):
    from transformers import LlamaConfig

    from roctune.training import fused

    card = {"name": "AMD Instinct MI300X (gfx942)"}
    calls = _simulated_gpu(monkeypatch, tmp_path, card, {("AMD Instinct MI300X (gfx942)", "bf16"): True,
                                                         ("AMD Instinct MI300X (gfx942)", "fp16"): False,
                                                         ("NVIDIA GeForce RTX 4090", "bf16"): True})
    llama = LlamaConfig()
    on = fused.choose_fused("auto", "cuda", llama, "bf16")
    assert on.kernels == ("rms_norm", "rope", "swiglu")
    assert on.reason == "llama family; numeric self-test passed on AMD Instinct MI300X (gfx942) bf16"
    assert len(calls) == 1 and calls[0][1:3] == ("bf16", "llama")
    assert fused.choose_fused("auto", "cuda", llama, "bf16").kernels == on.kernels
    assert len(calls) == 1  # the verdict is kept (ROCTUNE_HOME), not measured again
    bad = fused.choose_fused("auto", "cuda", llama, "fp16")
    assert bad.kernels == () and "failed on AMD Instinct MI300X (gfx942) fp16" in bad.reason
    assert "> 3e-02" in bad.reason and "doctor --selftest" in bad.reason and len(calls) == 2
    card["name"] = "NVIDIA GeForce RTX 4090"  # another card: its own self-test
    assert fused.choose_fused("auto", "cuda", llama, "bf16").kernels == on.kernels and len(calls) == 3
    (tmp_path / fused.VERDICTS_FILE).write_text("[not verdicts")  # a damaged file is measured again, not trusted
    assert fused.choose_fused("auto", "cuda", llama, "bf16").kernels == on.kernels and len(calls) == 4
    assert fused.choose_fused("off", "cuda", llama, "bf16").kernels == () and len(calls) == 4


def test_fused_kernel_check_trains_a_tiny_model_of_the_family_and_puts_its_module_back(monkeypatch):
    """The check itself on the CPU (no Triton here): the family's 2-layer model against float64 passes with
    correct kernels, fails with a wrong one, and the transformers module a kernel patched is restored."""
    import transformers.models.qwen2.modeling_qwen2 as qwen2
    from transformers import Qwen2Config

    from roctune.training import fused

    config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2)
    monkeypatch.setattr(fused, "apply_fused", lambda model, kernels: None)
    ok, text = fused.check_kernels(config, "cpu", "fp32", ("rms_norm",))
    assert ok, text
    real = qwen2.apply_rotary_pos_emb

    def wrong_kernels(model, kernels):  # a RoPE kernel that rotates by the wrong angle, patched module-wide
        qwen2.apply_rotary_pos_emb = lambda q, k, cos, sin, *a, **kw: real(q, k, cos * 0.9, sin, *a, **kw)
        for layer in model.model.layers:  # transformers 5 binds the function on the attention module as well
            if hasattr(layer.self_attn, "rotary_fn"):
                layer.self_attn.rotary_fn = qwen2.apply_rotary_pos_emb

    monkeypatch.setattr(fused, "apply_fused", wrong_kernels)
    ok, text = fused.check_kernels(config, "cpu", "fp32", ("rope",))
    assert not ok and "relative error" in text
    assert qwen2.apply_rotary_pos_emb is real


def test_fused_kernels_are_switched_on_where_triton_runs(monkeypatch, tmp_path):
    """The GPU decision without a GPU: Triton and liger-kernel reported present and the self-test passing, the
    family's switches are chosen and handed to Liger with every other switch off (the kernels themselves: doctor
    --selftest on a GPU)."""
    import types

    from roctune.training import fused

    _simulated_gpu(monkeypatch, tmp_path, {"name": "NVIDIA H200"}, {("NVIDIA H200", "bf16"): True})
    from transformers import Gemma2Config, LlamaConfig

    choice = fused.choose_fused("auto", "cuda", Gemma2Config())
    assert choice.kernels == ("rms_norm", "rope", "geglu")
    seen = {}
    module = types.ModuleType("liger_kernel.transformers")
    module._apply_liger_kernel_to_instance = lambda model, **kw: seen.update(model=model, **kw)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", module)
    model = types.SimpleNamespace(config=LlamaConfig())
    line = fused.apply(model, "auto", "cuda", "bf16")
    assert line.startswith("fused kernels: rms_norm, rope, swiglu (Liger-Kernel; llama family; numeric self-test "
                           "passed on NVIDIA H200 bf16")
    assert seen == {"model": model, "rope": True, "rms_norm": True, "swiglu": True, "geglu": False,
                    "cross_entropy": False, "fused_linear_cross_entropy": False}


def test_selftest_reports_why_fused_kernels_are_not_checked_on_the_cpu():
    from roctune.doctor import selftest as st

    cfg = st.tiny_config()
    found = st.check_fused_and_compiled(cfg, None, None, "cpu", "fp32", "sdpa")
    assert [(f.id, f.level) for f in found] == [("selftest.fused", "ok")]
    assert "CPU: Triton kernels run on GPUs only" in found[0].message


@pytest.mark.parametrize("head_kw", [{}, {"divisor": 4.0}, {"softcap": 30.0}])
def test_compiled_output_layer_chunks_equal_eager_and_stay_on_their_model(head_kw):
    """--compile on compiles the output layer's chunks too (losses.compile_head): the same log-probabilities and
    hidden-state gradients as the eager chunks (Granite's divisor and Gemma 2's soft cap included), over several
    chunks; the compiled form is kept on its model, and uncompiling removes it."""
    from roctune.training import compiled, losses

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(700, 16, generator=gen)
    weight, targets = torch.randn(4096 * 3, 16, generator=gen) * 0.3, torch.randint(0, 4096 * 3, (700,), generator=gen)
    head = losses.Head(**head_kw)
    model = torch.nn.Linear(2, 2)
    losses.compile_head(model, backend="aot_eager")
    chunk = getattr(model, losses.CHUNK_ATTR)
    runs = {}
    for name, fn in (("eager", None), ("compiled", chunk)):
        h = hidden.clone().requires_grad_(True)
        logp = losses.token_logprobs(h, weight, targets, head, fn)
        (logp * torch.linspace(0.5, 1.5, 700)).sum().backward()
        runs[name] = (logp.detach(), h.grad)
    assert 700 > losses.CHUNK_ELEMENTS // weight.shape[0]  # several chunks
    assert torch.allclose(runs["compiled"][0], runs["eager"][0], rtol=1e-5, atol=1e-5)
    assert torch.allclose(runs["compiled"][1], runs["eager"][1], rtol=1e-5, atol=1e-6)
    compiled.uncompile_layers(model)
    assert not hasattr(model, losses.CHUNK_ATTR)


if __name__ == "__main__":  # every family of the table (minutes): python tests/test_compile.py [BACKEND]
    import os
    import pathlib
    import tempfile

    from roctune.models import resolve_model

    backend = sys.argv[1] if len(sys.argv) > 1 else "inductor"
    base = resolve_model(None)
    with tempfile.TemporaryDirectory() as tmp:
        data = write_jsonl(f"{tmp}/sft.jsonl", [{"messages": c} for c in CHATS])
        bad = 0
        for fam in family_models.CONFIGS:
            torch._dynamo.reset()
            os.makedirs(f"{tmp}/{fam}")
            r = _compare_family(family_models.build(fam, f"{tmp}/{fam}", base), data,
                                pathlib.Path(tmp) / f"{fam}-run", backend)
            ok = all(r[n]["loss_diff"] < 1e-5 and r[n]["grad_diff"] < 1e-4 for n in ("full", "short"))
            ok = ok and r["short"]["new_graphs"] == 0
            bad += not ok
            print(f"{fam:10s} {backend} {'ok ' if ok else 'BAD'} {r}", flush=True)
    sys.exit(1 if bad else 0)

