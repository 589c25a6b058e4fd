"""--stage grpo: the loss and its gradients against TRL's GRPOTrainer on the same inputs (every variant offered),
group-relative advantages, the rewards (built-ins, a user's reward file, the errors of a bad reward), and
training on a tiny model."""
import json
import math
import os
import re

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


# ------------------------------------------------------------------------------------------------ rewards
def test_builtin_rewards():
    from types import SimpleNamespace

    from roctune.eval import rewards as rw

    cfg = SimpleNamespace(answer_column="answer", format_regex=r"^<a>\d+</a>$", max_completion_length=8,
                          length_penalty_window=4)
    answer = rw.builtin("answer", cfg)
    comps = ["2 + 3 = 5", "The answer is 1,000.", "#### 7", r"so \boxed{\frac{1}{2}}", "I think 6", "Paris."]
    gold = [5, "1000", "7.0", "0.5", 5, "paris"]
    assert answer(completions=comps, answer=gold) == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    conv = [[{"role": "assistant", "content": "= 12"}]]  # TRL's conversational completions
    assert answer(completions=conv, answer=[12]) == [1.0]
    assert rw.builtin("format", cfg)(completions=["<a>12</a>", "x <a>12</a>", "<a>1</a> more"]) == [1.0, 0.0, 0.0]
    length = rw.builtin("length", cfg)
    assert length(completions=["a"] * 4, completion_ids=[[1] * 3, [1] * 4, [1] * 6, [1] * 8]) == [0, 0, -0.5, -1]
    assert rw.json_reward(completions=['{"a": 1}', 'here:\n```json\n[1, 2]\n```', "{nope"]) == [1.0, 1.0, 0.0]


def test_reward_file_with_trl_convention_and_weights(tmp_path):
    from types import SimpleNamespace

    from roctune.eval import rewards as rw

    f = tmp_path / "my_rewards.py"
    f.write_text("import re\n"
                 "def has_digit(completions, **kwargs):\n"
                 "    return [1.0 if re.search(r'\\d', c) else 0.0 for c in completions]\n"
                 "def echo_answer(prompts, completions, answer, **kwargs):\n"
                 "    return [float(a) if p.startswith('Q') else None for p, a in zip(prompts, answer)]\n"
                 "def _helper():\n    pass\n")
    cfg = SimpleNamespace(rewards=["json"], reward_weights=["0.5", "1", "2"], answer_column="answer")
    built = rw.build(cfg, [str(f)])
    assert [(r.name, r.weight) for r in built] == [("json", 0.5), ("has_digit", 1.0), ("echo_answer", 2.0)]
    vals = rw.score(built, ["Q1", "x"], ["7", "no"], [[1], [2]], {"answer": [3, 4]})
    assert vals[0] == [1.0, 0.0] and vals[1] == [1.0, 0.0] and vals[2][0] == 3.0 and math.isnan(vals[2][1])
    assert rw.combine(vals, built) == [0.5 + 1 + 6, 0.0]
    only = rw.load_reward_file(f"{f}:echo_answer")
    assert [r.name for r in only] == ["echo_answer"]
    from roctune.errors import ConfigError
    with pytest.raises(ConfigError, match="3 weight.*2 reward function"):
        rw.build(SimpleNamespace(rewards=["json"], reward_weights=["1", "1", "1"]), [f"{f}:echo_answer"])
    with pytest.raises(ConfigError, match="no function nope"):
        rw.load_reward_file(f"{f}:nope")


