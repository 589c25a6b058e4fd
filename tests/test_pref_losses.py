"""--pref-loss: each preference loss and its gradients against TRL's own code on the same fixed inputs (DPOTrainer
for sigmoid/ipo/hinge/robust, CPOTrainer for simpo and cDPO's label smoothing, ORPOTrainer for orpo), the settings'
checks, the web UI's choices, and orpo/simpo training on a tiny model without a reference pass."""
import types
from collections import defaultdict

import pytest

from conftest import read_metrics as metrics
from conftest import run_train as run
from conftest import write_jsonl
from roctune.errors import ConfigError
from roctune.training import pref_losses as pl

B, T, V = 4, 9, 11  # pairs, tokens per sequence (1 prompt token + answer + padding), vocabulary


def _masks(seed: int, equal_chosen: bool = False):
    """[2B, T] completion masks (chosen rows, then rejected): token 0 is the prompt, answers of 2..T-1 tokens."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(2, T, (2 * B,), generator=g)
    if equal_chosen:
        lens[:B] = T - 2
    pos = torch.arange(T)[None]
    return ((pos >= 1) & (pos <= lens[:, None])).long(), g


def _ours(per_token, mask, s: pl.PrefSettings, ref=None):
    """Our mean loss from per-token log-probs [2B, T-1] (position t predicts token t+1) and the [2B, T] mask."""
    shifted = mask[:, 1:].float()
    sums, counts = (per_token * shifted).sum(1), shifted.sum(1)
    x = pl.PairLogps(sums[:B], sums[B:], counts[:B], counts[B:])
    if ref is not None:
        x.ref_chosen, x.ref_rejected = ref
    return pl.pair_losses(x, s)[0].mean()


# ------------------------------------------------------------------------- sigmoid, ipo, hinge, robust: DPOTrainer
def _trl_dpo_loss(per_token, mask, s: pl.PrefSettings, ref):
    """TRL's DPOTrainer._compute_loss on a stand-in trainer and a model whose fused head returns `per_token`."""
    import torch
    from trl import DPOTrainer

    acc = types.SimpleNamespace(device=torch.device("cpu"), gather=lambda t: t, gather_for_metrics=lambda t: t)
    trainer = types.SimpleNamespace(
        model=types.SimpleNamespace(training=True), accelerator=acc, aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=[s.loss], loss_weights=[1.0],
        beta=s.beta, label_smoothing=s.label_smoothing, use_weighting=False, _tp_size=1, _total_train_tokens=0,
        _metrics=defaultdict(lambda: defaultdict(list)))
    shifted = mask[:, 1:]
    zeros = torch.zeros(shifted.shape)

    def model(**kw):  # TRL sums log_probs over the sequence: the fused head leaves 0 where labels are -100
        return types.SimpleNamespace(log_probs=per_token * shifted, entropy=zeros, mean_logits=zeros,
                                     is_top1=zeros.bool())

    inputs = {"input_ids": torch.ones_like(mask), "attention_mask": torch.ones_like(mask), "completion_mask": mask,
              "ref_chosen_logps": ref[0], "ref_rejected_logps": ref[1]}
    return DPOTrainer._compute_loss(trainer, model, inputs, False)


@pytest.mark.parametrize("s", [pl.PrefSettings("sigmoid"), pl.PrefSettings("ipo", beta=0.5),
                               pl.PrefSettings("hinge", beta=0.3), pl.PrefSettings("robust", label_smoothing=0.2)],
                         ids=lambda s: s.loss)
def test_dpo_losses_and_gradients_equal_trl(s):
    import torch

    pytest.importorskip("trl", reason="TRL is in the test extra")
    mask, g = _masks(1)
    base = -torch.rand(2 * B, T - 1, generator=g) * 3  # per-token log-probs of the policy
    ref = tuple((-torch.rand(2 * B, generator=g) * 3 * mask.sum(1)).chunk(2))
    mine, theirs = base.clone().requires_grad_(), base.clone().requires_grad_()
    ours, trl = _ours(mine, mask, s, ref), _trl_dpo_loss(theirs, mask, s, ref)
    ours.backward(), trl.backward()
    assert abs(float(ours) - float(trl)) < 1e-5 and float(trl) != 0.0, (float(ours), float(trl))
    assert float((mine.grad - theirs.grad).abs().max()) < 1e-5
    assert float(theirs.grad.abs().max()) > 0  # the inputs do reach the loss


