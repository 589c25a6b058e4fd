"""Activation memory savers (roctune.training.activations) and the chunked output layer (training.losses): fewer
bytes kept for backward, and exactly the numbers of the plain peft / cross-entropy path."""
from __future__ import annotations

import pytest
import torch

from lora_dropout import record_masks, replay_into
from sp_worker import saved_bytes


def _tiny_lora(dropout: float, seed: int = 0):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    # init_lora_weights=False: B is random too, so the dropout masks change the output and the gradients
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      init_lora_weights=False)
    model = get_peft_model(model, lora)
    model.train()
    return model


def _slim(model) -> str:
    """Every shortcut of the llama family (the tiny model's), as training applies them."""
    from roctune.families import ALL_SHORTCUTS, family_of
    from roctune.training.activations import slim

    return slim(model, ALL_SHORTCUTS, family_of("llama"))


def _batch(seed: int = 1):
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 300, (2, 40), generator=g)
    labels = ids.clone()
    labels[:, :10] = -100
    labels[1, 30:] = -100
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    return SimpleNamespace(input_ids=ids, attention_mask=mask, position_ids=None, labels=labels, shifted=False,
                           attn_kwargs={}, inputs=None)


def _loss_and_grads(model, batch):
    from roctune.training.losses import Head, token_loss_sum

    torch.manual_seed(123)
    loss = token_loss_sum(model, batch, Head())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


def _saved_bytes(model, batch) -> int:
    from roctune.training.losses import Head, token_loss_sum

    return saved_bytes(lambda: token_loss_sum(model, batch, Head()), model)[1]


def test_slim_model_gives_the_plain_peft_numbers_with_the_same_dropout_masks(monkeypatch):
    drawn = record_masks(monkeypatch)
    batch = _batch()
    plain, slimmed = _tiny_lora(0.3), _tiny_lora(0.3)
    said = _slim(slimmed)
    assert "8 LoRA dropouts keep" in said and "2 MLPs recompute" in said
    loss_b, grads_b = _loss_and_grads(slimmed, batch)
    assert len(drawn) == 8 and all(k.dtype == torch.uint8 for k, _ in drawn)
    replay = replay_into(plain, drawn)  # the masks in call order: q, k, v, o of layer 0, then layer 1
    loss_a, grads_a = _loss_and_grads(plain, batch)
    assert not replay  # every recorded mask was used once
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-6, atol=1e-6)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == 16
    for name in grads_a:  # the 1/(1-p) scale is applied to the r-wide side: equal up to float rounding
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-5,
                                   atol=1e-5 * grads_a[name].abs().max().item(), msg=name)
    assert any(g.abs().max() > 0 for g in grads_a.values())


def test_keep_mask_drops_each_element_with_probability_p_reproducibly():
    from roctune.training.activations import keep_mask

    x = torch.empty(250_001)  # not a multiple of the four elements one 64-bit draw serves
    for p in (0.05, 0.3):
        torch.manual_seed(1)
        keep, scale = keep_mask(x, p)
        assert keep.shape == x.shape and set(keep.unique().tolist()) == {0, 1}
        p_used = 1 - 1 / scale
        assert abs(p_used - p) <= 2 ** -17  # p rounded to 16 bits, and the scale made from that p
        for lane in range(4):  # each 16-bit lane of a draw drops at rate p (a lane without a sign bit would not)
            dropped = 1 - keep[lane::4].double().mean().item()
            assert abs(dropped - p_used) < 5 * (p_used * (1 - p_used) / (x.numel() / 4)) ** 0.5, (p, lane, dropped)
        torch.manual_seed(1)
        assert torch.equal(keep_mask(x, p)[0], keep)  # torch.manual_seed reproduces it
        assert not torch.equal(keep_mask(x, p)[0], keep)  # and the stream moves on