@pytest.mark.parametrize("body, says", [
    ("raise KeyError('answer')", "raised KeyError: 'answer'"),
    ("return [float('nan')] * len(completions)", "returned nan for completion 0; rewards must be finite"),
    ("return [1.0]", "returned 1 values for 2 completions"),
    ("return 1.0", "returned float; it must return a list of 2 numbers"),
    ("return ['high', 1]", "returned str 'high' for completion 0"),
])
def test_a_bad_reward_is_one_line_naming_it(tmp_path, body, says):
    from roctune.errors import RewardError
    from roctune.eval import rewards as rw

    f = tmp_path / "r.py"
    f.write_text(f"def bad(completions, **kw):\n    {body}\n")
    with pytest.raises(RewardError) as e:
        rw.score(rw.load_reward_file(str(f)), ["p", "q"], ["a", "b"], [[1], [2]], {})
    # the function and its file are named, then what it did
    assert str(e.value).startswith(f"reward function 'bad' ({f}) {says}") and "\n" not in str(e.value)


def test_reward_file_only_from_the_command_line(tmp_path):
    from roctune import config
    from roctune.errors import ConfigError

    y = tmp_path / "c.yaml"
    y.write_text("stage: grpo\nreward_file: [evil.py]\n")
    with pytest.raises(ConfigError, match="only be given on the command line"):
        config.from_sources(str(y))
    with pytest.raises(ConfigError, match="only be given on the command line"):
        config.from_sources(overrides=["reward_file=evil.py"])
    cfg = config.from_sources(flags={"stage": "grpo", "data": ["d"], "output": "o"})
    with pytest.raises(ConfigError, match="needs a reward"):
        cfg.validate()


# --------------------------------------------------------------------------------------- rollouts, training
def test_rollout_decoding_equals_generate_and_stops_rows_alone(tiny_model_dir):
    """roctune.decoding's batched sampling with a KV cache (serve's code) at temperature 0 gives transformers'
    greedy generate, row by row, with left-padded prompts of different lengths; a row stops at its own EOS."""
    import torch
    from transformers import AutoModelForCausalLM

    from roctune.decoding import left_pad, sample_completions

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    ids, mask, _ = left_pad(prompts, 0)
    ref = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=0,
                         eos_token_id=None)[:, ids.shape[1]:].tolist()
    got = sample_completions(model, prompts, 6, 0.0, 1.0, set(), 0, None, "cpu")
    assert got == ref
    e = ref[1][2]  # make a token of row 1 an end of sequence: each row stops at its own first one
    got = sample_completions(model, prompts, 6, 0.0, 1.0, {e}, 0, None, "cpu")
    assert got == [r[:r.index(e) + 1] if e in r else r for r in ref] and len(got[1]) <= 3
    repeated = sample_completions(model, [p for p in prompts for _ in range(3)], 6, 0.0, 1.0, set(), 0, None, "cpu")
    assert repeated == [r for r in ref for _ in range(3)]  # a prompt prefilled once serves each of its repeats
    g1, g2 = (torch.Generator().manual_seed(3) for _ in range(2))
    a = sample_completions(model, prompts * 2, 5, 1.0, 0.9, set(), 0, g1, "cpu")
    assert a == sample_completions(model, prompts * 2, 5, 1.0, 0.9, set(), 0, g2, "cpu")  # seeded: repeatable


