"""Long sequences on one process: the checkpointed layers with their MLP in sequence tiles (and their inputs
offloaded) give the plain path's loss and LoRA gradients; the plan turns checkpointing on from LONG_SEQUENCE tokens
and says why; `estimate --max-length auto` answers the longest length whose estimate fits; the train, OOM, web UI and
command estimates are one function's."""
from __future__ import annotations

import copy
import json

import pytest

from roctune.memory import GiB
from roctune.memory import plan as memplan

LENGTH = 160  # tiles of 48 rows: four tiles, the last one shorter


def _tiny(dropout: float):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True)
    torch.manual_seed(0)
    base = LlamaForCausalLM(cfg)

    def build():
        torch.manual_seed(1)  # the same LoRA weights (random B too, so the gradients are not trivially zero)
        m = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout,
                                                           target_modules="all-linear", init_lora_weights=False))
        m.train()
        return m
    return build


def _step(model, ids, seed=5):
    import torch

    torch.manual_seed(seed)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.fixture
def small_tiles(monkeypatch):
    from roctune.training import activations

    monkeypatch.setattr(activations, "TILE_ELEMENTS", 48 * 128)  # 48 rows of the tiny MLP (128 wide)
    monkeypatch.setattr(activations, "MIN_TILE_ROWS", 8)
    assert activations.tile_rows(128) == 48


