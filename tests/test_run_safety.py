"""A run folder is never lost (issue 23): --overwrite builds the new run beside the old one and swaps it in only when
complete, a folder of other files is never replaced, one process at a time trains into a folder, what an
interrupted write left is removed by the next one, and a finished run can be continued with more steps."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from roctune import rundir
from roctune.cli import main
from roctune.config import TrainConfig
from roctune.recipes import train

from conftest import REPO, read_metrics, write_jsonl


def tiny_cfg(model_dir, data, out, **kw) -> TrainConfig:
    base = dict(data=[data], output=str(out), model=model_dir, max_steps=3, batch_size=2, grad_accum=1,
                max_length=64, lr=1e-2, lora_dropout=0.1, device="cpu", lr_scheduler="constant")
    base.update(kw)
    return TrainConfig(**base)


def quiet(cfg) -> dict:
    return train(cfg, log=lambda s: None, progress=False)


def tree(root) -> dict:
    """path -> sha256 of every file under root (a changed, new or missing file shows)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def adapter(run):
    from safetensors.torch import load_file

    return load_file(os.path.join(run, rundir.ADAPTER_WEIGHTS))


# ------------------------------------------------------------------------------------ continue a finished run
def test_a_finished_run_continues_with_more_steps(tiny_model_dir, alpaca_file, tmp_path):
    """--save-steps 2 --max-steps 2, then --resume --max-steps 4: the same 4 steps as one uninterrupted run
    (constant schedule, dropout 0.1: the RNG comes back from the final step's checkpoint)."""
    straight = tmp_path / "straight"
    quiet(tiny_cfg(tiny_model_dir, alpaca_file, straight, max_steps=4))
    out = tmp_path / "run"
    quiet(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=2, save_steps=2))
    assert rundir.list_checkpoints(str(out)) == [2]  # the last step is checkpointed
    with open(out / rundir.METRICS_FILE, "a") as f:  # damaged rows (a hand edit, another tool) are skipped
        f.write('[1, 2]\n{"step": "x", "loss": 1}\n"text"\n')
    lines = []
    train(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=4, save_steps=2, resume=True), log=lines.append,
          progress=False)
    assert "resumed from step 2" in lines
    assert [r["loss"] for r in read_metrics(out)] == pytest.approx([r["loss"] for r in read_metrics(straight)],
                                                                   abs=1e-6)
    a, b = adapter(out), adapter(straight)
    assert sorted(a) == sorted(b)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6


def test_resuming_a_complete_run_asks_for_more_steps(tiny_model_dir, alpaca_file, tmp_path, capsys):
    out = tmp_path / "run"
    quiet(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=2, save_steps=2))
    before = tree(out)
    code = main(["train", "--data", alpaca_file, "--output", str(out), "--model", tiny_model_dir, "--max-steps", "2",
                 "--save-steps", "2", "--resume", "--batch-size", "2", "--grad-accum", "1", "--max-length", "64",
                 "--lora-dropout", "0.1", "--lr-scheduler", "constant"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "already trained 2 of the 2 steps" in err[0] and "--max-steps" in err[0]
    assert tree(out) == before


def test_a_stop_during_the_final_save_is_finished_by_resume(tiny_model_dir, alpaca_file, tmp_path, capsys):
    """Killed while the final adapter was moving in (adapter_config.json goes in last, so it is missing): --resume
    with the same settings trains nothing again and saves the last checkpoint's weights as the final adapter."""
    from safetensors.torch import load_file

    out = tmp_path / "run"
    quiet(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=2, save_steps=2))
    trained = adapter(out)
    for name in (rundir.ADAPTER_CONFIG, rundir.ADAPTER_WEIGHTS, "tokenizer.json"):
        os.unlink(out / name)
    rundir.write_status(str(out), "stopped")
    code = main(["train", "--data", alpaca_file, "--output", str(out), "--model", tiny_model_dir, "--max-steps", "2",
                 "--save-steps", "2", "--resume", "--batch-size", "2", "--grad-accum", "1", "--max-length", "64",
                 "--lora-dropout", "0.1", "--lr-scheduler", "constant"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "finishing the final save" in printed.out + printed.err
    assert rundir.run_state(str(out)) == "done" and rundir.final_adapter_saved(str(out))
    assert os.path.isfile(out / "tokenizer.json")
    ckpt = load_file(os.path.join(rundir.checkpoint_dir(str(out), 2), rundir.ADAPTER_WEIGHTS))
    final = adapter(out)
    assert sorted(final) == sorted(trained) and all(bool((final[k] == trained[k]).all()) for k in final)
    assert all(bool((ckpt[k] == final[k]).all()) for k in ckpt)
    assert [r["step"] for r in read_metrics(out)] == [1, 2]  # nothing trained or logged again


# ------------------------------------------------------------------------------------------ --overwrite
def test_overwrite_swaps_in_a_complete_run(tiny_model_dir, alpaca_file, tmp_path):
    out = tmp_path / "run"
    quiet(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=2, save_steps=1))
    lines = []
    summary = train(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=3, overwrite=True, lora_r=4),
                    log=lines.append, progress=False)
    assert summary["output"] == str(out)
    assert any("replaces" in line and rundir.STAGING_PREFIX in line for line in lines)
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    assert rundir.list_checkpoints(str(out)) == []  # nothing of the old run is left in the new one
    assert rundir.read_run(str(out))["config"]["output"] == str(out)
    assert json.load(open(out / rundir.ADAPTER_CONFIG))["r"] == 4
    assert sorted(os.listdir(tmp_path)) == ["alpaca.jsonl", "run"]  # no staging folder, no lock file


def test_every_file_of_a_run_is_roctunes_own(tiny_model_dir, alpaca_file, tmp_path):
    """What --overwrite may replace: a run with checkpoints, evaluation, the kept best weights and TensorBoard
    events holds only names foreign_entries knows."""
    out = tmp_path / "run"
    quiet(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=4, save_steps=2, eval_ratio=0.25, eval_steps=2,
                   load_best=True, report_to=["tensorboard"]))
    assert {"best", "tensorboard", "checkpoint-4"} <= set(os.listdir(out))
    assert rundir.foreign_entries(str(out)) == []
    (out / "notes.txt").write_text("mine")
    assert rundir.foreign_entries(str(out)) == ["notes.txt"]