def test_dropout_masks_are_redrawn_identically_under_gradient_checkpointing():
    from roctune.training.activations import mask_lora_dropout

    batch = _batch()
    slimmed, checkpointed = _tiny_lora(0.3), _tiny_lora(0.3)
    _slim(slimmed)
    assert mask_lora_dropout(checkpointed) == 8
    checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    checkpointed.enable_input_require_grads()
    loss_a, grads_a = _loss_and_grads(slimmed, batch)
    loss_b, grads_b = _loss_and_grads(checkpointed, batch)
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-6, atol=1e-6)
    for name in grads_a:  # a layer recomputed in backward drew other masks than its forward: gradients would differ
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-5,
                                   atol=1e-5 * grads_a[name].abs().max().item(), msg=name)


def test_slim_model_keeps_fewer_bytes_for_backward():

    batch = _batch()
    plain, slimmed = _tiny_lora(0.1), _tiny_lora(0.1)
    _slim(slimmed)
    before, after = _saved_bytes(plain, batch), _saved_bytes(slimmed, batch)
    assert after < 0.7 * before, (before, after)  # 0.67 here; 0.57 on the bundled model (see the module)


def test_slim_model_saves_and_merges_like_peft(tmp_path):
    from peft import get_peft_model_state_dict


    plain, slimmed = _tiny_lora(0.1), _tiny_lora(0.1)
    _slim(slimmed)
    a, b = get_peft_model_state_dict(plain), get_peft_model_state_dict(slimmed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    x = torch.randint(0, 300, (1, 12))
    plain.eval(), slimmed.eval()
    with torch.no_grad():
        want = plain(input_ids=x).logits
        assert torch.equal(slimmed(input_ids=x).logits, want)  # eval: no dropout, no checkpoint
        merged = slimmed.merge_and_unload()
        assert torch.allclose(merged(input_ids=x).logits, want, atol=1e-4)


def test_adapters_without_dropout_or_with_dora_are_left_alone():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from roctune.training.activations import mask_lora_dropout

    assert mask_lora_dropout(_tiny_lora(0.0)) == 0
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    dora = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_dropout=0.1, target_modules=["q_proj"],
                                                            use_dora=True))
    assert mask_lora_dropout(dora) == 0


@pytest.mark.parametrize("chunk", [7, 10 ** 9])
@pytest.mark.parametrize("head", [(1.0, None), (4.0, None), (1.0, 3.0), (2.5, 2.0)])
def test_token_logprobs_match_log_softmax_values_and_gradients(monkeypatch, chunk, head):
    from roctune.training import losses

    head = losses.Head(divisor=head[0], softcap=head[1])  # Granite's divisor, Gemma 2's soft-cap, both

    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", chunk * 50)  # 50-word vocabulary: `chunk` rows at a time
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 50, (23,), generator=g)
    upstream = torch.randn(23, generator=g, dtype=torch.float64)
    h1 = torch.randn(23, 16, generator=g, dtype=torch.float64, requires_grad=True)
    h2 = h1.detach().clone().requires_grad_(True)
    want = torch.log_softmax(head.apply(h1 @ weight.T), dim=-1).gather(1, targets[:, None]).squeeze(1)
    got = losses.token_logprobs(h2, weight, targets, head)
    assert torch.allclose(got.double(), want, atol=1e-6)
    (want * upstream).sum().backward()
    (got.double() * upstream).sum().backward()
    assert torch.allclose(h1.grad, h2.grad, atol=1e-5)
    with torch.no_grad():
        assert torch.equal(losses.token_logprobs(h2, weight, targets, head), got.detach())


def test_output_layer_that_trains_takes_the_plain_path():
    from roctune.training.losses import Head, _frozen_head

    model = _tiny_lora(0.0)
    assert _frozen_head(model, Head()) is not None
    assert _frozen_head(model, None) is None
    assert _frozen_head(model, Head(chunked=False)) is None
    model.get_base_model().get_output_embeddings().weight.requires_grad_(True)  # full fine-tuning
    assert _frozen_head(model, Head()) is None
