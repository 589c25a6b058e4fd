"""Hostile input, round three (issue 37), the command-line half: reward files that exit, raise or return what is
not a number; weights whose sum overflows; a GRPO run that fails at its first step; and the tracebacks and silent
acceptances the issue lists. Each case: exit 2, one line on stderr naming the file, field or flag, no traceback,
nothing written or changed, no code from a model folder or a pickle run (tests/test_hostile.py's `refused`).
Most cases fail before any model loads; the few that need one use the tiny model."""
from __future__ import annotations

import io
import json
import math
import os
import shutil
import sys

import pytest

from roctune.cli import main
from test_hostile import MARKER, Payload, refused

REWARD_FILES = {
    "exit0_import.py": "import sys\nsys.exit(0)\ndef r(completions, **k):\n    return [1.0] * len(completions)\n",
    "exit3_import.py": "raise SystemExit(3)\n",
    "raise_import.py": "import nosuchmodule_roctune\n",
    "exit0_call.py": "import sys\ndef r(completions, **k):\n    sys.exit(0)\n",
    "ok.py": "def r(completions, **k):\n    return [1.0] * len(completions)\n",
    "nothing.py": "def r(completions, **k):\n    return [None] * len(completions)\n",
}


def _adapter(folder, tiny: str, change: dict | None = None, run_yaml: str | None = None) -> None:
    """A LoRA adapter for the tiny model (rank 2 on q_proj, zero weights), its adapter_config.json changed."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir()
    doc = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"], "task_type": "CAUSAL_LM",
           "base_model_name_or_path": tiny}
    doc.update(change or {})
    (folder / "adapter_config.json").write_text(json.dumps(doc))  # json writes inf as Infinity, as a hand edit may
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file({f"{prefix}.lora_A.weight": torch.zeros(2, 64), f"{prefix}.lora_B.weight": torch.zeros(64, 2)},
              str(folder / "adapter_model.safetensors"))
    if run_yaml is not None:
        (folder / "run.yaml").write_text(run_yaml)


def _model_copy(folder, tiny: str, config: dict | None = None, tokenizer_config: dict | None = None) -> None:
    shutil.copytree(tiny, folder)
    for name, change in (("config.json", config), ("tokenizer_config.json", tokenizer_config)):
        if change:
            doc = json.loads((folder / name).read_text())
            doc.update(change)
            (folder / name).write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model_dir):
    """The working folder: data, reward files, damaged adapters and model folders (w/), a marker's place above.
    Made once for the module: every case checks that it changes nothing in it."""
    import torch

    tmp_path = tmp_path_factory.mktemp("hostile_cli")
    w = tmp_path / "w"
    w.mkdir()
    tiny = str(tiny_model_dir)
    rows = "".join(json.dumps({"instruction": f"q{i}", "output": f"a{i}"}) + "\n" for i in range(4))
    (w / "d.jsonl").write_text(rows)
    (w / "p.jsonl").write_text("".join(json.dumps({"prompt": f"Say {i}.", "answer": str(i)}) + "\n"
                                       for i in range(4)))
    (w / "noanswer.jsonl").write_text("".join(json.dumps({"prompt": f"Say {i}."}) + "\n" for i in range(4)))
    (w / "surrogate.jsonl").write_text('{"instruction": "a\\ud800b", "output": "x"}\n')
    for name, text in REWARD_FILES.items():
        (w / name).write_text(text)
    (w / "outdir").mkdir()
    _adapter(w / "ok_ad", tiny)
    for name, entry in (("lfcols", {"columns": ["a", "b"]}), ("lftags", {"formatting": "sharegpt", "tags": ["x"]})):
        (w / name).mkdir()  # a LLaMA-Factory data folder whose dataset_info.json gives lists for objects
        (w / name / "d.jsonl").write_text(rows)
        (w / name / "dataset_info.json").write_text(json.dumps({"ds": {"file_name": "d.jsonl", **entry}}))
    bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9))
    for name, value in (("by_list", "[a, b]"), ("by_int", "5"), ("by_bomb", "*a8")):
        _adapter(w / name, tiny, run_yaml=(bomb if name == "by_bomb" else "") + f"base_model: {value}\nconfig: {{}}\n")
    _adapter(w / "missing_mod", tiny, {"target_modules": ["nonexistent_proj"]})
    _adapter(w / "bad_rank_pattern", tiny, {"rank_pattern": {"(": 4}})
    _adapter(w / "int_targets", tiny, {"target_modules": [1, 2]})
    _adapter(w / "str_alpha", tiny, {"lora_alpha": "four"})
    _adapter(w / "inf_alpha_pattern", tiny, {"alpha_pattern": {"q_proj": math.inf}})
    _model_copy(w / "badtok", tiny)
    (w / "badtok" / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": 5}}')
    _model_copy(w / "automap", tiny, tokenizer_config={"tokenizer_class": None,
                                                       "auto_map": {"AutoTokenizer": ["evil.EvilTok", None]}})
    (w / "automap" / "evil.py").write_text(f"open({str(tmp_path / MARKER)!r}, 'w').close()\n")
    (w / "pickled").mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tiny, name), w / "pickled" / name)
    torch.save({"w": Payload(str(tmp_path / MARKER))}, str(w / "pickled" / "pytorch_model.bin"))
    for name, change in (("vocab_text", {"vocab_size": "lots"}), ("hidden_negative", {"hidden_size": -1}),
                         ("hidden_fraction", {"hidden_size": 1.5})):
        (w / name).mkdir()
        doc = json.loads((w / "badtok" / "config.json").read_text())  # the tiny model's
        doc.update(change)
        (w / name / "config.json").write_text(json.dumps(doc))
    return {"dir": w, "tiny": tiny}


@pytest.fixture
def ws(files, monkeypatch):
    monkeypatch.chdir(files["dir"])
    return files


GRPO = "train --stage grpo --data p.jsonl --output outdir/r --num-generations 2 --batch-size 2 --max-steps 1"
# (case id, argv, what the one line must name). TINY: the tiny model. `--model nowhere` where a case must be
# refused before the model is even looked for.
CASES = {
    "train": [
        ("reward-exit0-at-import", f"{GRPO} --model nowhere --reward-file exit0_import.py", "exit0_import.py"),
        ("reward-exit3-at-import", f"{GRPO} --model nowhere --reward-file exit3_import.py", "sys.exit(3)"),
        ("reward-import-error", f"{GRPO} --model nowhere --reward-file raise_import.py", "ModuleNotFoundError"),
        ("reward-weights-overflow", f"{GRPO} --model nowhere --reward length --reward-file ok.py "
         "--reward-weights 1e308 1e308", "--reward-weights"),
        ("answer-column-missing", "train --stage grpo --data noanswer.jsonl --output outdir/r --model nowhere "
         "--reward answer", "noanswer.jsonl:1"),
        ("data-lone-surrogate", "train --data surrogate.jsonl --output outdir/r --model nowhere",
         "surrogate.jsonl:1"),
        ("model-pickle-only", "train --data d.jsonl --output outdir/r --model pickled", "pytorch_model.bin"),
    ],
    "eval": [
        ("reward-exit0-at-import", "eval --adapter ok_ad --data p.jsonl --reward-file exit0_import.py",
         "exit0_import.py"),
        ("reward-output-ignored", "eval --adapter ok_ad --data p.jsonl --reward length --output outdir/e",
         "--output"),
        ("reward-tasks-ignored", "eval --adapter ok_ad --data p.jsonl --reward length --tasks hellaswag",
         "--tasks"),
        ("reward-answer-column", "eval --adapter ok_ad --data noanswer.jsonl --reward answer", "noanswer.jsonl:1"),
    ],
    "generate": [
        ("run-yaml-base-model-list", "generate --prompt hi --adapter by_list", "by_list/run.yaml: base_model"),
        ("run-yaml-base-model-int", "generate --prompt hi --adapter by_int", "by_int/run.yaml: base_model"),
        ("run-yaml-base-model-bomb", "generate --prompt hi --adapter by_bomb", "by_bomb/run.yaml:"),  # the anchor bomb: strict_yaml refuses its expansion
        ("tokenizer-malformed", "generate --prompt hi --model badtok", "badtok/tokenizer.json"),
        ("tokenizer-auto-map", "generate --prompt hi --model automap", "--trust-remote-code"),
        ("model-pickle-only", "generate --prompt hi --model pickled", "pickled/pytorch_model.bin"),
        ("prompt-not-utf8", "generate --prompt caf\udce9 --model TINY", "--prompt"),
        ("adapter-alpha-text", "generate --prompt hi --adapter str_alpha", "lora_alpha"),
    ],
    "merge": [
        ("run-yaml-base-model-list", "merge --adapter by_list --output outdir/m", "base_model"),
        ("adapter-targets-integers", "merge --adapter int_targets --output outdir/m", "target_modules"),
    ],
    "export": [
        ("lora-gguf-bad-rank-pattern", "export --adapter bad_rank_pattern --output outdir/e --format lora-gguf",
         "rank_pattern"),
        ("lora-gguf-integer-targets", "export --adapter int_targets --output outdir/e --format lora-gguf",
         "target_modules"),
        ("lora-gguf-text-alpha", "export --adapter str_alpha --output outdir/e --format lora-gguf", "lora_alpha"),
        ("lora-gguf-infinite-alpha-pattern", "export --adapter inf_alpha_pattern --output outdir/e "
         "--format lora-gguf", "alpha_pattern"),
        ("lora-gguf-quant", "export --adapter ok_ad --output outdir/e --format lora-gguf --quant q4_k_m", "--quant"),
        ("run-yaml-base-model-int", "export --adapter by_int --output outdir/e", "base_model"),
    ],
    "data": [
        ("preview-lone-surrogate", "data preview surrogate.jsonl", "surrogate.jsonl:1"),
        ("dataset-info-columns-list", "data check lfcols:ds", "lfcols/dataset_info.json: dataset 'ds'"),
        ("dataset-info-tags-list", "data check lftags:ds", "lftags/dataset_info.json: dataset 'ds'"),
        ("preview-model-not-a-model", "data preview d.jsonl --model /etc", "/etc"),
        ("preview-model-malformed-tokenizer", "data preview d.jsonl --model badtok", "badtok/tokenizer.json"),
    ],
    "estimate": [
        ("vocab-size-text", "estimate --no-detect --model vocab_text", "vocab_size"),
        ("hidden-size-negative", "estimate --no-detect --model hidden_negative", "hidden_size"),
        ("hidden-size-fraction", "estimate --no-detect --model hidden_fraction", "hidden_size"),
        ("lora-r-huge", "estimate --no-detect --model TINY --lora-r 1000000000000000000000000000000", "--lora-r"),
    ],
    "serve": [
        ("vllm-python-not-python", "serve --engine vllm --vllm-python /bin/true --model TINY", "--vllm-python"),
    ],
}
PARAMS = [pytest.param(cmd, argv, names, id=f"{cmd}-{cid}") for cmd, cases in CASES.items()
          for cid, argv, names in cases]


@pytest.mark.parametrize("command, argv, names", PARAMS)
def test_refused_cleanly(ws, capsys, command, argv, names):
    refused([a.replace("TINY", ws["tiny"]) for a in argv.split()], capsys, names)


# ------------------------------------------------------------------------- cases where the tiny model loads
def test_adapter_for_another_model_is_one_line(ws, capsys):
    refused(["generate", "--prompt", "hi", "--adapter", "missing_mod"], capsys, "target_modules")


def test_chat_stdin_bytes_that_are_not_utf8(ws, capsys, monkeypatch):
    """Standard input decoded as Python does in a C locale (surrogateescape): the bytes arrive as lone surrogates."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"caf\xe9\n"), encoding="utf-8",
                                                       errors="surrogateescape"))
    refused(["chat", "--model", ws["tiny"], "--max-new-tokens", "2"], capsys, "stdin line 1")


