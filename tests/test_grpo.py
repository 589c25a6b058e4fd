"""--stage grpo: the loss and its gradients against TRL's GRPOTrainer on the same inputs (every variant offered),
group-relative advantages, the rewards (built-ins, a user's reward file, the errors of a bad reward), and
training on a tiny model."""
import math

import pytest

from roctune.training import grpo_loss as gl

G = 4  # completions per prompt in these tests


# ------------------------------------------------------------------------------------------- TRL's loss
def _tiny(vocab: int, pad_id: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, pad_token_id=pad_id)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).float()


@pytest.fixture(scope="module")
def trl_trainer(tiny_model_dir, tmp_path_factory):
    """TRL's GRPOTrainer on a tiny model, built offline (temperature 0.7, so the scoring divides the logits)."""
    pytest.importorskip("trl", reason="TRL is in the test extra")
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    args = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("trl")), per_device_train_batch_size=G,
                      num_generations=G, max_completion_length=8, report_to="none", use_cpu=True, temperature=0.7,
                      bf16=False)
    trainer = GRPOTrainer(model=_tiny(len(tok), tok.pad_token_id), args=args, processing_class=tok,
                          reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                          train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}))
    trainer.current_gradient_accumulation_steps = 1
    return trainer, tok


def _inputs(vocab: int, seed: int = 1):
    """Two prompts (equal length: TRL's left padding would shift positions) x G completions of 2..8 tokens,
    rewards, and old/ref log-probs away from the current ones (so ratios are clipped)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    n = 2 * G
    prompts = torch.randint(5, vocab, (2, 5), generator=g).repeat_interleave(G, 0)
    lens = torch.randint(2, 9, (n,), generator=g)
    comp = torch.randint(5, vocab, (n, 8), generator=g)
    cmask = (torch.arange(8)[None] < lens[:, None]).long()
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 2.0, 1.0])
    noise = (torch.rand(n, 8, generator=g) - 0.5) * 0.8
    noise_ref = (torch.rand(n, 8, generator=g) - 0.5) * 0.6
    return prompts, comp, cmask, rewards, noise, noise_ref


def _trl_loss(trainer, model, s: gl.LossSettings, data, current):
    import torch

    prompts, comp, cmask, rewards, noise, noise_ref = data
    adv, _ = gl.group_advantages(rewards, G, "group")
    trainer.loss_type, trainer.beta, trainer.importance_sampling_level = s.loss_type, s.beta, s.level
    trainer.epsilon_low, trainer.epsilon_high, trainer.max_completion_length = (s.epsilon_low, s.epsilon_high,
                                                                                s.max_completion_length)
    inputs = {"prompt_ids": prompts, "prompt_mask": torch.ones_like(prompts), "completion_ids": comp,
              "completion_mask": cmask, "advantages": adv, "old_per_token_logps": current + noise,
              "ref_per_token_logps": current + noise_ref, "num_items_in_batch": cmask.sum()}
    model.train()
    return trainer._compute_loss(model, inputs)


def _ours(model, s: gl.LossSettings, data, current_flat, head):
    from roctune.data.render import Tokenized
    from roctune.training.batching import collate

    prompts, comp, cmask, rewards, noise, noise_ref = data
    adv, _ = gl.group_advantages(rewards, G, "group")
    items = []
    for p, c, m in zip(prompts.tolist(), comp.tolist(), cmask.tolist()):
        c = c[:sum(m)]
        items.append(Tokenized(p + c, [-100] * len(p) + c, "x"))
    batch = collate(items, 0, False, "cpu")
    logp, rows = gl.completion_logprobs(model, batch, head, 0.7)
    flat = cmask.bool()
    old, ref = current_flat + noise[flat], current_flat + noise_ref[flat]
    total, stats = gl.micro_batch_loss(s, logp, old, ref, adv, rows, len(items))
    norm = sum(s.item_weight(n) for n in cmask.sum(1).tolist())
    return total / norm, logp


VARIANTS = [
    gl.LossSettings("grpo"), gl.LossSettings("dr_grpo", max_completion_length=8), gl.LossSettings("dapo"),
    gl.LossSettings("bnpo"), gl.LossSettings("grpo", level="sequence"),  # GSPO
    gl.LossSettings("dapo", beta=0.04, epsilon_high=0.28), gl.LossSettings("grpo", beta=0.1, level="sequence"),
]


@pytest.mark.parametrize("s", VARIANTS, ids=lambda s: f"{s.loss_type}-{s.level}-beta{s.beta}")
def test_loss_and_gradients_equal_trl(trl_trainer, s):
    import torch

    from roctune.training.losses import Head

    trainer, tok = trl_trainer
    data = _inputs(len(tok))
    ours_model = _tiny(len(tok), tok.pad_token_id)
    # the current log-probs (detached), to place old/ref log-probs around them
    with torch.no_grad():
        _, logp0 = _ours(ours_model, gl.LossSettings(), data, torch.zeros(int(data[2].sum())), Head())
    current = torch.zeros(data[2].shape)
    current[data[2].bool()] = logp0
    theirs_model = trainer.model
    theirs_model.zero_grad()
    theirs = _trl_loss(trainer, theirs_model, s, data, current)
    theirs.backward()
    mine, _ = _ours(ours_model, s, data, logp0, Head())
    mine.backward()
    assert abs(float(mine) - float(theirs)) < 1e-5, (float(mine), float(theirs))
    assert float(theirs) != 0.0
    grads_t = dict(theirs_model.named_parameters())
    worst = max(float((p.grad - grads_t[n].grad).abs().max()) for n, p in ours_model.named_parameters())
    assert worst < 1e-5
    clipped = gl.token_terms(s, logp0, logp0 + data[4][data[2].bool()], logp0, gl.group_advantages(data[3], G)[0],
                             data[2].bool().nonzero()[:, 0], 2 * G)[3]
    assert clipped.any()  # the inputs do exercise the clipping


def test_group_advantages_match_trl_and_unscorable_get_zero():
    import torch

    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    adv, std = gl.group_advantages(r, 4, "group")
    first = r[:4]
    assert torch.allclose(adv[:4], (first - first.mean()) / (first.std() + 1e-4))
    assert torch.all(adv[4:] == 0) and float(std[5]) == 0.0
    adv_none, _ = gl.group_advantages(r, 4, "none")
    assert torch.allclose(adv_none[:4], first - first.mean())
    adv_b, std_b = gl.group_advantages(r, 4, "batch")
    assert torch.allclose(std_b, r.std().expand(8))
    nan = torch.tensor([1.0, float("nan"), 0.0, 1.0])
    adv_n, _ = gl.group_advantages(nan, 4)
    assert float(adv_n[1]) == 0.0 and not math.isnan(float(adv_n.sum()))