def test_draw_rows_follows_the_weights_and_never_draws_a_zero():
    """The two-level inverse-CDF draw: frequencies match the weights (within 5 standard errors), a zero weight is
    never drawn (inside a block, at the start of a row, or as the last block's padding), and a row with one weight
    always gives it; rows are independent."""
    import torch

    from roctune.decoding import draw_rows

    g = torch.Generator().manual_seed(0)
    w = torch.tensor([[0.0, 0.1, 0.0, 0.6, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0],
                      [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0],
                      [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                      [0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0]])
    n = 4000
    counts = torch.zeros_like(w)
    for _ in range(n):
        for r, i in enumerate(draw_rows(w, g, block=4)):
            counts[r, i] += 1
    p = w / w.sum(-1, keepdim=True)
    assert (counts[p == 0] == 0).all()
    assert ((counts / n - p).abs() <= 5 * (p * (1 - p) / n).sqrt() + 1e-9).all()


REWARD_FILE = ("def short_vowels(completions, answer, **kwargs):\n"
               "    texts = [c if isinstance(c, str) else c[0]['content'] for c in completions]\n"
               "    assert len(answer) == len(texts)  # a dataset column, one value per completion\n"
               "    return [sum(ch in 'aeiou' for ch in t) / (1 + len(t)) for t in texts]\n")
PROMPTS = [{"prompt": f"Say something about {w}.", "answer": i} for i, w in enumerate(
    ["apples", "rivers", "stars", "music", "cats", "rain", "bread", "glass"])]


def grpo_cfg(tmp_path, model, out="run", **kw):
    from conftest import write_jsonl
    from roctune.config import TrainConfig

    data = write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    rf = tmp_path / "rw.py"
    rf.write_text(REWARD_FILE)
    base = dict(data=[data], output=str(tmp_path / out), model=model, device="cpu", stage="grpo", max_steps=4,
                batch_size=2, grad_accum=1, num_generations=4, max_completion_length=6, lr=5e-3, lora_dropout=0.0,
                rewards=["length"], reward_file=[str(rf)], kl_beta=0.05, target_modules=["all-linear"], seed=3)
    base.update(kw)
    return TrainConfig(**base)


def test_grpo_trains_logs_its_metrics_and_evaluates_by_reward(tiny_model_dir, tmp_path):
    from conftest import read_metrics, run_train

    summary, lines = run_train(grpo_cfg(tmp_path, tiny_model_dir, eval_ratio=0.25, completion_samples_steps=2))
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["completions"] == 2 * 4 and 1 <= r["completion_length"] <= 6
        assert r["reward"] == pytest.approx(r["reward_short_vowels"] + r["reward_length"], abs=1e-5)
        for k in ("reward_std", "kl", "clip_ratio", "truncated", "zero_std_fraction", "completion_tokens"):
            assert k in r
    assert any(r["grad_norm"] > 0 for r in rows) and rows[-1]["kl"] > 0  # the adapter moved away from the base
    assert "eval_reward" in rows[-1] and "eval_reward_short_vowels" in rows[-1]
    assert (tmp_path / "run" / "adapter_model.safetensors").exists()
    samples = [json.loads(x) for x in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {2, 4} and all("completion" in s for s in samples)
    assert any("rewards: length x1, short_vowels x1" in x for x in lines)


def test_grpo_resume_gives_the_uninterrupted_run(tiny_model_dir, tmp_path):
    from conftest import read_metrics, run_train
    from safetensors.torch import load_file

    import shutil

    run_train(grpo_cfg(tmp_path, tiny_model_dir, "full", lora_dropout=0.1))
    part = tmp_path / "part"
    run_train(grpo_cfg(tmp_path, tiny_model_dir, "part", save_steps=2, lora_dropout=0.1))
    # pretend the run stopped after step 2: drop what came later, then resume
    lines = (part / "metrics.jsonl").read_text().splitlines()[:2]
    (part / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    os.unlink(part / "adapter_model.safetensors")
    shutil.rmtree(part / "checkpoint-4")
    run_train(grpo_cfg(tmp_path, tiny_model_dir, "part", save_steps=2, resume=True, lora_dropout=0.1))
    full, part = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "part")
    assert [r["reward"] for r in part] == [r["reward"] for r in full]
    a = load_file(tmp_path / "full" / "adapter_model.safetensors")
    b = load_file(tmp_path / "part" / "adapter_model.safetensors")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6


def test_a_reward_that_fails_in_training_names_it(tiny_model_dir, tmp_path):
    from conftest import run_train
    from roctune.errors import RewardError

    cfg = grpo_cfg(tmp_path, tiny_model_dir, max_steps=1)
    (tmp_path / "rw.py").write_text("def short_vowels(completions, **kw):\n"
                                    "    return [float('nan')] * len(completions)\n")
    cfg.reward_file = [str(tmp_path / "rw.py")]
    with pytest.raises(RewardError, match=r"reward function 'short_vowels' \(.*rw\.py\) returned nan"):
        run_train(cfg)
    bad = grpo_cfg(tmp_path, tiny_model_dir, out="never")
    (tmp_path / "bad.py").write_text("import not_a_module_anywhere\n")
    bad.reward_file = [str(tmp_path / "bad.py")]
    with pytest.raises(RewardError, match="bad.py: importing it raised ModuleNotFoundError"):
        run_train(bad)
    assert not (tmp_path / "never").exists()  # checked before the model loads or anything is written


def test_prompts_longer_than_max_length_are_named_as_prompts(tiny_model_dir, tmp_path):
    """GRPO drops a whole prompt that --max-length cannot hold (nothing is cut from an answer it has none of)."""
    from conftest import run_train
    from roctune.errors import DataError

    with pytest.raises(DataError, match=r"no trainable prompts left \(all 8 lost the prompt to --max-length 4\)"):
        run_train(grpo_cfg(tmp_path, tiny_model_dir, max_length=4, max_steps=1))
    assert not (tmp_path / "run" / "adapter_model.safetensors").exists()


def test_prompt_formats_and_columns(tmp_path):
    from conftest import write_jsonl
    from roctune.data.prompts import load_prompts
    from roctune.errors import DataError

    rows = [{"prompt": "Q1", "answer": 1, "system": "Be brief."},
            {"prompt": [{"role": "user", "content": "Q2"}], "answer": "2"},
            {"messages": [{"role": "user", "content": "Q3"}, {"role": "assistant", "content": "A3"}], "level": 3},
            {"instruction": "Q4", "input": "ctx", "output": "A4"}]
    got = load_prompts(write_jsonl(tmp_path / "p.jsonl", rows))
    assert got[0].messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q1"}]
    assert got[0].text_prompt and not got[1].text_prompt and got[0].columns == {"answer": 1, "system": "Be brief."}
    assert got[2].messages == [{"role": "user", "content": "Q3"}] and got[2].columns["level"] == 3
    assert got[3].messages == [{"role": "user", "content": "Q4\n\nctx"}] and got[3].columns["output"] == "A4"
    bad = write_jsonl(tmp_path / "b.jsonl", [rows[0], {"answer": 3}])
    with pytest.raises(DataError, match="b.jsonl:2: no prompt"):
        load_prompts(bad)


@pytest.mark.slow
def test_grpo_with_two_processes_passes_the_reward_file_on(tiny_model_dir, tmp_path):
    """--nproc 2 (gloo): the reward file, a command-line-only setting, reaches both processes as a flag."""
    import subprocess
    import sys

    from conftest import read_metrics, write_jsonl

    data = write_jsonl(tmp_path / "prompts.jsonl", PROMPTS[:4])
    (tmp_path / "rw.py").write_text(REWARD_FILE)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "roctune", "train", "--stage", "grpo", "--data", data, "--output", str(out),
           "--model", tiny_model_dir, "--device", "cpu", "--nproc", "2", "--reward-file", str(tmp_path / "rw.py"),
           "--num-generations", "2", "--max-completion-length", "4", "--batch-size", "1", "--grad-accum", "1",
           "--max-steps", "2", "--target-modules", "all-linear"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_metrics(out)
    assert [r["completions"] for r in rows] == [4, 4] and "reward_short_vowels" in rows[-1]


def test_eval_scores_base_and_tuned_by_the_rewards(tiny_model_dir, tmp_path, capsys):
    from conftest import run_train
    from roctune.cli import main

    cfg = grpo_cfg(tmp_path, tiny_model_dir, max_steps=2)
    run_train(cfg)
    held = cfg.data[0]
    assert main(["eval", "--adapter", cfg.output, "--data", held, "--json", "--reward", "length",
                 "--reward-file", str(tmp_path / "rw.py"), "--max-new-tokens", "6", "--reward-weights", "1", "2"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["n"] == len(PROMPTS)
    for side in ("base", "tuned"):
        assert set(got[side]) == {"reward", "reward_length", "reward_short_vowels"}
        assert got[side]["reward"] == pytest.approx(got[side]["reward_length"] + 2 * got[side]["reward_short_vowels"],
                                                    abs=2e-4)
    # a reward function returning the wrong count stops eval with one line naming it
    (tmp_path / "bad.py").write_text("def r(completions, **kw):\n    return [1]\n")
    assert main(["eval", "--adapter", cfg.output, "--data", held, "--reward-file", str(tmp_path / "bad.py")]) != 0
    assert "bad.py) returned 1 values for 8 completions" in capsys.readouterr().err


@pytest.mark.parametrize("method, loss_type, level", [("freeze", "grpo", "sequence"), ("full", "bnpo", "token"),
                                                      ("lora", "dr_grpo", "token")])
def test_grpo_runs_with_each_method_and_loss(tiny_model_dir, tmp_path, method, loss_type, level):
    from conftest import read_metrics, run_train

    cfg = grpo_cfg(tmp_path, tiny_model_dir, method=method, loss_type=loss_type, importance_sampling_level=level,
                   kl_beta=0.0 if method != "lora" else 0.04, max_steps=2, grad_accum=2, batch_size=1)
    run_train(cfg)
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 2 and all(r["completions"] == 2 * 4 for r in rows)
    assert any(r["grad_norm"] > 0 for r in rows) and "completion_tokens" not in rows[0]  # dapo's normaliser only


def test_kept_best_is_the_highest_eval_reward(tiny_model_dir, tmp_path):
    """--load-best with GRPO keeps the evaluation with the highest eval_reward (higher is better), not the lowest."""
    from conftest import read_metrics, run_train

    summary, lines = run_train(grpo_cfg(tmp_path, tiny_model_dir, eval_ratio=0.25, eval_steps=1, load_best=True,
                                        lr=2e-2))
    rows = [r for r in read_metrics(tmp_path / "run") if "eval_reward" in r]
    assert len(rows) == 4 and len({r["eval_reward"] for r in rows}) > 1  # the evaluations differ
    best = max(rows, key=lambda r: r["eval_reward"])  # the first of equals is kept
    assert summary["best_step"] == best["step"] and summary["best_value"] == best["eval_reward"]
    kept = json.loads((tmp_path / "run" / "best" / "best.json").read_text())
    assert kept == {"step": best["step"], "eval_reward": best["eval_reward"]}
    assert any(f"best eval reward {best['eval_reward']:.4f} at step {best['step']}" in x for x in lines)


def test_the_example_reward_file_loads_and_scores():
    from roctune.eval import rewards as rw

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "grpo_rewards.py")
    funcs = rw.load_reward_file(path)
    assert [f.name for f in funcs] == ["exact_sum", "short_answer"]
    vals = rw.score(funcs, ["What is 2 + 3?"] * 2, ["2 + 3 = 5", "It is 6"], [[1] * 6, [1] * 24], {"answer": [5, 5]})
    assert vals == [[1.0, 0.0], [pytest.approx(0.15), 0.0]]


@pytest.mark.parametrize("weights, says", [(["1", "x"], "expected numbers"), (["1", "nan"], "finite"),
                                           (["1"], "1 weight(s) for 2 reward function(s)")])
def test_reward_weights_are_checked_in_one_line(weights, says):
    from roctune.config import TrainConfig
    from roctune.errors import ConfigError
    from roctune.eval import rewards as rw

    cfg = TrainConfig(stage="grpo", rewards=["answer", "json"], reward_weights=weights)
    with pytest.raises(ConfigError, match=r"--reward-weights.*" + re.escape(says)):
        rw.build(cfg, [])