def _disk_full(monkeypatch, error: str) -> None:
    """Every safetensors write fails as on a full disk: as safetensors reports it (its own error type, 'os error
    28'), or as an OSError(ENOSPC)."""
    import errno

    import safetensors.torch
    from safetensors import SafetensorError

    def full(*_a, **_k):
        if error == "safetensors":
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(safetensors.torch, "serialize_file", full)


@pytest.mark.parametrize("error", ["safetensors", "oserror"])
@pytest.mark.parametrize("argv", [["merge", "--adapter", "ok_ad", "--output", "outdir/m"],
                                  ["export", "--adapter", "ok_ad", "--output", "outdir/e", "--no-verify"]],
                         ids=["merge", "export"])
def test_disk_full_is_one_line_and_leaves_nothing(ws, capsys, monkeypatch, argv, error):
    _disk_full(monkeypatch, error)
    line = refused(argv, capsys, "no space left on the device")
    assert "free some space" in line


def _one_line(argv: list[str], capsys, names: str) -> str:
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "Traceback" not in err[0] and names in err[0], (rc, err)
    return err[0]


@pytest.mark.parametrize("error", ["safetensors", "oserror"])
def test_disk_full_at_the_final_save(files, tmp_path, monkeypatch, capsys, error):
    """The run is recorded as failed with the reason (what the web UI shows); having saved nothing, it is
    replaced by the same command run again, once there is space."""
    from roctune import rundir

    monkeypatch.chdir(tmp_path)
    shutil.copy(files["dir"] / "d.jsonl", "d.jsonl")
    argv = ["train", "--data", "d.jsonl", "--output", "r", "--model", files["tiny"], "--max-steps", "1",
            "--max-length", "64"]
    with monkeypatch.context() as m:
        _disk_full(m, error)
        _one_line(argv, capsys, "no space left on the device")
    assert rundir.run_state("r") == "failed" and rundir.is_unsaved_ended_run("r")
    assert main(argv) == 0 and rundir.has_adapter("r") and rundir.run_state("r") == "done"


