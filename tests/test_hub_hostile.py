"""A hostile hub (issue 46), on loopback in the Hugging Face and ModelScope layouts (tests/test_models_hub.py's
server with its hostile knobs): a commit id that is a path, file names with `..`, absolute names, backslashes or
NULs, answers that are not JSON or miss their fields, a 10^15-byte file, a transfer dripped one byte at a time, and
pickles and code in the file list. Every pull is `roctune models pull` in a subprocess; each refusal is one line on
stderr, a non-zero exit, no traceback, and nothing written outside the model's folder (the tree around it is
compared before and after); a dripped pull ends by itself after the stall limit and stops within seconds on SIGINT or
SIGTERM, and the next pull resumes it. The limits are set low through ROCTUNE_HUB_TIMEOUT and ROCTUNE_HUB_STALL."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO
from test_models_hub import REPO_ID, SHA, WEIGHTS, Hub

FOLDER = "tiny-org--tiny-llama"
HUBS = ["huggingface", "modelscope"]


@pytest.fixture(scope="module")
def small_repo(tmp_path_factory) -> str:
    """A repository that passes a pull's checks, without a model build: a config, the tokenizer's JSON files and
    real safetensors weights of 256 KB (large enough that a stopped transfer has something to resume)."""
    import numpy as np
    from safetensors.numpy import save_file

    folder = tmp_path_factory.mktemp("small-repo")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
    save_file({"w": np.arange(64 * 1024, dtype=np.float32)}, str(folder / WEIGHTS))
    return str(folder)


@pytest.fixture
def hub(small_repo):
    with Hub(small_repo) as served:
        yield served


def environment(home: str, hub_url: str, kind: str, **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("ROCTUNE_HUB", "HF_TOKEN")}
    return {**base, "PYTHONPATH": REPO, "ROCTUNE_HOME": home, "HF_ENDPOINT": hub_url, "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HOME": os.path.join(home, "hf"), "MODELSCOPE_ENDPOINT": hub_url,
            "MODELSCOPE_CACHE": os.path.join(home, "ms"), "ROCTUNE_HUB": kind, "ROCTUNE_HUB_TIMEOUT": "5",
            "ROCTUNE_HUB_STALL": "5", **env}


def start(tmp_path, hub, kind: str, *args: str, **env: str) -> subprocess.Popen:
    home = str(tmp_path / "home")
    os.makedirs(os.path.join(home, "models"), exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "roctune", "models", "pull", REPO_ID, *args],
                            env=environment(home, hub.url, kind, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)


def default_sigint() -> None:
    """Ctrl-C as a terminal delivers it: a pytest started in the background ignores SIGINT, and its children would
    inherit that (roctune keeps an inherited ignore, as a shell's background job expects)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def finish(proc: subprocess.Popen, within: float) -> tuple[int | None, str]:
    """(exit code, stderr) of `proc`, or (None, ...) when it had not ended `within` seconds (it is then killed)."""
    try:
        _, err = proc.communicate(timeout=within)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return None, err


def around(tmp_path) -> set[str]:
    """Every file and folder under tmp_path except the model's folder: a pull may write only inside that."""
    target = os.path.join("home", "models", FOLDER)
    seen = set()
    for folder, dirs, files in os.walk(tmp_path):
        rel = os.path.relpath(folder, tmp_path)
        if rel == target or rel.startswith(target + os.sep):
            continue
        seen.update(os.path.join(rel, n) for n in dirs + files)
    return seen - {target}


def one_line(rc, err: str, *words: str) -> str:
    assert rc not in (0, None), (rc, err)
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("roctune models: ") and all(w in lines[0] for w in words), lines[0]
    return lines[0]


def not_a_path(tmp_path, text: str) -> str:
    return text.replace("{outside}", str(tmp_path / "outside"))


# (id, hub, knob, value, words the line must hold): the hub's answer is refused before any file is fetched
REFUSED = [
    ("sha-relative", "huggingface", "sha", "../../../../../outside/escaped", "commit"),
    ("sha-absolute", "huggingface", "sha", "{outside}/absolute", "commit"),
    ("sha-not-hex", "huggingface", "sha", "main", "commit"),
    ("sha-missing", "huggingface", "answer", {"id": REPO_ID, "siblings": []}, "sha"),
    ("sha-a-number", "huggingface", "answer", {"id": REPO_ID, "sha": 123, "siblings": []}, "sha"),
    ("not-json", "huggingface", "answer", b"<html>rate limited</html>", "JSON"),
    ("a-list", "huggingface", "answer", [1, 2, 3], "JSON object"),
    ("no-siblings", "huggingface", "answer", {"id": REPO_ID, "sha": SHA}, "siblings"),
    ("name-dotdot", "huggingface", "name", "../evil.json", "../evil.json"),
    ("name-absolute", "huggingface", "name", "{outside}/evil.json", "evil.json"),
    ("name-backslash", "huggingface", "name", "..\\evil.json", "evil.json"),
    ("name-nul", "huggingface", "name", "evil\0.json", "evil"),
    ("size-1e15", "huggingface", "size", 10 ** 15, "size"),
    ("size-text", "huggingface", "size", "lots", "size"),
    ("ms-not-json", "modelscope", "answer", b"<html>busy</html>", "JSON"),
    ("ms-no-files", "modelscope", "answer", {"Code": 200, "Data": {}, "Success": True}, "Files"),
    ("ms-name-dotdot", "modelscope", "name", "../evil.json", "../evil.json"),
    ("ms-name-absolute", "modelscope", "name", "{outside}/evil.json", "evil.json"),
    ("ms-size-1e15", "modelscope", "size", 10 ** 15, "size"),
]


@pytest.mark.parametrize("kind,knob,value,word", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_malformed_or_hostile_answer_is_one_line_and_writes_nothing(hub, tmp_path, kind, knob, value, word):
    (tmp_path / "outside").mkdir()
    (tmp_path / "home" / "models").mkdir(parents=True)
    if knob == "sha":
        hub.sha = not_a_path(tmp_path, value)
    elif knob == "answer":
        hub.answer = value if isinstance(value, bytes) else json.dumps(value).encode()
    elif knob == "name":
        hub.listed = lambda rows: rows + [[not_a_path(tmp_path, value), 10]]
    else:
        hub.listed = lambda rows: [[n, value if n == WEIGHTS else s] for n, s in rows]
    before = around(tmp_path)
    rc, err = finish(start(tmp_path, hub, kind), within=60)
    one_line(rc, err, not_a_path(tmp_path, word))
    assert around(tmp_path) == before  # nothing written outside the model's folder
    assert not os.path.exists(tmp_path / "home" / "models" / FOLDER)  # nor in it: refused before any file
    assert not [r for r in hub.requests if r[0] == "GET"]


@pytest.mark.parametrize("kind", HUBS)
def test_bytes_that_do_not_match_the_listed_hash_are_not_kept(hub, tmp_path, kind):
    hub.digest = lambda name, how: "0" * (64 if how == "sha256" else 40)  # every listed hash wrong
    rc, err = finish(start(tmp_path, hub, kind), within=60)
    one_line(rc, err, "do not match the hash")
    folder = tmp_path / "home" / "models" / FOLDER
    assert not (folder / "roctune_pulled.json").exists()
    assert not [p for p in folder.rglob("*") if p.is_file() and p.name != ".roctune_pulling"]  # nothing kept


def test_a_model_larger_than_the_free_disk_is_refused_before_it_starts(hub, tmp_path):
    import shutil

    from roctune.hub.answers import MAX_FILE_BYTES

    need = shutil.disk_usage(tmp_path).free + 10 ** 9
    assert need <= MAX_FILE_BYTES  # a plausible size, only too large for this disk
    hub.listed = lambda rows: [[n, need if n == WEIGHTS else s] for n, s in rows]
    rc, err = finish(start(tmp_path, hub, "huggingface"), within=60)
    one_line(rc, err, "GB free")
    assert not os.path.exists(tmp_path / "home" / "models" / FOLDER)


@pytest.mark.parametrize("kind", HUBS)
def test_only_the_files_roctune_loads_are_fetched(hub, tmp_path, kind):
    """The allow-list is the list of files a model folder is loaded from: no pickle (tokenizer.pkl, *.bin, *.pth),
    no code (*.py) and nothing from a subfolder, whatever their names begin with."""
    bad = {"tokenizer.pkl": b"pickle", "tokenizer_evil.py": b"import os", "modeling_evil.py": b"import os",
           "training_args.bin": b"pickle", "original/consolidated.00.pth": b"pickle", "README.md": b"# hi",
           "tokenizer_config.json.py": b"import os", "model.safetensors.pkl": b"pickle"}
    hub.files.update(bad)
    rc, err = finish(start(tmp_path, hub, kind), within=60)
    assert rc == 0, err
    folder = tmp_path / "home" / "models" / FOLDER
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["config.json", "tokenizer.json", "tokenizer_config.json", WEIGHTS, "roctune_pulled.json"])
    fetched = {name for method, name, _ in hub.requests if method == "GET"}
    assert fetched == {"config.json", "tokenizer.json", "tokenizer_config.json", WEIGHTS}, fetched
    assert (folder / WEIGHTS).read_bytes() == hub.files[WEIGHTS]


def test_code_is_fetched_only_with_trust_remote_code(hub, tmp_path):
    hub.files.update({"modeling_tiny.py": b"# the model's own code", "tokenizer.pkl": b"pickle"})
    rc, err = finish(start(tmp_path, hub, "huggingface", "--trust-remote-code"), within=60)
    assert rc == 0, err
    folder = tmp_path / "home" / "models" / FOLDER
    assert (folder / "modeling_tiny.py").read_bytes() == b"# the model's own code"
    assert not (folder / "tokenizer.pkl").exists() and not (folder / "pytorch_model.bin").exists()


@pytest.mark.parametrize("kind", HUBS)
def test_a_dripped_transfer_stops_at_the_stall_limit_and_resumes(hub, tmp_path, kind):
    hub.drip, hub.drip_after = {WEIGHTS: 0.05}, 100_000  # 20 bytes a second after the first 100 kB
    began = time.monotonic()
    rc, err = finish(start(tmp_path, hub, kind, ROCTUNE_HUB_STALL="2"), within=30)
    one_line(rc, err, WEIGHTS, "stalled")
    assert time.monotonic() - began < 15
    hub.drip = {}
    again = finish(start(tmp_path, hub, kind), within=60)
    assert again[0] == 0, again[1]
    ranges = [rng for method, name, rng in hub.requests if method == "GET" and name == WEIGHTS]
    assert ranges[0] is None and ranges[-1] and int(ranges[-1].split("=")[1].split("-")[0]) >= 100_000, ranges
    assert (tmp_path / "home" / "models" / FOLDER / WEIGHTS).read_bytes() == hub.files[WEIGHTS]


def test_a_dripped_answer_times_out(hub, tmp_path):
    hub.drip_answer = 0.05
    began = time.monotonic()
    rc, err = finish(start(tmp_path, hub, "huggingface", ROCTUNE_HUB_TIMEOUT="2"), within=30)
    one_line(rc, err, "cannot be reached", "ROCTUNE_HUB_TIMEOUT")
    assert time.monotonic() - began < 15
    assert not os.path.exists(tmp_path / "home" / "models" / FOLDER)


@pytest.mark.parametrize("kind,sig", [("huggingface", signal.SIGINT), ("huggingface", signal.SIGTERM),
                                      ("modelscope", signal.SIGINT)], ids=["hf-sigint", "hf-sigterm", "ms-sigint"])
def test_a_signal_stops_a_dripped_pull_at_once_and_the_next_pull_resumes(hub, tmp_path, kind, sig):
    hub.drip, hub.drip_after = {WEIGHTS: 0.05}, 100_000
    proc = start(tmp_path, hub, kind, ROCTUNE_HUB_STALL="600")
    deadline = time.monotonic() + 30
    while hub.sent.get(WEIGHTS, 0) < 100_010 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert hub.sent.get(WEIGHTS, 0) >= 100_010, proc.poll()
    proc.send_signal(sig)
    stopped = time.monotonic()
    rc, err = finish(proc, within=10)
    assert rc == 130 and time.monotonic() - stopped < 5, (rc, err)
    assert err.strip().splitlines() == ["roctune models: interrupted"], err
    hub.drip = {}
    again = finish(start(tmp_path, hub, kind), within=60)
    assert again[0] == 0, again[1]
    ranges = [rng for method, name, rng in hub.requests if method == "GET" and name == WEIGHTS]
    assert int(ranges[-1].split("=")[1].split("-")[0]) >= 100_000, ranges  # resumed, not started again
    assert (tmp_path / "home" / "models" / FOLDER / WEIGHTS).read_bytes() == hub.files[WEIGHTS]


def test_an_abandoned_download_does_not_wedge_the_models_panel(hub, tmp_path, monkeypatch):
    """The web UI's Download handler (a generator Gradio closes when the page goes away): closing it stops the
    download within seconds, and the panel takes the next one."""
    import huggingface_hub.constants

    from roctune.webui import hub_panel

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("ROCTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ROCTUNE_HUB_STALL", "600")
    monkeypatch.delenv("ROCTUNE_HUB", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    hub.drip, hub.drip_after = {WEIGHTS: 0.05}, 100_000
    steps = hub_panel.pull_steps(REPO_ID, "en")
    deadline = time.monotonic() + 30
    while hub.sent.get(WEIGHTS, 0) < 100_010 and time.monotonic() < deadline:
        next(steps)
    steps.close()  # the page went away
    hub.drip = {}
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        status = list(hub_panel.pull_steps(REPO_ID, "en"))[-1][0]
        if "another download is running" not in status:
            break
        time.sleep(0.2)
    assert "downloaded to" in status, status
    assert (tmp_path / "home" / "models" / FOLDER / WEIGHTS).read_bytes() == hub.files[WEIGHTS]
