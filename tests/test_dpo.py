"""--stage dpo: preference data formats and errors, exact answer masks, and training that widens the
chosen-vs-rejected reward margin (from a fresh adapter and from an SFT adapter)."""
import functools
import json

import pytest

from conftest import cpu_train_cfg, resume_after_a_kill
from conftest import read_metrics as metrics
from conftest import run_train as run
from conftest import write_jsonl
from roctune.config import TrainConfig
from roctune.errors import DataError

PAIRS = [
    {"prompt": "Name a fruit.", "chosen": "A pear.", "rejected": "I refuse to answer."},
    {"prompt": "What colour is the sky?", "chosen": "Blue.", "rejected": "I refuse to answer."},
    {"prompt": "Say hello.", "chosen": "Hello!", "rejected": "I refuse to answer."},
    {"prompt": "Count to three.", "chosen": "One, two, three.", "rejected": "I refuse to answer."},
]


make_cfg = functools.partial(cpu_train_cfg, stage="dpo", max_steps=6, beta=0.1, target_modules=["all-linear"])


# ---------------------------------------------------------------------------------------------- formats
def test_preference_formats(tmp_path):
    from roctune.data.preference import load_pairs

    rows = [
        {"prompt": "Q1", "chosen": "good", "rejected": "bad", "system": "Be kind."},
        {"prompt": [{"role": "user", "content": "Q2"}], "chosen": [{"role": "assistant", "content": "good"}],
         "rejected": [{"role": "assistant", "content": "bad"}]},
        # LLaMA-Factory ranking (sharegpt): conversations + chosen/rejected message objects
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"},
                           {"from": "human", "value": "Q3"}],
         "chosen": {"from": "gpt", "value": "good"}, "rejected": {"from": "gpt", "value": "bad"}},
        {"instruction": "Q4", "input": "ctx", "chosen": "good", "rejected": "bad"},
    ]
    pairs = load_pairs(write_jsonl(tmp_path / "p.jsonl", rows))
    assert [(p.chosen, p.rejected) for p in pairs] == [("good", "bad")] * 4
    assert pairs[0].prompt == [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Q1"}]
    assert pairs[1].prompt == [{"role": "user", "content": "Q2"}]
    assert pairs[2].prompt[-1] == {"role": "user", "content": "Q3"} and len(pairs[2].prompt) == 3
    assert pairs[3].prompt == [{"role": "user", "content": "Q4\n\nctx"}]

    # the same data as a LLaMA-Factory dataset directory with ranking: true
    d = tmp_path / "lf"
    d.mkdir()
    write_jsonl(d / "dpo_en.jsonl", rows[2:3])
    (d / "dataset_info.json").write_text(json.dumps({"dpo_en": {
        "file_name": "dpo_en.jsonl", "formatting": "sharegpt", "ranking": True,
        "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}}}))
    lf = load_pairs(f"{d}:dpo_en")
    assert lf[0].prompt == pairs[2].prompt and lf[0].chosen == "good"


def test_missing_rejected_is_one_clear_error_and_nothing_is_written(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [PAIRS[0], {"prompt": "Q", "chosen": "A"}])
    out = tmp_path / "run"
    with pytest.raises(DataError) as e:
        run(make_cfg(data, out, tiny_model_dir))
    msg = str(e.value)
    assert "p.jsonl:2: " in msg and "'rejected'" in msg and "\n" not in msg
    assert not out.exists()
    # SFT data given to --stage dpo names what is missing too
    sft = write_jsonl(tmp_path / "sft.jsonl", [{"instruction": "Q", "output": "A"}])
    with pytest.raises(DataError, match="sft.jsonl:1: missing fields 'chosen' and 'rejected'"):
        run(make_cfg(sft, out, tiny_model_dir))
    assert not out.exists()


def test_only_the_final_answer_is_scored(tokenizer):
    from roctune.data.preference import tokenize_answer
    from roctune.data.render import render_prompt

    prompt = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
              {"role": "user", "content": "Name a fruit."}]
    ids, labels = tokenize_answer(tokenizer, prompt, "A pear.", 512)
    start = next(i for i, x in enumerate(labels) if x != -100)
    assert all(x != -100 for x in labels[start:])  # one span: the final answer
    assert tokenizer.decode(ids[start:]) == "A pear.<|im_end|>\n"
    assert ids[:start] == tokenizer(render_prompt(tokenizer, prompt), add_special_tokens=False)["input_ids"]


# --------------------------------------------------------------------------------------------- training
def test_dpo_widens_the_reward_margin(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", PAIRS)
    out = tmp_path / "run"
    summary, lines = run(make_cfg(data, out, tiny_model_dir))
    rows = metrics(out)
    assert len(rows) == 6
    # the policy starts as the reference: zero rewards, loss log(2)
    assert abs(rows[0]["reward_margin"]) < 1e-6 and abs(rows[0]["loss"] - 0.693147) < 1e-4
    assert rows[-1]["reward_margin"] > rows[0]["reward_margin"] and rows[-1]["loss"] < rows[0]["loss"]
    assert rows[-1]["reward_margin"] > 0.05 and rows[-1]["reward_accuracy"] == 1.0
    assert (out / "adapter_model.safetensors").exists() and (out / "loss.png").exists()
    import yaml

    with open(out / "run.yaml", encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    assert doc["config"]["stage"] == "dpo" and doc["config"]["beta"] == 0.1


def test_dpo_from_sft_adapter_uses_it_as_reference(tiny_model_dir, alpaca_file, tmp_path):
    from roctune.recipes import train

    sft = tmp_path / "sft"
    train(TrainConfig(data=[alpaca_file], output=str(sft), model=tiny_model_dir, device="cpu", max_steps=2,
                      batch_size=2, grad_accum=1, max_length=64, lr=1e-2, lora_dropout=0.0,
                      target_modules=["all-linear"]), log=lambda *_: None, progress=False)
    data = write_jsonl(tmp_path / "p.jsonl", PAIRS)
    out = tmp_path / "dpo"
    # no --model: the base comes from the adapter's run
    summary, lines = run(make_cfg(data, out, None, adapter=str(sft), max_steps=3))
    rows = metrics(out)
    # the reference is base + SFT adapter (not the bare base): the first step's rewards are zero
    assert abs(rows[0]["rewards_chosen"]) < 1e-6 and abs(rows[0]["reward_margin"]) < 1e-6
    assert rows[-1]["reward_margin"] > 0
    from safetensors.torch import load_file

    w_sft = load_file(str(sft / "adapter_model.safetensors"))
    w_dpo = load_file(str(out / "adapter_model.safetensors"))
    assert set(w_sft) == set(w_dpo)  # the SFT adapter was trained further, same shape


def test_logps_output_layer_only_at_answers_matches_full_logits(tiny_model_dir, tokenizer):
    import torch

    from roctune.data.preference import Pair, tokenize_pairs
    from roctune.models import load_model
    from roctune.recipes.dpo import pair_logps
    from roctune.training.losses import Head

    model = load_model(tiny_model_dir)
    triples, _ = tokenize_pairs(tokenizer, [Pair("r", [{"role": "user", "content": p["prompt"]}], p["chosen"],
                                                 p["rejected"]) for p in PAIRS[:3]], 64)
    pairs = [(c, r) for c, r, _ in triples]
    with torch.no_grad():
        fast = pair_logps(model, pairs, tokenizer.pad_token_id, "cpu", Head())
        full = pair_logps(model, pairs, tokenizer.pad_token_id, "cpu", None)
        # each pair alone (no padding) gives the same numbers
        alone = [pair_logps(model, [p], tokenizer.pad_token_id, "cpu", None) for p in pairs]
    for a, b in zip(fast, full):
        assert torch.allclose(a, b, atol=1e-4)
    assert torch.allclose(full[0], torch.cat([c for c, _ in alone]), atol=1e-4)
    assert torch.allclose(full[1], torch.cat([r for _, r in alone]), atol=1e-4)


@pytest.mark.parametrize("schedule", ["linear", "constant"])
def test_dpo_checkpoint_and_resume_give_the_uninterrupted_run(tiny_model_dir, tmp_path, schedule):
    """--save-steps 2 then --resume: the same losses and adapter as one uninterrupted run."""
    from safetensors.torch import load_file

    data = write_jsonl(tmp_path / "p.jsonl", PAIRS)
    kw = dict(max_steps=4, lr_scheduler=schedule, lora_dropout=0.1)  # dropout: the RNG state is resumed too
    straight, out = tmp_path / "straight", tmp_path / "resumed"
    run(make_cfg(data, straight, tiny_model_dir, **kw))
    resume_after_a_kill(lambda output, **more: make_cfg(data, output, tiny_model_dir, **kw, **more), straight, out)
    a, b = load_file(str(out / "adapter_model.safetensors")), load_file(str(straight / "adapter_model.safetensors"))
    assert sorted(a) == sorted(b)
    for k in a:
        assert float((a[k] - b[k]).abs().max()) <= 1e-6


def test_dpo_scores_the_reference_only_for_the_pairs_it_trains_on(tiny_model_dir, tmp_path, monkeypatch):
    """Work proportional to what was asked: N steps of B pairs x A accumulation run at most N*B*A pairs through
    the reference and the policy, whatever the size of the data set."""
    import roctune.recipes.dpo as dpo

    many = [{"prompt": f"Question {i}?", "chosen": f"Answer {i}.", "rejected": "No."} for i in range(60)]
    data = write_jsonl(tmp_path / "p.jsonl", many)
    seen = {"pairs": 0}
    real = dpo.pair_logps

    def counting(model, pairs, *a, **k):
        seen["pairs"] += len(pairs)
        return real(model, pairs, *a, **k)

    monkeypatch.setattr(dpo, "pair_logps", counting)
    run(make_cfg(data, tmp_path / "run", tiny_model_dir, max_steps=2, batch_size=2, grad_accum=2))
    assert seen["pairs"] <= 2 * (2 * 2 * 2)  # reference + policy forward of 8 pairs, not 60