@pytest.mark.parametrize("offload", [False, True])
def test_tiled_checkpointed_layers_equal_the_plain_path(small_tiles, offload):
    import torch

    from roctune.families import family_of
    from roctune.training.activations import long_sequence_layers

    build = _tiny(0.0)
    ids = torch.randint(0, 256, (1, LENGTH), generator=torch.Generator().manual_seed(3))
    loss0, grads0 = _step(build(), ids)
    model = build()
    said = long_sequence_layers(model, offload, family_of("llama"))
    assert "2 MLPs run in sequence tiles" in said and ("2 with their inputs in host memory" in said) == offload
    loss1, grads1 = _step(model, ids)
    assert torch.allclose(loss0, loss1, rtol=1e-6, atol=1e-6)
    assert grads0.keys() == grads1.keys() and any("mlp" in k for k in grads0)
    for name, g in grads0.items():
        assert g.abs().max() > 0, name
        torch.testing.assert_close(grads1[name], g, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("masked", [False, True])
def test_tiles_redraw_the_forwards_dropout_masks(small_tiles, masked):
    """With LoRA dropout inside the MLP, backward's recomputed tiles draw the masks the forward drew: the gradients
    equal those of the same tiles run with an ordinary graph (the same draws in the same order). `masked`: roctune's
    own dropout (mask_lora_dropout), which the graph-free forward must draw as the recompute does."""
    import torch

    from roctune.families import family_of
    from roctune.training import activations

    def build():
        model = _tiny(0.3)()
        if masked:
            assert activations.mask_lora_dropout(model) == 14
        return model
    ids = torch.randint(0, 256, (1, LENGTH), generator=torch.Generator().manual_seed(3))
    rows = activations.tile_rows(128)
    reference = build()
    for mlp in (m for m in reference.modules() if type(m).__name__ == "LlamaMLP"):
        plain = mlp.forward
        mlp.forward = lambda x, f=plain: torch.cat([f(t) for t in x.reshape(-1, x.shape[-1]).split(rows)]).reshape(
            x.shape)
    loss0, grads0 = _step(reference, ids)
    tiled = build()
    assert activations.tile_mlps(tiled, family_of("llama").mlp_classes, 128) == 2
    loss1, grads1 = _step(tiled, ids)
    torch.testing.assert_close(loss1, loss0)
    for name, g in grads0.items():
        torch.testing.assert_close(grads1[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_offloaded_layers_draw_the_same_dropout_masks(small_tiles):
    """The reentrant checkpoint behind offloading runs its forward without a graph: with roctune's LoRA dropout the
    loss and gradients equal the non-reentrant path's (the same masks, drawn in the same order)."""
    import torch

    from roctune.families import family_of
    from roctune.training.activations import long_sequence_layers, mask_lora_dropout

    build = _tiny(0.3)
    ids = torch.randint(0, 256, (1, LENGTH), generator=torch.Generator().manual_seed(3))
    results = []
    for offload in (False, True):
        model = build()
        long_sequence_layers(model, offload, family_of("llama"))
        assert mask_lora_dropout(model) == 14
        results.append(_step(model, ids))
    (loss0, grads0), (loss1, grads1) = results
    torch.testing.assert_close(loss1, loss0)
    for name, g in grads0.items():
        torch.testing.assert_close(grads1[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_plan_checkpoints_long_sequences_and_says_why():
    short = memplan.choose_checkpointing(False, memplan.LONG_SEQUENCE - 1, "cpu")
    assert not short.on and "faster without" in short.reason and short.value == "off"
    long = memplan.choose_checkpointing(False, memplan.LONG_SEQUENCE, "cpu")
    assert long.on and not long.offload and f"{memplan.LONG_SEQUENCE:,} tokens" in long.reason
    assert memplan.choose_checkpointing(True, 128, "cpu").reason.startswith("asked for with --grad-checkpointing")
    gpu = memplan.choose_checkpointing(False, memplan.OFFLOAD_SEQUENCE, "cuda")
    assert gpu.on and gpu.offload and "host memory" in gpu.reason
    assert not memplan.choose_checkpointing(False, memplan.OFFLOAD_SEQUENCE, "cpu").offload  # a no-op on the CPU


def test_train_setup_carries_the_choice(default_model_dir):
    from roctune.config import TrainConfig
    from roctune.training.session import choose

    for length, on in ((512, False), (4096, True)):
        setup = choose(TrainConfig(data=["x.jsonl"], max_length=length, device="cpu"), default_model_dir)
        assert setup.checkpointing.on is on
        assert setup.reasons["checkpointing"] == setup.checkpointing.reason


def test_constants_shared_with_the_estimate_agree():
    import importlib

    from roctune.training import activations, losses

    est = importlib.import_module("roctune.memory.estimate")  # the module (the package exports the function)

    assert est.HEAD_CHUNK_ELEMENTS == losses.CHUNK_ELEMENTS and est.MLP_TILE_ELEMENTS == activations.TILE_ELEMENTS


def _cfg(**kw):
    from roctune.config import TrainConfig

    return TrainConfig(data=["x.jsonl"], batch_size=1, grad_accum=1, **kw)


def test_estimate_drops_where_checkpointing_starts_and_grows_slowly_after():
    cfg = _cfg()
    at = {L: memplan.estimate_run("SmolLM2-135M", cfg, device="cpu", max_length=L).total_bytes
          for L in (memplan.LONG_SEQUENCE - 64, memplan.LONG_SEQUENCE, 4096, 16384)}
    assert at[memplan.LONG_SEQUENCE] < at[memplan.LONG_SEQUENCE - 64]
    per_token = (at[16384] - at[4096]) / (16384 - 4096)
    assert 69 * 1024 < per_token < 150 * 1024  # layer inputs (30 x 576 x 4 bytes) plus one recomputed layer
    forced = memplan.estimate_run("SmolLM2-135M", _cfg(grad_checkpointing=True), device="cpu", max_length=512)
    assert forced.settings["grad_checkpointing"] and forced.settings["long_context"]


@pytest.mark.parametrize("device,memory", [("cpu", 4 * GiB), ("cuda", 24 * GiB)])
def test_longest_length_fits_and_the_next_step_does_not(device, memory):
    model = "SmolLM2-135M" if device == "cpu" else "Llama-3.1-8B"
    cfg = _cfg()
    best = memplan.longest_length(model, cfg, memory, device=device)
    assert best and best % 64 == 0 and best > memplan.LONG_SEQUENCE

    def total(L):
        return memplan.estimate_run(model, cfg, device=device, max_length=L).total_bytes

    assert total(best) <= memory < total(best + 64)


def test_cli_max_length_auto(capsys):
    from roctune.cli import main

    assert main(["estimate", "--model", "Llama-3.1-8B", "--max-length", "auto", "--vram", "24", "--batch-size", "1",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    best = out["max_length"]
    assert out["estimate"]["settings"]["max_length"] == best and out["estimate"]["total_bytes"] <= 24 * GiB
    assert main(["estimate", "--model", "Llama-3.1-8B", "--max-length", str(best + 64), "--vram", "24",
                 "--batch-size", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu"]["fits"] is False
    assert main(["estimate", "--max-length", "auto", "--no-detect"]) == 2
    assert "--max-length auto needs" in capsys.readouterr().err


def test_one_estimate_for_train_oom_and_web_ui(monkeypatch):
    """The OOM advice and the web UI show estimate_run's figure for the same settings (train's warning calls it
    too; see session.warn_memory)."""
    from types import SimpleNamespace

    from roctune.training import oom
    from roctune.webui import train as webui_train

    cfg = _cfg(max_length=4096, model="SmolLM2-135M", device="cpu")
    want = memplan.estimate_run("SmolLM2-135M", cfg, device="cpu", dtype="fp32", attn="sdpa")
    setup = SimpleNamespace(base_model="SmolLM2-135M", device="cpu", dtype="fp32", attn="sdpa", packed=False,
                            checkpointing=memplan.choose_checkpointing(False, 4096, "cpu"))
    assert f"{want.total_bytes / GiB:.1f} GiB" in oom._estimate_text(cfg, setup, 1)
    monkeypatch.setattr("roctune.models.resolve_model", lambda name: name)
    assert f"{want.total_bytes / GiB:.2f}" in webui_train.memory_html(cfg)


def test_cpu_sdpa_runs_the_flash_kernel():
    """What SDPA really runs on the CPU, for the causal batch of one long example and for a padded batch: torch's
    flash kernel for the CPU (keeps its output and log-sum-exp, O(length) memory), not the math path's
    [heads x length x length] weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    model = LlamaForCausalLM(cfg).train()
    model.config._attn_implementation = "sdpa"
    for rows, padded in ((1, False), (2, True)):
        mask = torch.ones(rows, 256, dtype=torch.long)
        mask[-1, 200:] = 0 if padded else 1
        with torch.profiler.profile() as prof:
            model(input_ids=torch.randint(0, 256, (rows, 256)), attention_mask=mask).logits.sum().backward()
        ops = {e.name for e in prof.events()}
        assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops, (rows, padded)
        assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in ops, (rows, padded)
        assert not any("attention_math" in op for op in ops), (rows, padded)


_FREED = """
import ctypes, sys
from roctune.hardware.allocator import map_large_allocations
if sys.argv[1] == "1":
    assert map_large_allocations()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
n = 16 << 20
for _ in range(2):  # the second block comes from the heap once glibc has raised its threshold to 16 MiB
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    libc.free(ctypes.c_void_p(p))
print(int(open("/proc/self/statm").read().split()[1]) * 4096)
"""


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc's mallopt")
def test_mapped_large_allocations_leave_the_process_when_freed():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rss = [int(subprocess.run([sys.executable, "-c", _FREED, flag], capture_output=True, text=True, check=True,
                              env=dict(os.environ, PYTHONPATH=root)).stdout) for flag in ("0", "1")]
    assert rss[0] - rss[1] > 12 << 20  # without it the freed 16 MiB stay resident
