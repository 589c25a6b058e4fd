"""Hostile GGUF files and chat templates (issue 46): `--model FILE.gguf` with a template that never returns, writes
without end, raises or reaches outside the sandbox, a broken header (truncated, 2^62 counts, a 2^60-byte string)
or metadata that contradicts itself (token ids past the vocabulary, 0 heads, vocab_size 10, block_count 1000 over
one block of tensors, a matrix of the wrong size). `data preview`, `train` and `serve` each refuse to start with
one line naming the file and exit 2: no traceback, no hang (each run is killed after a timeout), nothing written
under $ROCTUNE_HOME/models or in the working folder, no code run. The files are written by tests/hostile_gguf.py."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from hostile_gguf import CASES, COMMANDS, HUGE, prepare, problem, run_cases, write_gguf

TIMEOUT = 120  # seconds a case may take before it counts as a hang (a refusal takes well under one)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{"case/command": (its run, its folders)}: every case under every command, run once by one driver process
    (well under a second a case)."""
    cases, folders = prepare(tmp_path_factory.mktemp("hostile-gguf"))
    ran = run_cases(cases, TIMEOUT)
    return {name: (ran[name], folders[name]) for name in folders}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", CASES)
def test_hostile_gguf_is_refused_in_one_line(results, case, command):
    r, folders = results[f"{case}/{command}"]
    assert problem(r, folders, TIMEOUT) is None, problem(r, folders, TIMEOUT)


def test_a_valid_tiny_gguf_still_converts_and_previews(tmp_path, monkeypatch):
    """The checks refuse what is wrong, not what is unusual: the tiny llama of the cases above, unchanged,
    converts and renders (the control for every case)."""
    from roctune.cli import main

    path = write_gguf(tmp_path / "ok.gguf")
    (tmp_path / "d.jsonl").write_text(json.dumps({"instruction": "Say hi.", "output": "Hi."}) + "\n")
    monkeypatch.setenv("ROCTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert main(["data", "preview", "d.jsonl", "--model", path, "--json"]) == 0
    assert len(os.listdir(tmp_path / "home" / "models")) == 1


def test_the_bundled_gguf_passes_the_border(default_model_dir):
    """The real SmolLM2 Q4_1 GGUF (49,152 tokens, 30 blocks, its chat template) passes every check, in well under
    a second (GGUFReader takes ~5 s on it)."""
    from roctune.gguf_model import check_gguf
    from roctune.models import _gguf_path

    header = check_gguf(_gguf_path())
    assert header.get("llama.block_count") == 30 and header.count("tokenizer.ggml.tokens") == 49152
    assert len(header.tensors) == 272


def test_a_model_folder_with_a_hostile_template_is_refused(tmp_path, capsys, monkeypatch, default_model_dir):
    """A chat template from a model folder (chat_template.jinja, as transformers saves it) is tried when the
    tokenizer loads: one line naming that file, before any model is loaded."""
    from roctune.cli import main

    folder = tmp_path / "m"
    shutil.copytree(default_model_dir, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    (folder / "chat_template.jinja").write_text(HUGE)
    (tmp_path / "d.jsonl").write_text(json.dumps({"instruction": "Say hi.", "output": "Hi."}) + "\n")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["data", "preview", "d.jsonl", "--model", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(folder / "chat_template.jinja") in err[0] and "wrote more than" in err[0], err