# -------------------------------------------------------------------------- simpo and cDPO: CPOTrainer; orpo: ORPO
def _trl_stub(cls, s: pl.PrefSettings, **attrs):
    """A stand-in for a TRL trainer of class `cls`: its own methods, bound to plain attributes."""
    import torch

    obj = types.SimpleNamespace(accelerator=types.SimpleNamespace(device=torch.device("cpu"),
                                                                  gather_for_metrics=lambda t: t),
                                is_encoder_decoder=False, aux_loss_enabled=False, padding_value=0, pad_token_id=0,
                                beta=s.beta, label_smoothing=s.label_smoothing, **attrs)
    for name in ("concatenated_forward", "get_batch_loss_metrics", "cpo_loss", "odds_ratio_loss"):
        if hasattr(cls, name):
            setattr(obj, name, types.MethodType(getattr(cls, name), obj))
    obj.concatenated_inputs, obj.get_batch_logps = cls.concatenated_inputs, cls.get_batch_logps
    return obj


def _trl_from_logits(trainer, logits, mask):
    """The trainer's whole loss (its forward, log-prob averaging, NLL and loss) for a model returning `logits`."""
    import torch

    ids = torch.randint(1, V, mask.shape, generator=torch.Generator().manual_seed(7))
    labels = ids.masked_fill(mask == 0, -100)
    batch = {"chosen_input_ids": ids[:B], "chosen_attention_mask": (labels[:B] != -100) | (torch.arange(T) == 0),
             "chosen_labels": labels[:B], "rejected_input_ids": ids[B:],
             "rejected_attention_mask": (labels[B:] != -100) | (torch.arange(T) == 0), "rejected_labels": labels[B:]}
    batch = {k: v.long() for k, v in batch.items()}
    model = lambda *a, **k: types.SimpleNamespace(logits=logits)  # noqa: E731
    return trainer.get_batch_loss_metrics(model, batch)[0], ids


def _ours_from_logits(logits, ids, mask, s: pl.PrefSettings):
    per_token = logits[:, :-1].log_softmax(-1).gather(2, ids[:, 1:, None]).squeeze(2)
    return _ours(per_token, mask, s)


@pytest.mark.parametrize("s", [pl.PrefSettings("simpo"), pl.PrefSettings("simpo", beta=2.0, simpo_gamma=1.2,
                                                                         label_smoothing=0.1),
                               pl.PrefSettings("orpo"), pl.PrefSettings("orpo", beta=0.5)],
                         ids=["simpo", "simpo-smoothed", "orpo", "orpo-beta0.5"])
def test_reference_free_losses_and_gradients_equal_trl(s):
    import torch

    pytest.importorskip("trl", reason="TRL is in the test extra")
    from trl.experimental.cpo import CPOTrainer
    from trl.experimental.orpo import ORPOTrainer

    # orpo: TRL's NLL averages the micro-batch's tokens, ours each pair's; equal chosen lengths make them agree
    mask, g = _masks(2, equal_chosen=s.loss == "orpo")
    trainer = (_trl_stub(ORPOTrainer, s) if s.loss == "orpo" else
               _trl_stub(CPOTrainer, s, loss_type="simpo", simpo_gamma=s.simpo_gamma, cpo_alpha=0.0, alpha=0.0))
    base = torch.randn(2 * B, T, V, generator=g) * 2
    mine, theirs = base.clone().requires_grad_(), base.clone().requires_grad_()
    trl, ids = _trl_from_logits(trainer, theirs, mask)
    ours = _ours_from_logits(mine, ids, mask, s)
    ours.backward(), trl.backward()
    assert abs(float(ours) - float(trl)) < 1e-5 and float(trl) != 0.0, (float(ours), float(trl))
    assert float((mine.grad - theirs.grad).abs().max()) < 1e-5
    assert float(theirs.grad.abs().max()) > 0


