"""Sequence parallelism (roctune.training.sequence_parallel): 2 CPU processes (gloo, torchrun) that split one long
example give the loss and LoRA gradients of one process, each keeping about half the activations; the CLI's
`--nproc 2 --sequence-parallel 2` trains the one-process run's losses and adapter; bad combinations are refused in one
line before anything is written; a shard's labels and positions are the whole row's."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from roctune.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
LENGTH = 384  # a "long" example for the tiny model (native context 512): fast, and 192 tokens a rank


def _env():
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    return env


@pytest.fixture(scope="module")
def three_head_model_dir(tmp_path_factory, default_model_dir):
    """A tiny llama whose 3 query heads (1 key/value head) do not divide by 2 ranks: the all-gather scheme."""
    from conftest import build_tiny_llama

    return build_tiny_llama(str(tmp_path_factory.mktemp("tiny-3-heads")), default_model_dir, heads=3, kv_heads=1,
                            hidden=48)


@pytest.mark.slow
@pytest.mark.parametrize("heads", [4, 3])
def test_two_ranks_give_one_process_loss_and_gradients_with_half_the_activations(heads, request, tmp_path):
    """4 heads: Ulysses' all-to-all; 3 heads (do not divide by 2): each rank gathers the row's keys and values."""
    import sp_worker
    from safetensors.torch import load_file

    from roctune.hardware.network import free_port

    tiny_model_dir = request.getfixturevalue("tiny_model_dir" if heads == 4 else "three_head_model_dir")
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    sp_worker.main(tiny_model_dir, LENGTH, str(one))  # one process (no torchrun: no process group)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                        "127.0.0.1", "--master-port", str(free_port()), os.path.join(REPO, "tests", "sp_worker.py"),
                        tiny_model_dir, str(LENGTH), str(two)], env=_env(), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ref = json.loads((one / "rank0.json").read_text())
    ranks = [json.loads((two / f"rank{i}.json").read_text()) for i in range(2)]
    assert [x["local_tokens"] for x in ranks] == [LENGTH // 2] * 2 and ref["local_tokens"] == LENGTH
    assert ranks[0]["supervised"] == ref["supervised"] == LENGTH - LENGTH // 5  # every label after the prompt
    assert ranks[0]["loss_sum"] == pytest.approx(ref["loss_sum"], rel=1e-5)
    a, b = load_file(one / "grads.safetensors"), load_file(two / "grads.safetensors")
    assert sorted(a) == sorted(b) and len(a) == 20  # 2 layers x 5 modules x (A, B)
    for k in a:
        scale = float(a[k].abs().max())
        assert scale > 0, k  # every gradient is non-zero, so a missing share would show
        assert float((a[k] - b[k]).abs().max()) <= 1e-5 * scale, k
    # each rank keeps about half of one process's activations (Ulysses: attention's exchanged q/k/v are 1/2 too).
    # All-gather: the last rank's attention keeps whole-row queries (zero-padded in front) and outputs, so it keeps
    # more than half here, where attention is a fifth of this tiny model's activations (measured 64%).
    for i, x in enumerate(ranks):
        high = 0.7 if heads % 2 and i == len(ranks) - 1 else 0.6
        assert 0.4 * ref["saved_bytes"] <= x["saved_bytes"] <= high * ref["saved_bytes"], (i, x, ref)


def _long_rows(n: int, words: int, seed: int):
    import random

    rng = random.Random(seed)
    vocab = ["river", "stone", "lamp", "orbit", "maple", "quiet", "copper", "signal", "harbor", "violet"]
    return [{"instruction": f"Write note {i}.", "input": "",
             "output": " ".join(rng.choice(vocab) for _ in range(words))} for i in range(n)]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.mark.slow
def test_cli_sequence_parallel_trains_the_one_process_run(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    from conftest import read_metrics
    from roctune.cli import build_parser
    from roctune.commands.train import config_from_args
    from roctune.recipes import train

    data = _write(tmp_path / "long.jsonl", _long_rows(4, 300, 1))
    evald = _write(tmp_path / "eval.jsonl", _long_rows(2, 250, 2))
    common = ["--model", tiny_model_dir, "--data", data, "--eval-data", evald, "--max-steps", "3", "--lr", "1e-2",
              "--lora-dropout", "0", "--packing", "off", "--device", "cpu", "--batch-size", "1", "--grad-accum", "2",
              "--target-modules", "q_proj", "v_proj", "up_proj"]
    r = subprocess.run([sys.executable, "-m", "roctune", "train", *common, "--output", str(tmp_path / "sp"),
                        "--nproc", "2", "--sequence-parallel", "2"], cwd=tmp_path, env=_env(), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "sequence parallel: 1 group(s) of 2 processes" in r.stdout
    assert "2 examples (1 per micro-batch x 2 accumulation)" in r.stdout  # one data-parallel group
    args = build_parser().parse_args(["train", *common, "--output", str(tmp_path / "one")])
    train(config_from_args(args), log=lambda *_: None, progress=False)
    sp, one = read_metrics(tmp_path / "sp"), read_metrics(tmp_path / "one")
    assert [m["loss"] for m in sp] == pytest.approx([m["loss"] for m in one], rel=1e-4)
    assert len({m["loss"] for m in one}) == 3  # the curve moves, so a wrong gradient would show
    assert min(m["tokens"] for m in one) > 500  # long examples (two of ~300 tokens a step)
    assert [m["tokens"] for m in sp] == [m["tokens"] for m in one]  # counted once per sequence group
    assert sp[-1]["eval_loss"] == pytest.approx(one[-1]["eval_loss"], rel=1e-4)
    a, b = load_file(tmp_path / "sp" / "adapter_model.safetensors"), load_file(tmp_path / "one" / "adapter_model.safetensors")
    for k in a:
        assert float((a[k] - b[k]).abs().max()) <= 1e-5 * max(1.0, float(b[k].abs().max())), k


def test_shard_keeps_whole_row_labels_and_positions():
    import torch

    from roctune.training.batching import Batch
    from roctune.training.losses import _predicting, _targets
    from roctune.training.sequence_parallel import shard

    ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16]])
    labels = torch.tensor([[-100, -100, 12, 13, 14, 15, 16]])
    batch = Batch(ids, labels, None, None, 7, 5)
    parts = [shard(batch, r, 2, pad_id=0) for r in range(2)]
    assert [p.input_ids.tolist() for p in parts] == [[[10, 11, 12, 13]], [[14, 15, 16, 0]]]  # padded to 8
    # token t learns token t+1, across the cut too: rank 0's last token (13) learns rank 1's first (14)
    assert [p.labels.tolist() for p in parts] == [[[-100, 12, 13, 14]], [[15, 16, -100, -100]]]
    assert [p.position_ids.tolist() for p in parts] == [[[0, 1, 2, 3]], [[4, 5, 6, 7]]]
    assert [p.n_supervised for p in parts] == [3, 2] and sum(p.n_supervised for p in parts) == batch.n_supervised
    assert all(p.shifted for p in parts)
    targets, mask = _targets(parts[0])
    assert targets.tolist() == [[-100, 12, 13, 14]] and _predicting(parts[0], ids[:, :4]).shape == (1, 4)
    assert _targets(batch)[0].tolist() == [[-100, 12, 13, 14, 15, 16]]  # unsharded: the usual shift


def test_context_splits_ranks_into_sequence_and_data_groups():
    from roctune.training.distributed import Context

    seen = [(c.dp_rank, c.sp_rank) for c in (Context(rank=r, world_size=4, sp_size=2) for r in range(4))]
    assert seen == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert Context(rank=3, world_size=4, sp_size=2).dp_size == 2 and Context(world_size=4).dp_size == 4


def _refused(capsys, args, out):
    code = main(["train", "--output", str(out), *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not os.path.exists(out)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("roctune train: error: "), lines
    return lines[0]


@pytest.mark.parametrize("args, message", [
    (["--nproc", "3", "--sequence-parallel", "2"], "--sequence-parallel 2 must divide the 3 processes"),
    (["--sequence-parallel", "2"], "--sequence-parallel 2 must divide the 1 processes"),
    (["--nproc", "2", "--sequence-parallel", "2", "--stage", "dpo"], "does not support --stage dpo"),
    (["--nproc", "2", "--sequence-parallel", "2", "--fsdp"], "does not support --fsdp"),
    (["--nproc", "2", "--sequence-parallel", "2", "--packing", "on"], "does not support --packing on"),
    (["--nproc", "2", "--sequence-parallel", "2", "--attn", "eager"], "needs --attn sdpa or flash_attention_2"),
])
def test_bad_sequence_parallel_settings_are_refused_before_anything_starts(capsys, monkeypatch, tmp_path,
                                                                           tiny_model_dir, alpaca_file, args,
                                                                           message):
    import torch

    from roctune.training import launch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(launch, "launch", lambda cfg, say=print: pytest.fail("launched despite bad settings"))
    line = _refused(capsys, ["--model", tiny_model_dir, "--data", alpaca_file, "--device", "cpu", *args],
                    tmp_path / "out")
    assert message in line