def test_a_full_disk_during_overwrite_keeps_the_old_run(tiny_model_dir, alpaca_file, tmp_path, capsys,
                                                        monkeypatch):
    out = tmp_path / "run"
    quiet(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=2))
    before = tree(out)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / rundir.ADAPTER_WEIGHTS))

    monkeypatch.setattr(rundir, "move_files_into", full)
    code = main(["train", "--data", alpaca_file, "--output", str(out), "--model", tiny_model_dir, "--max-steps", "2",
                 "--overwrite", "--max-length", "64"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no space left" in err[0], err
    assert tree(out) == before
    assert sorted(os.listdir(tmp_path)) == ["alpaca.jsonl", "run"]


def test_a_full_disk_during_merge_is_one_line_and_leaves_nothing(tiny_model_dir, alpaca_file, tmp_path, capsys,
                                                                 monkeypatch):
    import transformers

    run = tmp_path / "run"
    quiet(tiny_cfg(tiny_model_dir, alpaca_file, run, max_steps=1))
    before = tree(run)

    def full(self, folder, *a, **k):  # half a file written, then the disk is full
        open(os.path.join(folder, "model.safetensors"), "wb").write(b"\0" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device", os.path.join(folder, "model.safetensors"))

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", full)
    code = main(["merge", "--adapter", str(run), "--output", str(tmp_path / "merged")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no space left on the device" in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["alpaca.jsonl", "run"]  # no merged folder, no hidden .tmp-* beside it
    assert tree(run) == before


def _start(argv, cwd):
    """roctune in a child process that Ctrl-C reaches: a suite started in the background (`make test &`) inherits
    SIGINT ignored, which the child's Python would keep, and the test's SIGINT would then be lost."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "roctune", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _kill_when(proc, trigger, sig) -> str:
    """Send `sig` to the process as soon as `trigger(output so far)` holds (checked every 10 ms, so a moment seen in
    the file system is caught too); returns all its output."""
    import threading

    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(proc.stdout), daemon=True)
    reader.start()
    while proc.poll() is None:
        if trigger("".join(seen)):
            proc.send_signal(sig)
            break
        time.sleep(0.01)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    return "".join(seen)


@pytest.mark.slow
def test_overwrite_killed_at_any_moment_leaves_the_old_run_or_the_new_one(tiny_model_dir, alpaca_file, tmp_path):
    out = tmp_path / "run"
    quiet(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=2, save_steps=2))
    old = tree(out)
    argv = ["train", "--data", alpaca_file, "--output", str(out), "--model", tiny_model_dir, "--overwrite",
            "--max-steps", "30", "--save-steps", "10", "--batch-size", "2", "--grad-accum", "1", "--max-length", "64",
            "--lora-r", "4"]
    staging = rundir.staging_path(str(out))
    moments = [
        ("after the checks", lambda text: "--overwrite: building" in text, signal.SIGINT),
        ("after loading", lambda text: "trainable parameters" in text, signal.SIGTERM),
        ("mid-training", lambda text: os.path.isdir(os.path.join(staging, "checkpoint-10")), signal.SIGKILL),
        ("while saving", lambda text: "saving the final model" in text, signal.SIGKILL),
    ]
    outcomes = []
    for what, trigger, sig in moments:
        log = _kill_when(_start(argv, tmp_path), trigger, sig)
        now = tree(out)
        if now == old:
            outcomes.append("old")
        else:  # the new run, complete: all its steps, its adapter, run.yaml naming its own folder
            assert [r["step"] for r in read_metrics(out)] == list(range(1, 31)), (what, log[-2000:])
            assert json.load(open(out / rundir.ADAPTER_CONFIG))["r"] == 4
            assert rundir.read_run(str(out))["config"]["output"] == str(out)
            outcomes.append("new")
            old = now
        if sig != signal.SIGKILL:  # the cleanups ran: no staging folder, no lock file
            assert sorted(os.listdir(tmp_path)) == ["alpaca.jsonl", "run"], (what, log[-2000:])
    assert outcomes[:3] == ["old", "old", "old"]
    # the next start removes what the killed one left, and completes
    log = _kill_when(_start(argv, tmp_path), lambda line: False, signal.SIGINT)
    assert [r["step"] for r in read_metrics(out)] == list(range(1, 31)), log[-2000:]
    assert sorted(os.listdir(tmp_path)) == ["alpaca.jsonl", "run"]


# ------------------------------------------------------------------------------------------------- locks
def test_a_second_training_into_a_busy_folder_is_refused(tiny_model_dir, alpaca_file, tmp_path, capsys):
    out = tmp_path / "run"
    with rundir.locked(str(out)):
        code = main(["train", "--data", alpaca_file, "--output", str(out), "--model", tiny_model_dir,
                     "--max-steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"another roctune process (pid {os.getpid()})" in err[0] and "--output" in err[0]
    assert not out.exists()


def test_a_stale_lock_is_taken_over(tiny_model_dir, alpaca_file, tmp_path):
    """A lock file whose holder died (no flock on it) does not block the next run."""
    out = tmp_path / "run"
    with open(rundir.lock_path(str(out)), "w") as f:
        f.write("999999999")
    quiet(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=1))
    assert rundir.is_run_dir(str(out)) and not os.path.exists(rundir.lock_path(str(out)))


def test_lock_holder_can_take_it_again_after_release(tmp_path):
    out = str(tmp_path / "run")
    for _ in range(2):
        with rundir.locked(out):
            assert open(rundir.lock_path(out)).read() == str(os.getpid())
    assert not os.path.exists(rundir.lock_path(out))


# ------------------------------------------------------------------------------- what killed writes left
def test_the_next_write_removes_what_a_killed_writer_left(tmp_path):
    target = tmp_path / "merged"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    left = tmp_path / f".tmp-merged.{dead}-abc"
    left.mkdir()
    (left / "model.safetensors").write_bytes(b"x" * 1000)
    busy = tmp_path / f".tmp-merged.{os.getpid()}-live"  # a writer that is still running: kept
    busy.mkdir()
    other = tmp_path / f".tmp-other.{dead}-abc"  # another target's: not this write's business
    other.mkdir()
    rundir.write_dir_atomically(str(target), lambda d: open(os.path.join(d, "f"), "w").close())
    assert sorted(os.listdir(tmp_path)) == sorted([busy.name, other.name, "merged"])


def test_sigterm_runs_the_commands_cleanups():
    """The CLI turns SIGTERM into the Ctrl-C path, so `finally` blocks (staging and temporary folders) run."""
    code = ("import os, signal, sys\n"
            "from roctune import cli\n"
            "def run(args):\n"
            "    try:\n"
            "        os.kill(os.getpid(), signal.SIGTERM)\n"
            "        import time; time.sleep(10)\n"
            "    finally:\n"
            "        print('cleanup ran')\n"
            "import roctune.commands.doctor as d\n"
            "d.run = run\n"
            "sys.exit(cli.main(['doctor']))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert "cleanup ran" in r.stdout, r.stderr
    assert r.returncode == 130 and "interrupted" in r.stderr


@pytest.mark.parametrize("ignores_sigterm, ended_by", [(False, signal.SIGTERM), (True, signal.SIGKILL)])
def test_a_stop_is_passed_on_to_a_child(ignores_sigterm, ended_by):
    """roctune.interrupts.end_child (how `roctune serve --engine vllm` stops vLLM): SIGTERM, and SIGKILL for a child
    that ignores it."""
    from roctune.interrupts import end_child

    code = ("import signal, time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignores_sigterm else "")
            + "print('ready', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    with proc.stdout:
        assert proc.stdout.readline() == "ready\n"  # its own signal handling is in place
        end_child(proc, grace=2)
    assert proc.returncode == -ended_by


def test_sigterm_during_merge_leaves_no_hidden_folder(tiny_model_dir, alpaca_file, tmp_path):
    """SIGTERM arrives while merge writes its weights: nothing is left beside the target (before, a 166 MB .tmp-*)."""
    run = tmp_path / "run"
    quiet(tiny_cfg(tiny_model_dir, alpaca_file, run, max_steps=1))
    code = ("import os, signal, sys, time\n"
            "import transformers\n"
            "from roctune import cli\n"
            "def slow_save(self, folder, *a, **k):\n"
            "    open(os.path.join(folder, 'model.safetensors'), 'wb').write(b'0' * 100000)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(30)\n"
            "transformers.PreTrainedModel.save_pretrained = slow_save\n"
            f"sys.exit(cli.main(['merge', '--adapter', {str(run)!r}, '--output', {str(tmp_path / 'merged')!r}]))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 130 and "interrupted" in r.stderr, r.stderr[-2000:]
    assert sorted(os.listdir(tmp_path)) == ["alpaca.jsonl", "run"]


# ----------------------------------------------------------------------------------------- device RNG
def test_checkpoints_keep_the_gpus_rng_state(tiny_model_dir, alpaca_file, tmp_path, monkeypatch):
    """On a GPU, dropout draws from torch.cuda's generator: it goes into the checkpoint and comes back (a stand-in
    torch.cuda here, the CPU machine has none; the H200 check runs the real one)."""
    import torch

    from roctune.training import checkpoint

    state = {"rng": torch.tensor([1, 2, 3], dtype=torch.uint8)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: state["rng"].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda t: state.update(rng=t.clone()))
    out = tmp_path / "run"
    quiet(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=2, save_steps=2))
    saved = rundir.read_state(rundir.checkpoint_dir(str(out), 2))
    assert saved["device_rng"][0].tolist() == [1, 2, 3]
    state["rng"] = torch.tensor([9, 9, 9], dtype=torch.uint8)
    lines = []
    train(tiny_cfg(tiny_model_dir, alpaca_file, out, max_steps=3, save_steps=2, resume=True), log=lines.append,
          progress=False)
    assert "resumed from step 2" in lines
    assert state["rng"].tolist() == [1, 2, 3]


def test_data_lines_longer_than_the_limit_are_one_error(tmp_path, monkeypatch):
    from roctune.data import readers
    from roctune.errors import DataError

    monkeypatch.setattr(readers, "MAX_RECORD_BYTES", 1000)
    path = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "q", "output": "a"}])
    with open(path, "a") as f:
        f.write('{"instruction": "' + "x" * 5000 + '", "output": "a"}\n')
    with pytest.raises(DataError, match=r"d.jsonl:2: longer than"):
        list(readers.iter_raw(path))


# ------------------------------------------------------------------------------------ a run moved to another machine
def test_adapter_config_names_the_base_as_given_and_run_yaml_keeps_the_local_path(tiny_model_dir, alpaca_file,
                                                                                 tmp_path, monkeypatch):
    """adapter_config.json is what plain PEFT reads on another machine: it names the base as the user gave it (here
    a relative folder), while run.yaml keeps the absolute path roctune's own commands load."""
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "models" / "tiny")
    monkeypatch.chdir(tmp_path)
    quiet(tiny_cfg("models/tiny", alpaca_file, tmp_path / "run", max_steps=1))
    config = json.load(open(tmp_path / "run" / rundir.ADAPTER_CONFIG))
    assert config["base_model_name_or_path"] == "models/tiny"
    assert rundir.base_model(str(tmp_path / "run")) == str(tmp_path / "models" / "tiny")


def test_portable_base_names():
    import types

    from roctune.models import DEFAULT_HUB_ID
    from roctune.training.session import portable_base

    def cfg(model, adapter=None):
        return types.SimpleNamespace(model=model, adapter=adapter)

    assert portable_base(cfg(None), "/home/u/.cache/roctune/models/SmolLM2-135M-Instruct") == DEFAULT_HUB_ID
    assert portable_base(cfg("default"), "/x") == DEFAULT_HUB_ID
    assert portable_base(cfg("Qwen/Qwen2.5-0.5B-Instruct"), "/cache/q") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert portable_base(cfg("~/m/base.gguf"), "/cache/models/base") == "/cache/models/base"  # PEFT loads no GGUF