def test_conservative_dpo_is_cpos_smoothed_sigmoid_on_the_log_ratios():
    """--pref-loss sigmoid --label-smoothing e (cDPO): TRL 1.16's DPOTrainer dropped smoothing from its sigmoid
    loss; CPOTrainer's sigmoid keeps the form, so it is checked there on the log-ratios."""
    import torch

    pytest.importorskip("trl", reason="TRL is in the test extra")
    from trl.experimental.cpo import CPOTrainer

    s = pl.PrefSettings("sigmoid", beta=0.4, label_smoothing=0.15)
    mask, g = _masks(3)
    base = -torch.rand(2 * B, T - 1, generator=g) * 3
    ref = tuple((-torch.rand(2 * B, generator=g) * 3 * mask.sum(1)).chunk(2))
    mine, theirs = base.clone().requires_grad_(), base.clone().requires_grad_()
    sums = (theirs * mask[:, 1:]).sum(1)
    cpo = _trl_stub(CPOTrainer, s, loss_type="sigmoid", alpha=0.0)
    trl = cpo.cpo_loss(sums[:B] - ref[0], sums[B:] - ref[1])[0].mean()
    ours = _ours(mine, mask, s, ref)
    ours.backward(), trl.backward()
    assert abs(float(ours) - float(trl)) < 1e-5
    assert float((mine.grad - theirs.grad).abs().max()) < 1e-5
    plain = _ours(base, mask, pl.PrefSettings("sigmoid", beta=0.4), ref)
    assert abs(float(plain) - float(ours)) > 1e-3  # the smoothing does change the loss


def test_orpo_stays_finite_for_an_answer_the_model_is_sure_of():
    import torch

    x = pl.PairLogps(torch.tensor([0.0]), torch.tensor([-5.0]), torch.tensor([3.0]), torch.tensor([3.0]))
    loss, _, _ = pl.orpo(x, pl.PrefSettings("orpo"))
    assert torch.isfinite(loss).all()


# ----------------------------------------------------------------------------------------- settings and web UI
PAIRS = [
    {"prompt": "Name a fruit.", "chosen": "A pear.", "rejected": "I refuse to answer."},
    {"prompt": "What colour is the sky?", "chosen": "Blue.", "rejected": "I refuse to answer."},
    {"prompt": "Say hello.", "chosen": "Hello!", "rejected": "I refuse to answer."},
    {"prompt": "Count to three.", "chosen": "One, two, three.", "rejected": "I refuse to answer."},
]


def _cfg(**kw):
    from roctune.config import TrainConfig

    base = dict(data=["d.jsonl"], output="out", stage="dpo")
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("kw, says", [
    (dict(label_smoothing=0.5, pref_loss="robust"), "--label-smoothing must be < 0.5 (got 0.5)"),
    (dict(label_smoothing=-0.1), "--label-smoothing must be >= 0 (got -0.1)"),
    (dict(pref_loss="kto"), "--pref-loss must be one of sigmoid, ipo, hinge, robust, orpo, simpo (got 'kto')"),
    (dict(stage="sft", pref_loss="orpo"),
     "--pref-loss sets the preference loss of --stage dpo; drop it for --stage sft"),
    (dict(stage="grpo", simpo_gamma=1.0, rewards=["json"]), "--simpo-gamma sets the preference loss of --stage dpo"),
    (dict(pref_loss="ipo", label_smoothing=0.1), "--label-smoothing applies to --pref-loss sigmoid, robust, simpo, "
                                                 "not ipo; drop it"),
    (dict(pref_loss="orpo", simpo_gamma=1.0), "--simpo-gamma is the margin of --pref-loss simpo"),
])
def test_settings_are_checked_in_one_line(kw, says):
    with pytest.raises(ConfigError) as e:
        _cfg(**kw).validate()
    assert says in str(e.value) and "\n" not in str(e.value)


