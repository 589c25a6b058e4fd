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

import numpy as np
import pytest

from hostile_gguf import BROKEN_HEADERS, CHATML, FF, HIDDEN, run_cases, truncated, write_gguf

MARKER = "PWNED"
NESTED = "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}" + CHATML
HUGE = "{% for a in range(99999) %}{{ 'x' * 99999 }}{% endfor %}" + CHATML
TEMPLATES = {  # case: the GGUF's chat template
    "template-nested-loops": NESTED,
    "template-huge-output": HUGE,
    "template-doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                         "{% endfor %}" + CHATML,
    "template-raises": "{{ raise_exception('this template refuses every conversation') }}",
    "template-mro": "{{ ''.__class__.__mro__[1].__subclasses__() }}" + CHATML,
    "template-globals": "{{ cycler.__init__.__globals__.os.system('touch " + MARKER + "') }}" + CHATML,
    "template-self": "{{ self._TemplateReference__context.environment }}" + CHATML,
    "template-syntax": "{% for m in messages %}{{ m['content'] }",
}
META = {  # case: metadata changed
    "bos-past-vocab": {"tokenizer.ggml.bos_token_id": 100000},
    "eos-past-vocab": {"tokenizer.ggml.eos_token_id": 2 ** 31},
    "zero-heads": {"llama.attention.head_count": 0},
    "kv-heads-not-dividing": {"llama.attention.head_count_kv": 3},
    "vocab-size-10": {"llama.vocab_size": 10},
    "block-count-1000": {"llama.block_count": 1000},
    "block-count-list": {"llama.block_count": [1, 1]},
    "no-vocabulary": {"tokenizer.ggml.tokens": None, "tokenizer.ggml.token_type": None},
}
COMMANDS = {
    "preview": ["data", "preview", "d.jsonl", "--model", "{file}"],
    "train": ["train", "--model", "{file}", "--data", "d.jsonl", "--output", "run", "--max-steps", "1"],
    "serve": ["serve", "--model", "{file}", "--port", "0"],
}
TIMEOUT = 120  # seconds a case may take before it counts as a hang (a refusal takes well under one)


def _files(folder) -> dict[str, str]:
    """{case: path of its hostile file}."""
    out = {}
    for name, template in TEMPLATES.items():
        out[name] = write_gguf(folder / f"{name}.gguf", template=template)
    for name, meta in META.items():
        out[name] = write_gguf(folder / f"{name}.gguf", meta=meta)
    out["attn-q-shape"] = write_gguf(folder / "attn-q-shape.gguf",
                                     tensors={"blk.0.attn_q.weight": np.zeros((HIDDEN * 2, HIDDEN), np.float32)})
    out["ffn-down-shape"] = write_gguf(folder / "ffn-down-shape.gguf",
                                       tensors={"blk.0.ffn_down.weight": np.zeros((HIDDEN, FF // 2), np.float32)})
    out["embedding-rows"] = write_gguf(folder / "embedding-rows.gguf",
                                       tensors={"token_embd.weight": np.zeros((300, HIDDEN), np.float32)})
    out["missing-attn-k"] = write_gguf(folder / "missing-attn-k.gguf", tensors={"blk.0.attn_k.weight": None})
    # a tensor the checks do not ask for: transformers would leave the final norm random (its loading info says so)
    out["missing-output-norm"] = write_gguf(folder / "missing-output-norm.gguf", tensors={"output_norm.weight": None})
    out["truncated"] = truncated(write_gguf(folder / "whole.gguf"), folder / "truncated.gguf")
    for name, blob in BROKEN_HEADERS.items():
        (folder / f"{name}.gguf").write_bytes(blob)
        out[name] = str(folder / f"{name}.gguf")
    return out


def _snapshot(root) -> dict[str, int]:
    return {os.path.relpath(os.path.join(d, f), root): os.path.getsize(os.path.join(d, f))
            for d, _, files in os.walk(root) for f in files}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{(case, command): (its run, (working folder, home, file, the folder before))}: every case under every
    command, run once by one driver process (well under a second a case)."""
    root = tmp_path_factory.mktemp("hostile-gguf")
    (root / "files").mkdir()
    cases, folders = [], {}
    for case, path in _files(root / "files").items():
        for command, argv in COMMANDS.items():
            cwd, home = root / command / case / "w", root / command / case / "home"
            cwd.mkdir(parents=True)
            home.mkdir()
            (cwd / "d.jsonl").write_text(json.dumps({"instruction": "Say hi.", "output": "Hi."}) + "\n")
            folders[f"{case}/{command}"] = (cwd, home, path, _snapshot(cwd))
            cases.append({"name": f"{case}/{command}", "cwd": str(cwd), "home": str(home),
                          "argv": [a.replace("{file}", path) for a in argv]})
    ran = run_cases(cases, TIMEOUT)
    return {name: (ran[name], folders[name]) for name in folders}


CASES = [*TEMPLATES, *META, "attn-q-shape", "ffn-down-shape", "embedding-rows", "missing-attn-k",
         "missing-output-norm", "truncated", *BROKEN_HEADERS]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", CASES)
def test_hostile_gguf_is_refused_in_one_line(results, case, command):
    r, (cwd, home, path, before) = results[f"{case}/{command}"]
    assert r["rc"] is not None, f"{case}: still running after {TIMEOUT} s (a hang)"
    assert "Traceback" not in r["err"], r["err"][-3000:]
    lines = r["err"].strip().splitlines()
    assert r["rc"] == 2 and len(lines) == 1, (r["rc"], r["err"][-3000:])
    assert path in lines[0] and ": error: " in lines[0], lines[0]
    assert not os.path.exists(home / "models"), os.listdir(home / "models")
    assert _snapshot(cwd) == before, "something was written in the working folder"
    assert not (cwd / MARKER).exists()


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