# --------------------------------------------------------------------------- reward functions, one guard
def _reward(tmp_path, body: str, name: str = "r"):
    from roctune.eval import rewards as rw

    path = tmp_path / "user_reward.py"
    path.write_text(body)
    (fn,) = rw.load_reward_file(f"{path}:{name}")
    return fn, str(path)


GENERATOR = "def r(completions, **k):\n    yield 1.0\n    raise ValueError('boom')\n"
BAD_FLOAT = ("class X:\n    def __float__(self):\n        raise RuntimeError('no')\n"
             "def r(completions, **k):\n    return [X(), X()]\n")
RETURNS = [
    ("exit-0", "import sys\ndef r(completions, **k):\n    sys.exit(0)\n", r"called sys\.exit\(0\)"),
    ("exit-3", "def r(completions, **k):\n    raise SystemExit(3)\n", r"called sys\.exit\(3\)"),
    ("exit-none", "import sys\ndef r(completions, **k):\n    sys.exit()\n", r"called sys\.exit\(\);"),
    ("str-raises", "class E(Exception):\n    def __str__(self):\n        raise RuntimeError('x')\n"
     "def r(completions, **k):\n    raise E()\n", "raised E$"),
    ("base-exception", "def r(completions, **k):\n    raise GeneratorExit('x')\n", "raised GeneratorExit"),
    ("huge-integer", "def r(completions, **k):\n    return [10**400, 1]\n", "an integer of about 401 digits"),
    ("generator-raises", GENERATOR, "raised ValueError: boom"),
    ("float-raises", BAD_FLOAT, "raised RuntimeError: no"),
    ("nan", "def r(completions, **k):\n    return [float('nan'), 1]\n", "finite"),
    ("text", "def r(completions, **k):\n    return ['1.0', 1]\n", "str '1.0' for completion 0"),
    ("one-value", "def r(completions, **k):\n    return 1.0\n", "returned float"),
    ("dict", "def r(completions, **k):\n    return {'a': 1, 'b': 2}\n", "returned dict"),
    ("too-few", "def r(completions, **k):\n    return [1.0]\n", "returned 1 values for 2"),
    ("endless", "import itertools\ndef r(completions, **k):\n    return itertools.repeat(1.0)\n",
     "more than 2 values"),
]