def test_llama_factory_names_and_the_one_list_of_choices(tmp_path):
    from roctune import config
    from roctune.webui.train_form import form_specs

    cfg = config.from_sources(flags={"data": ["d.jsonl"], "output": "o", "stage": "dpo"},
                              overrides=["pref_loss=simpo", "pref_beta=2", "simpo_gamma=1", "dpo_label_smoothing=0.1"])
    assert (cfg.pref_loss, cfg.beta, cfg.simpo_gamma, cfg.label_smoothing) == ("simpo", 2.0, 1.0, 0.1)
    cfg.validate()
    spec = {s["name"]: s for s in form_specs()}
    assert spec["pref_loss"]["choices"] == tuple(pl.LOSS_FUNCTIONS) == config.PREF_LOSSES == \
        config.TrainConfig.__dataclass_fields__["pref_loss"].metadata["choices"]
    assert set(pl.REFERENCE_FREE) <= set(config.PREF_LOSSES) and set(config.SMOOTHED) <= set(config.PREF_LOSSES)
    assert spec["pref_loss"]["group"] == spec["beta"]["group"] and spec["pref_loss"]["label_zh"] == "偏好损失"


# ------------------------------------------------------------------------------------------ training, no reference
@pytest.mark.parametrize("loss", pl.REFERENCE_FREE + ("ipo",))
def test_reference_free_losses_train_without_a_reference_pass(tiny_model_dir, tmp_path, monkeypatch, loss):
    """orpo and simpo train 2 steps (and evaluate) with no reference pass; ipo, as a control, has one."""
    import math

    import roctune.recipes.dpo as dpo
    from roctune.config import TrainConfig

    calls, real = [], dpo.reference_scores
    monkeypatch.setattr(dpo, "reference_scores", lambda *a, **k: calls.append(a) or real(*a, **k))
    data = write_jsonl(tmp_path / "p.jsonl", PAIRS)
    out = tmp_path / "run"
    summary, lines = run(TrainConfig(data=[data], output=str(out), model=tiny_model_dir, device="cpu", stage="dpo",
                                     pref_loss=loss, max_steps=2, batch_size=2, grad_accum=1, max_length=64,
                                     lr=5e-3, target_modules=["all-linear"], eval_ratio=0.25))
    rows = metrics(out)
    scoring = [line for line in lines if "scoring" in line and "with the reference" in line]
    if loss not in pl.REFERENCE_FREE:
        assert len(calls) == 1 and len(scoring) == 1 and any(line.endswith(f"loss {loss}, beta 0.1") for line in lines)
        return
    assert calls == [] and scoring == []
    assert any(line.endswith(f"loss {loss}, beta 0.1 (no reference model)") for line in lines)
    train = [r for r in rows if "loss" in r]
    assert len(train) == 2 and all(math.isfinite(r["loss"]) for r in train)
    assert any("eval_loss" in r for r in rows)  # evaluation scores pairs without a reference too
    assert (out / "adapter_model.safetensors").exists()


@pytest.mark.parametrize("name, given, recorded", [("label_smoothing", 0.1, 0.0), ("simpo_gamma", 1.0, 0.5),
                                                    ("pref_loss", "ipo", "sigmoid")])
def test_resume_refuses_another_loss_setting_than_the_run_used(tmp_path, name, given, recorded):
    """The loss defines the run: a --resume with another loss, smoothing or margin is refused, naming the flag."""
    from roctune import rundir
    from roctune.config import TrainConfig
    from roctune.recipes import check_resume

    out = tmp_path / "run"
    out.mkdir()
    rundir.write_run(str(out), {"config": {"stage": "dpo", name: recorded}})
    before = (out / rundir.RUN_FILE).read_bytes()
    cfg = TrainConfig(data=["d.jsonl"], output=str(out), stage="dpo", resume=True,
                             **({"pref_loss": "simpo"} if name == "simpo_gamma" else {}), **{name: given})
    with pytest.raises(ConfigError) as e:
        check_resume(cfg)
    assert str(e.value).startswith(f"--resume: --{name.replace('_', '-')} is {given!r} here but {recorded!r}")
    assert (out / rundir.RUN_FILE).read_bytes() == before
