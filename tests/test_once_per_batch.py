"""Per-batch work done once per batch (roctune.training.batching): a packed batch's cumulative lengths reach every
attention layer as transformers' FlashAttentionKwargs, so the flash-attention path stops deriving them from
position_ids in each layer; and compiled layers trace one graph for all layers (no requires_grad recompile).

flash-attn does not run on the CPU: transformers' own flash-attention path (`_flash_attention_forward`) runs here
with its kernels replaced by SDPA per packed example (`_reference_kernels`), which is enough to count what the
path computes per layer and to compare the numbers."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

LAYERS = 3


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None,
            causal=False):
    """flash_attn_varlen_func's contract, by SDPA over each example of the packed row (GQA: k/v repeated)."""
    out, rep = torch.empty_like(q), q.shape[1] // k.shape[1]
    bounds = cu_seqlens_q.tolist()
    for a, b in zip(bounds, bounds[1:]):
        kk, vv = (x[a:b].transpose(0, 1).repeat_interleave(rep, 0) for x in (k, v))
        out[a:b] = F.scaled_dot_product_attention(q[a:b].transpose(0, 1), kk, vv, is_causal=causal,
                                                  scale=softmax_scale).transpose(0, 1)
    return out


def _dense(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
    rep = q.shape[2] // k.shape[2]
    kk, vv = (x.transpose(1, 2).repeat_interleave(rep, 1) for x in (k, v))
    return F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, is_causal=causal, scale=softmax_scale).transpose(1, 2)


@pytest.fixture
def flash_on_cpu(monkeypatch):
    """transformers' flash-attention path with reference kernels, and counters of what it derives per layer."""
    import transformers.modeling_flash_attention_utils as fau

    monkeypatch.setattr(fau, "_lazy_imports", lambda *a, **k: (_dense, _varlen, None, fau._pad_input, fau._unpad_input))
    monkeypatch.setattr(fau, "_loaded_implementation", None)
    counts = {"derived": 0, "max_length_types": set()}
    derive = fau.prepare_fa_kwargs_from_position_ids

    def counted(position_ids):
        counts["derived"] += 1
        return derive(position_ids)

    monkeypatch.setattr(fau, "prepare_fa_kwargs_from_position_ids", counted)
    yield counts
    fau._loaded_implementation = None  # the next user loads the real kernels again


def _tiny_lora(attn: str):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    model.get_base_model().config._attn_implementation = attn
    return model


def _examples():
    rows = []
    for n, prompt, seed in ((13, 4, 1), (7, 2, 2), (21, 6, 3)):
        ids = torch.randint(1, 128, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
        rows.append(SimpleNamespace(input_ids=ids, labels=[-100] * prompt + ids[prompt:]))
    return rows


def _loss_grads(model, batch):
    from roctune.training.losses import Head, token_loss_sum

    loss = token_loss_sum(model, batch, Head()) / batch.n_supervised
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def test_packed_cumulative_lengths_are_computed_once_per_batch_not_per_layer(flash_on_cpu, monkeypatch):
    from roctune.training import batching

    made = []
    compute = batching.packed_attention_kwargs
    monkeypatch.setattr(batching, "packed_attention_kwargs", lambda *a: made.append(1) or compute(*a))
    batch = batching.collate(_examples(), 0, True, "cpu")
    assert len(made) == 1
    assert batch.attn_kwargs["cu_seq_lens_q"].tolist() == [0, 13, 20, 41]
    assert batch.attn_kwargs["cu_seq_lens_q"].dtype == torch.int32
    assert batch.attn_kwargs["max_length_q"] == 21 and isinstance(batch.attn_kwargs["max_length_k"], int)

    model = _tiny_lora("flash_attention_2")
    ours = _loss_grads(model, batch)
    assert flash_on_cpu["derived"] == 0  # neither in forward nor in backward: every layer took the batch's
    plain = batching.Batch(**{**vars(batch), "attn_kwargs": {}})  # what transformers did before: position_ids only
    theirs = _loss_grads(model, plain)
    assert flash_on_cpu["derived"] == LAYERS  # once per layer per forward
    assert ours[0] == pytest.approx(theirs[0], rel=1e-6)
    for n in ours[1]:
        assert torch.allclose(ours[1][n], theirs[1][n], rtol=1e-5, atol=1e-7), n
    # examples kept apart: the same loss as the three examples padded into a [3, T] batch (SDPA, causal)
    padded = _loss_grads(_tiny_lora("sdpa"), batching.collate(_examples(), 0, False, "cpu"))
    assert ours[0] == pytest.approx(padded[0], rel=1e-5)


def test_sdpa_ignores_the_varlen_arguments_and_masks_from_position_ids():
    from roctune.training import batching

    batch = batching.collate(_examples(), 0, True, "cpu")
    model = _tiny_lora("sdpa")
    with_kwargs = _loss_grads(model, batch)
    without = _loss_grads(model, batching.Batch(**{**vars(batch), "attn_kwargs": {}}))
    assert with_kwargs[0] == pytest.approx(without[0], rel=1e-7)


@pytest.mark.parametrize("same", [False, True])
def test_compiled_layers_trace_one_graph_when_the_first_layer_input_requires_grad_too(same):
    """Frozen embeddings (LoRA) give layer 0 an input without grad and layers 1.. one with: dynamo's requires_grad
    guard compiled the shared layer forward twice. `compiled.same_inputs` makes it one graph, same gradients."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from roctune.training import batching, compiled

    batch = batching.collate(_examples(), 0, False, "cpu")
    eager = _loss_grads(_tiny_lora("sdpa"), batch)
    torch._dynamo.reset()
    counters.clear()
    model = _tiny_lora("sdpa")
    compiled.compile_layers(model, backend="aot_eager")
    if same:
        compiled.same_inputs(model)
    try:
        ours = _loss_grads(model, batch)
    finally:
        compiled.uncompile_layers(model)
        torch._dynamo.reset()
    assert int(counters["stats"]["unique_graphs"]) == (1 if same else 2)
    assert ours[0] == pytest.approx(eager[0], rel=1e-6)
    for n in eager[1]:
        assert torch.allclose(ours[1][n], eager[1][n], rtol=1e-5, atol=1e-7), n
