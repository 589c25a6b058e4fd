"""Overlapped offload of checkpointed layer inputs (roctune.training.offload), on the CPU: the hooks' order (each
layer's input packed in forward; in backward the layer before is prefetched as soon as a layer's input comes back,
before that layer is recomputed), the same loss and LoRA gradients as the checkpointed layers without offload, and
the memory plan's host-memory line. The copies themselves (side stream, pinned memory) run on a GPU:
scripts/gpu_bench.py's offload step."""
from __future__ import annotations

import pytest
import torch

LAYERS = 4


def _model(offload: bool, trace=None):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from roctune.families import family_of
    from roctune.training import activations, offload as offloading

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: the LoRA gradients of A would all be zero
            torch.nn.init.normal_(p, std=0.05)
    model.train()
    sched = offloading.Scheduler(offloading.CopyMover(), min_bytes=0, trace=trace) if offload else None
    line = activations.long_sequence_layers(model, offload, family_of("llama"), scheduler=sched)
    return model, line


def _loss_and_grads(model, seed: int = 3):
    torch.manual_seed(seed)  # the same dropout masks in both models
    x = torch.randint(0, 128, (2, 21), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=x, labels=x, use_cache=False).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def test_offloaded_layers_give_the_loss_and_gradients_of_plain_checkpointing():
    plain, _ = _model(False)
    trace: list = []
    off, line = _model(True, trace)
    assert f"{LAYERS} with their inputs in host memory" in line
    loss_a, grads_a = _loss_and_grads(plain)
    loss_b, grads_b = _loss_and_grads(off)
    assert loss_b == pytest.approx(loss_a, rel=1e-6)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == 2 * 2 * LAYERS
    for n in grads_a:
        assert torch.allclose(grads_a[n], grads_b[n], rtol=1e-5, atol=1e-7), n
        assert grads_a[n].abs().sum() > 0, n
    assert sum(1 for kind, _ in trace if kind == "pack") == LAYERS  # one input per layer went out
    # a second step starts its own groups: the same order again, no stale group prefetched
    trace.clear()
    _loss_and_grads(off)
    assert [e for e in trace if e[0] == "pack"] == [("pack", i) for i in range(LAYERS)]


def test_backward_prefetches_the_layer_before_while_the_layer_is_recomputed():
    trace: list = []
    model, _ = _model(True, trace)
    _loss_and_grads(model)
    forward = [e for e in trace if e[0] in ("pack", "compute")]
    # torch's reentrant checkpoint runs the layer, then saves its input: each layer's copy out starts as the next
    # layer starts computing
    assert forward == [e for i in range(LAYERS) for e in (("compute", i), ("pack", i))], trace
    backward = trace[len(forward):]
    # backward walks the layers last to first; when layer i's input comes back, layer i-1's copy is started
    # before layer i is recomputed, so it travels while layer i computes (double buffer: at most two fetched)
    expected = []
    for i in reversed(range(LAYERS)):
        expected += [("unpack", i)] + ([("prefetch", i - 1)] if i else []) + [("recompute", i)]
    assert backward == expected, backward


def test_small_tensors_and_tensors_outside_layers_stay_where_they_are():
    from roctune.training.offload import CopyMover, Scheduler

    sched = Scheduler(CopyMover(), min_bytes=1 << 20, trace=[])
    small = torch.ones(4)
    assert sched.unpack(sched.pack(small)) is small  # outside a layer group
    sched.current = sched.open_group()
    assert sched.unpack(sched.pack(small)) is small  # below min_bytes
    big = torch.ones(1 << 19)  # 2 MiB of fp32
    handle = sched.pack(big)
    back = sched.unpack(handle)
    assert back is not big and torch.equal(back, big)  # a copy came back
    assert torch.equal(sched.unpack(handle), big)  # unpacked again (a retained graph): copied in again
    assert [k for k, _ in sched.trace] == ["pack", "unpack", "unpack"]


def test_memory_plan_counts_host_memory_when_offloading():
    from types import SimpleNamespace

    from roctune.memory.plan import OFFLOAD_SEQUENCE, choose_checkpointing, estimate_run

    cfg = SimpleNamespace(method="qlora", batch_size=1, max_length=OFFLOAD_SEQUENCE * 2, lora_r=16, lora_dropout=0.0,
                          target_modules=["all-linear"], freeze_trainable_layers=2, dtype="bf16", attn="sdpa",
                          grad_checkpointing=False, grad_accum=1, optimizer="adamw", loss_on_supervised_only=True,
                          offload="auto")
    gpu = estimate_run("Qwen2.5-7B", cfg, device="cuda")
    assert gpu.settings["offload"]
    arch_layers, hidden = 28, 3584  # Qwen2.5-7B: every layer's bf16 input waits in host memory
    assert gpu.host_bytes == arch_layers * OFFLOAD_SEQUENCE * 2 * hidden * 2
    assert any("offloaded" in n and "host memory" in n for n in gpu.notes), gpu.notes
    off = estimate_run("Qwen2.5-7B", SimpleNamespace(**{**vars(cfg), "offload": "off"}), device="cuda")
    assert off.host_bytes == 0 and off.total_bytes > gpu.total_bytes
    assert estimate_run("Qwen2.5-7B", cfg, device="cpu").host_bytes == 0  # the CPU has no second memory
    plan = choose_checkpointing(False, OFFLOAD_SEQUENCE, "cuda")
    assert plan.offload and "host memory" in plan.reason
    assert not choose_checkpointing(False, OFFLOAD_SEQUENCE, "cuda", "off").offload
    forced = choose_checkpointing(False, 512, "cuda", "on")
    assert forced.on and forced.offload and "--offload on" in forced.reason