@pytest.mark.parametrize("body, message", [pytest.param(b, m, id=i) for i, b, m in RETURNS])
def test_reward_call_refuses_in_one_line_naming_file_and_function(tmp_path, body, message):
    from roctune.errors import RewardError
    from roctune.eval import rewards as rw

    fn, path = _reward(tmp_path, body)
    with pytest.raises(RewardError, match=message) as e:
        rw.call(fn, 2, completions=["a", "b"])
    assert f"reward function 'r' ({path})" in str(e.value) and "\n" not in str(e.value)


def test_reward_values_that_are_numbers_pass(tmp_path):
    import numpy as np

    from roctune.eval import rewards as rw

    fn, _ = _reward(tmp_path, "import numpy as np\ndef r(completions, **k):\n    return (x for x in "
                              "[np.float32(0.5), True, None])\n")
    got = rw.call(fn, 3, completions=["a", "b", "c"])
    assert got[:2] == [0.5, 1.0] and math.isnan(got[2])
    assert np.isfinite(got[:2]).all()


def test_ctrl_c_in_a_reward_function_is_not_swallowed(tmp_path):
    from roctune.eval import rewards as rw

    fn, _ = _reward(tmp_path, "def r(completions, **k):\n    raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        rw.call(fn, 1, completions=["a"])


def test_weighted_sum_beyond_float32_is_refused():
    from roctune.errors import RewardError
    from roctune.eval import rewards as rw

    funcs = [rw.Reward("a", None, 1e38), rw.Reward("b", None, 1e38)]
    assert rw.combine([[1.0, float("nan")], [1.0, float("nan")]], funcs)[0] == 2e38
    with pytest.raises(RewardError, match="completion 0 is 10 x 1e"):
        rw.combine([[10.0], [1.0]], funcs)


@pytest.mark.parametrize("mode, warned", [(0o777, "the folder"), (0o1777, None), ("file", "the file")])
def test_reward_file_others_could_replace_is_named(tmp_path, caplog, mode, warned):
    from roctune.eval import rewards as rw

    folder = tmp_path / "shared"
    folder.mkdir()
    path = folder / f"rw_{oct(mode) if mode != 'file' else 'file'}.py"
    path.write_text(REWARD_FILES["ok.py"])
    folder.chmod(0o755 if mode == "file" else mode)
    if mode == "file":
        path.chmod(0o666)
    caplog.set_level("WARNING", logger="roctune.eval.rewards")
    rw.load_reward_file(str(path))
    lines = [r.getMessage() for r in caplog.records if r.name == "roctune.eval.rewards"]
    if warned is None:  # a sticky folder (like /tmp): only the file's owner, this user, can replace it
        assert lines == []
    else:
        assert len(lines) == 1 and str(path) in lines[0] and warned in lines[0], lines


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_reward_file_of_another_user_in_a_sticky_folder_is_named(tmp_path):
    from roctune.eval import rewards as rw

    folder = tmp_path / "tmpish"
    folder.mkdir()
    path = folder / "theirs.py"
    path.write_text(REWARD_FILES["ok.py"])
    os.chown(path, 4242, 4242)
    folder.chmod(0o1777)
    assert "belongs to another user (uid 4242)" in rw.replaceable_by_others(str(path))


# ------------------------------------------------------------------------ files that must stay valid JSON
def test_metrics_rows_are_strict_json():
    from roctune import rundir

    line = rundir.json_line({"step": 1, "reward": float("-inf"), "loss": float("nan"), "x": [float("inf"), 1.5]})
    strict = json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert strict == {"step": 1, "reward": None, "loss": None, "x": [None, 1.5]}


def test_data_weights_whose_sum_overflows_are_ratios():
    from roctune.data.records import mix

    got = mix([list("aaaa"), list("bbbb")], [1e308, 1e308], seed=0)
    assert sorted(got) == list("aaaabbbb")


# ----------------------------------------------------------------------- GRPO: a run that fails at step 1
@pytest.mark.slow
def test_grpo_failing_at_step_one_is_started_again_by_the_same_command(files, tmp_path, monkeypatch, capsys):
    """A reward that calls sys.exit(0) at the first step: one line, exit 2, the run recorded as failed with that
    line's reason, and the same command is refused for the same reason again (not "already holds a previous
    run"); then a reward that scores nothing (None: NaN totals) trains there, and metrics.jsonl is strict JSON."""
    from roctune import rundir

    w = tmp_path / "w"
    w.mkdir()
    (w / "outdir").mkdir()
    for name in ("p.jsonl", "exit0_call.py", "nothing.py"):
        shutil.copy(files["dir"] / name, w / name)
    monkeypatch.chdir(w)
    ws = {"dir": w, "tiny": files["tiny"]}
    argv = ["train", "--stage", "grpo", "--data", "p.jsonl", "--output", "outdir/r", "--model", ws["tiny"],
            "--num-generations", "2", "--batch-size", "2", "--max-steps", "1", "--max-completion-length", "3",
            "--max-length", "64", "--device", "cpu"]
    for _ in range(2):
        line = _one_line(argv + ["--reward-file", "exit0_call.py"], capsys, "reward function 'r' (exit0_call.py)")
        assert "sys.exit(0)" in line
        assert rundir.read_status("outdir/r")["phase"] == "failed"
        assert "sys.exit(0)" in rundir.read_status("outdir/r")["error"] and rundir.is_unsaved_ended_run("outdir/r")
    assert main(argv + ["--reward-file", "nothing.py"]) == 0
    text = (ws["dir"] / "outdir" / "r" / "metrics.jsonl").read_text()
    rows = [json.loads(x, parse_constant=lambda c: pytest.fail(f"{c} in metrics.jsonl")) for x in text.splitlines()]
    assert rows and rows[0]["step"] == 1


def test_count_per_command():
    """The issue asks for every case as a test; the note gives the count per command."""
    counts = {cmd: len(cases) for cmd, cases in CASES.items()}
    assert sum(counts.values()) >= 35
