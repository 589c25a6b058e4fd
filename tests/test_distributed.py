"""Several processes: launch-flag validation (nothing written on bad input), the torchrun command line, and real
2-process CPU (gloo) runs through the CLI: the same loss curve and adapter as one process with the same
effective batch, one output directory, resume from a 2-process checkpoint, and an FSDP smoke run."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from roctune.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STEPS = 4
COMMON = ["--max-steps", str(STEPS), "--lr", "1e-2", "--lora-dropout", "0", "--packing", "off", "--device", "cpu",
          "--batch-size", "2", "--save-steps", "2"]


def _losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


def _adapter(run_dir):
    from safetensors.torch import load_file

    return load_file(os.path.join(run_dir, "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    rows = [{"instruction": f"Say the word number {i}." + " Please." * (i % 4), "input": "",
             "output": f"Word {i}: banana."} for i in range(16)]
    path = tmp_path_factory.mktemp("dist-data") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _cli(args, cwd):
    """`python -m roctune train ...` in a fresh process, as a user would run it."""
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "roctune", "train", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def two_proc_run(tmp_path_factory, tiny_model_dir, data_file):
    """One 2-process run (batch 2, accumulation 1) shared by the tests below."""
    root = tmp_path_factory.mktemp("dist-run")
    out = root / "run"
    r = _cli(["--model", tiny_model_dir, "--data", data_file, "--output", str(out), "--nproc", "2",
              "--grad-accum", "1", *COMMON], cwd=root)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return root, out, r.stdout


# ------------------------------------------------------------------------------------ real 2-process runs
@pytest.mark.slow
def test_two_processes_follow_the_one_process_loss_curve(two_proc_run, tiny_model_dir, data_file, tmp_path):
    from roctune.commands.train import config_from_args
    from roctune.cli import build_parser

    root, out, stdout = two_proc_run
    # the effective batch is shown at the start: 2 per micro-batch x 1 accumulation x 2 processes
    assert "4 examples (2 per micro-batch x 1 accumulation x 2 processes)" in stdout
    assert stdout.count("examples:") == 1  # only rank 0 talks
    assert "DDP: a full model copy in each" in stdout  # PyTorch's DistributedDataParallel, not a hand-made sum

    one = tmp_path / "one"
    args = build_parser().parse_args(["train", "--model", tiny_model_dir, "--data", data_file, "--output", str(one),
                                      "--grad-accum", "2", *COMMON])
    from roctune.recipes import train

    train(config_from_args(args), log=lambda *_: None, progress=False)

    two_losses, one_losses = _losses(out), _losses(one)
    assert len(two_losses) == len(one_losses) == STEPS
    assert two_losses == pytest.approx(one_losses, rel=1e-4)
    assert len(set(one_losses)) == STEPS  # the curve moves, so a wrong gradient would show
    a, b = _adapter(out), _adapter(one)
    assert sorted(a) == sorted(b)
    assert any(float(t.abs().max()) > 0 for k, t in a.items() if "lora_B" in k)  # trained, not the init
    for k in a:
        assert float((a[k] - b[k]).abs().max()) <= 1e-5 * max(1.0, float(b[k].abs().max()))

    # one output directory (the only thing created next to it is nothing), one adapter, no leftovers
    assert sorted(os.listdir(root)) == ["run"]
    names = os.listdir(out)
    assert names.count("adapter_model.safetensors") == 1
    assert not [n for n in names if n.startswith(".tmp")]
    assert {"run.yaml", "metrics.jsonl", "loss.png", "checkpoint-2"} <= set(names)
    import yaml

    with open(out / "run.yaml", encoding="utf-8") as f:
        assert yaml.safe_load(f)["resolved"]["processes"] == 2


@pytest.mark.slow
def test_two_process_resume_repeats_the_same_steps(two_proc_run, tiny_model_dir, data_file, tmp_path):
    _, out, _ = two_proc_run
    again = tmp_path / "again"
    shutil.copytree(out, again)
    for name in os.listdir(again):  # as if killed after step 2: the later checkpoints never came
        if name.startswith("checkpoint-") and name != "checkpoint-2":
            shutil.rmtree(again / name)
    r = _cli(["--model", tiny_model_dir, "--data", data_file, "--output", str(again), "--nproc", "2",
              "--grad-accum", "1", *COMMON, "--resume"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resumed from step 2" in r.stdout
    assert _losses(again) == pytest.approx(_losses(out), rel=1e-5)
    a, b = _adapter(again), _adapter(out)
    for k in a:
        assert float((a[k] - b[k]).abs().max()) <= 1e-5 * max(1.0, float(b[k].abs().max()))


@pytest.mark.slow
def test_two_nodes_report_at_node_0_and_train_the_two_process_run(two_proc_run, tiny_model_dir, data_file, tmp_path):
    """Two `roctune train --nnodes 2` on one machine (one process each): node 0 says whom it waits for, node 1
    reports, then torchrun starts on the same port and they train the 2-process run's losses."""
    import time

    from roctune.hardware.network import free_port

    _, ddp_out, _ = two_proc_run
    out = tmp_path / "run"
    args = ["--model", tiny_model_dir, "--data", data_file, "--output", str(out), "--nproc", "1", "--nnodes", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--grad-accum", "1", *COMMON]
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    def node(rank):
        return subprocess.Popen([sys.executable, "-m", "roctune", "train", *args, "--node-rank", str(rank)],
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    first, seen, deadline = node(0), [], time.monotonic() + 120
    while time.monotonic() < deadline:  # node 1 starts once node 0 says it waits for it
        seen.append(first.stdout.readline())
        if "waiting for node(s) 1" in seen[-1] or not seen[-1]:
            break
    assert "node 0 of 2 (127.0.0.1:" in seen[-1] and "1 of 2 nodes here" in seen[-1], seen
    second = node(1)
    out1, _ = second.communicate(timeout=600)
    out0 = "".join(seen) + first.communicate(timeout=600)[0]
    assert first.returncode == 0 and second.returncode == 0, out0[-3000:] + out1[-3000:]
    assert "node 1 of 2 (127.0.0.1:" in out1 and "reporting to node 0" in out1
    assert "all 2 nodes are here; starting the processes" in out0 and "all 2 nodes are here" in out1
    assert _losses(out) == pytest.approx(_losses(ddp_out), rel=1e-5)


def test_a_node_alone_gives_up_after_the_rendezvous_timeout(capsys, monkeypatch, tmp_path, tiny_model_dir,
                                                              alpaca_file):
    """Node 0 of 2 with nobody coming: it says what it waits for and gives up with one line; nothing written."""
    from roctune.hardware.network import free_port

    _no_gpu(monkeypatch)
    out = tmp_path / "out"
    code = main(["train", "--model", tiny_model_dir, "--data", alpaca_file, "--output", str(out), "--device", "cpu",
                 "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
                 str(free_port()), "--rendezvous-timeout", "2"])
    printed = capsys.readouterr()
    lines = printed.err.strip().splitlines()
    assert code == 2 and len(lines) == 1, printed
    assert "node 0 of 2" in lines[0] and "node(s) 1 did not report within 2 s" in lines[0]
    assert "waiting for node(s) 1" in printed.out
    assert not out.exists()


@pytest.mark.slow
def test_fsdp_two_processes_on_cpu(two_proc_run, tiny_model_dir, data_file, tmp_path):
    """FSDP (fully_shard over gloo) trains the same adapter as the unsharded 2-process run."""
    _, ddp_out, _ = two_proc_run
    out = tmp_path / "fsdp"
    r = _cli(["--model", tiny_model_dir, "--data", data_file, "--output", str(out), "--nproc", "2", "--fsdp",
              "--grad-accum", "1", *COMMON], cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "FSDP: sharded model" in r.stdout
    assert _losses(out) == pytest.approx(_losses(ddp_out), rel=1e-4)
    a, b = _adapter(out), _adapter(ddp_out)
    assert sorted(a) == sorted(b)
    for k in a:
        assert float((a[k] - b[k]).abs().max()) <= 1e-5 * max(1.0, float(b[k].abs().max()))
    assert os.path.isfile(out / "checkpoint-2" / "adapter_model.safetensors")


PAIRS = [{"prompt": f"Question {i}?" + " Really." * (i % 3), "chosen": f"Answer {i}.", "rejected": "No."}
         for i in range(12)]


@pytest.mark.slow
def test_dpo_two_processes_follow_the_one_process_losses(tiny_model_dir, tmp_path):
    """DPO runs on the same engine: 2 processes (DDP, gloo) give the losses of one with twice the accumulation."""
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in PAIRS), encoding="utf-8")
    common = ["--model", tiny_model_dir, "--data", str(data), "--stage", "dpo", "--max-steps", "3", "--lr", "1e-2",
              "--lora-dropout", "0", "--device", "cpu", "--batch-size", "2", "--target-modules", "all-linear"]
    r = _cli([*common, "--output", str(tmp_path / "two"), "--nproc", "2", "--grad-accum", "1"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    from roctune.cli import build_parser
    from roctune.commands.train import config_from_args
    from roctune.recipes import train

    args = build_parser().parse_args(["train", *common, "--output", str(tmp_path / "one"), "--grad-accum", "2"])
    train(config_from_args(args), log=lambda *_: None, progress=False)
    two, one = _losses(tmp_path / "two"), _losses(tmp_path / "one")
    assert len(two) == len(one) == 3 and len(set(one)) == 3
    assert two == pytest.approx(one, rel=1e-4)


# ------------------------------------------------------------------------------------------ bad input
def _no_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def _one_gpu(monkeypatch):
    import torch

    import roctune.hardware.choices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(roctune.hardware.choices, "accelerator_name", lambda index=0: "Radeon Test (gfx1100)")


def _refused(capsys, args, out):
    code = main(["train", "--data", "DATA", "--output", str(out), *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not os.path.exists(out)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("roctune train: error: ")
    return lines[0]


@pytest.mark.parametrize("args, message", [
    (["--nproc", "0"], "nproc must be >= 1"),
    (["--nproc", "2", "--nnodes", "0"], "nnodes must be >= 1"),
    (["--nproc", "2", "--nnodes", "2", "--node-rank", "2"], "node-rank must be in 0..1"),
    (["--nproc", "2", "--nnodes", "2", "--node-rank", "1"], "--nnodes > 1 needs --master-addr"),
    (["--nproc", "2", "--master-port", "70000"], "--master-port must be <= 65535"),
    (["--fsdp"], "--fsdp shards the model over several processes"),
])
def test_bad_launch_flags(capsys, monkeypatch, tmp_path, alpaca_file, args, message):
    _no_gpu(monkeypatch)
    line = _refused(capsys, [*args, "--device", "cpu"], tmp_path / "out")
    assert message in line


def test_nproc_above_visible_gpus_is_refused_before_anything_is_written(capsys, monkeypatch, tmp_path):
    _one_gpu(monkeypatch)
    line = _refused(capsys, ["--nproc", "2", "--device", "cuda"], tmp_path / "out")
    assert "--nproc 2: only 1 GPU(s) visible" in line and "lower --nproc" in line


def test_nproc_without_gpu_needs_device_cpu(capsys, monkeypatch, tmp_path):
    _no_gpu(monkeypatch)
    line = _refused(capsys, ["--nproc", "2"], tmp_path / "out")
    assert "no GPU is visible" in line and "--device cpu" in line


def test_launch_validates_data_and_output_before_starting(capsys, monkeypatch, tmp_path, tiny_model_dir):
    """The launcher runs the same prepare() as one process: a bad record stops it, nothing is started."""
    _no_gpu(monkeypatch)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "hi"}\n', encoding="utf-8")
    from roctune.training import launch

    monkeypatch.setattr(launch, "launch", lambda cfg, say=print: pytest.fail("launched despite bad input"))
    out = tmp_path / "out"
    code = main(["train", "--model", tiny_model_dir, "--data", str(bad), "--output", str(out), "--nproc", "2",
                 "--device", "cpu"])
    assert code == 2 and not out.exists()
    assert "bad.jsonl" in capsys.readouterr().err


def test_launcher_command_single_and_multi_node():
    from roctune.config import TrainConfig
    from roctune.training.launch import launcher_command

    one = launcher_command(TrainConfig(nproc=4), "/tmp/c.yaml")
    assert one[1:3] == ["-m", "torch.distributed.run"]
    assert one[one.index("--nproc-per-node") + 1] == "4" and one[one.index("--master-addr") + 1] == "127.0.0.1"
    assert int(one[one.index("--master-port") + 1]) > 0
    assert one[-5:] == ["-m", "roctune", "train", "--config", "/tmp/c.yaml"]
    multi = launcher_command(TrainConfig(nproc=8, nnodes=2, node_rank=1, master_addr="10.0.0.1"), "/tmp/c.yaml")
    for flag, value in [("--nnodes", "2"), ("--node-rank", "1"), ("--master-addr", "10.0.0.1"), ("--master-port", "29500")]:
        assert multi[multi.index(flag) + 1] == value


def test_single_process_never_touches_torch_distributed(monkeypatch):
    from roctune.training import distributed

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    ctx = distributed.init("cpu")
    assert ctx is distributed.SINGLE and not ctx.enabled and ctx.is_main
    assert distributed.sum_numbers(ctx, [1.0, 2.0], "cpu") == [1.0, 2.0]
