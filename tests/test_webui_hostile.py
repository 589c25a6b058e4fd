"""The web UI's training start, attacked (issue 37): the page hands a training its settings as a YAML file the server
writes (`python -P -m roctune train --config FILE`, in a private folder outside the workspace), never as
command-line words, so no value typed into the page can become a flag, a file the page saves cannot be Python,
and nothing in the workspace can stand in for a module of the trainer.

Replayed over Gradio's HTTP API (the official `gradio_client`, as test_webui_attacks does): the four code-execution
chains of issue 37 (a list setting turned into `--reward-file` / `--trust-remote-code`, "Save settings" as
`rw.py` / `yaml.py` / `roctune.py`, and a `yaml.py` or `roctune.py` in the workspace root imported by the trainer),
each shown to fail. Then a fuzz test of the start path for every stage: each form field set to hostile strings
(leading `--`, spaces, newlines, `=`, NUL, shell characters); the spawn is intercepted (no training runs) and the
command must be exactly `python -P -m roctune train --config FILE`, the file must read back (through the real CLI
parser) as exactly the settings the form gave, and no other setting may change; or the start is refused with the
CLI's line. Also: the YAML alias bomb, a symlinked dataset_info.json, Runs compare outside the root, and raw HTTP
to the serve API."""
from __future__ import annotations

import functools
import html
import json
import os
import sys
import time

import pytest

from conftest import files_in, served_page, write_jsonl

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

MARKER = "PWNED"
# Python that leaves the marker beside itself if it is ever imported
PLANT = "import pathlib\npathlib.Path(__file__).with_name('PWNED').write_text('ran')\n"
HOSTILE = ["--trust-remote-code", "--reward-file=/tmp/rw.py", "q_proj --trust-remote-code", "two words",
           "x\n--reward-file=rw.py", "--lr=1 --stage=grpo", "k=v", "a\x00b", "$(touch PWNED); `id` | & > < * ' \" \\",
           "-", " --overwrite "]


class FakePopen:
    """Stands in for subprocess.Popen in roctune.webui.jobs: records the start, runs nothing."""

    calls: list[dict] = []

    def __init__(self, argv, **kw):
        FakePopen.calls.append({"argv": list(argv), **kw})
        self.pid, self.returncode = 0, None

    def poll(self):
        return self.returncode


@pytest.fixture
def spawns(monkeypatch, tmp_path):
    """No training starts: every spawn is recorded in the returned list; job folders go under tmp_path/tmp."""
    import tempfile

    from roctune.webui import jobs

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(jobs.subprocess, "Popen", FakePopen)
    FakePopen.calls = []
    return FakePopen.calls


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(client, app, root): one served page for this file, confined to its root (emptied for each test by `api`)."""
    root = tmp_path_factory.mktemp("served") / "ws"
    root.mkdir()
    with served_page(root) as (client, app):
        yield client, app, root


@pytest.fixture
def api(served):
    """The served page with an empty workspace holding d.jsonl, and no job."""
    import shutil

    client, app, root = served
    for name in os.listdir(root):
        path = root / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    write_jsonl(root / "d.jsonl", [{"instruction": "Hi?", "input": "", "output": "Hello."}])
    app._roctune_state["job"] = None
    return served


_NAMES: dict[int, list[str]] = {}


def _start_names(client) -> list[str]:
    """The settings behind the Start endpoint's inputs, in order (from the API's own description)."""
    if id(client) not in _NAMES:
        params = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/on_start"]["parameters"]
        _NAMES[id(client)] = [p["label"].replace(" ", "_") for p in params]
    return _NAMES[id(client)]


def _start_args(client, values: dict) -> list:
    """The Start button's inputs in the page's order: the form's defaults, with `values` put in."""
    from roctune.webui.train_form import form_specs

    specs = {s["name"]: s for s in form_specs()}
    args = []
    for name in _start_names(client):
        default = specs[name]["default"]
        if isinstance(default, list) and not specs[name]["choices"]:
            default = "\n".join(default)
        args.append(values.get(name, "" if default is None or callable(default) else default))
    return args


@functools.lru_cache(maxsize=1)
def _parser():
    from roctune.cli import build_parser

    return build_parser()


def _child_config(argv: list[str]):
    """The settings the trainer would run with: its argv read by the real CLI parser (after `python -P -m`)."""
    from roctune.commands.train import config_from_args

    assert argv[:3] == [sys.executable, "-P", "-m"], argv
    return config_from_args(_parser().parse_args(argv[4:]))


def _only_config_flag(call: dict, root) -> str:
    """The spawn is `python -P -m roctune train --config FILE` in a private folder outside the root; FILE."""
    argv = call["argv"]
    assert argv[:6] == [sys.executable, "-P", "-m", "roctune", "train", "--config"] and len(argv) == 7, argv
    folder = call["cwd"]
    assert os.path.dirname(argv[6]) == folder and not str(folder).startswith(str(root)), (folder, root)
    assert call["env"]["PYTHONSAFEPATH"] == "1" and oct(os.stat(folder).st_mode & 0o777) == "0o700"
    return argv[6]


# ----------------------------------------------------------------------- the four chains over the HTTP API
def test_list_words_never_become_flags(api, spawns):
    """Chain 1: target modules `q_proj --reward-file=ROOT/rw.py` and `q_proj --trust-remote-code` never become
    flags: such a word is not a module name, so Start refuses it in one line naming the field (settings
    validation, as `roctune train` refuses it) and nothing is spawned; module names start the run as typed."""
    client, app, root = api
    (root / "rw.py").write_text(PLANT)
    for words in (f"q_proj --reward-file={root / 'rw.py'}", "q_proj --trust-remote-code",
                  f"q_proj,--reward-file={root / 'rw.py'}"):
        app._roctune_state["job"] = None
        args = _start_args(client, {"data": ["d.jsonl"], "output": "runs/x", "max_steps": 1,
                                    "target_modules": words})
        status = html.unescape(client.predict(*args, api_name="/on_start")[0])
        flag = words.replace(",", " ").split()[1]
        assert f"error: target modules: {flag!r} is not a name (letters, digits and _ . - only" in status, status
        assert not spawns and not (root / "runs").exists()
    app._roctune_state["job"] = None
    args = _start_args(client, {"data": ["d.jsonl"], "output": "runs/x", "max_steps": 1,
                                "target_modules": "q_proj, v_proj model.layers.0.mlp.up_proj"})
    assert "started: roctune train --config " in html.unescape(client.predict(*args, api_name="/on_start")[0])
    cfg = _child_config(spawns[-1]["argv"])
    assert cfg.target_modules == ["q_proj", "v_proj", "model.layers.0.mlp.up_proj"]  # names, exactly as typed
    assert cfg.reward_file == [] and cfg.trust_remote_code is False and cfg.stage == "sft"
    assert not list(root.rglob(MARKER))


def test_a_settings_file_naming_command_line_settings_is_refused(tmp_path):
    """Even a settings file the page could write cannot carry reward_file or trust_remote_code (the trainer reads
    the job's file with config.apply, which refuses them from any file)."""
    from roctune.config import from_sources
    from roctune.errors import ConfigError

    for line in ("reward_file: [rw.py]", "trust_remote_code: true", "reward-file: rw.py"):
        f = tmp_path / "s.yaml"
        f.write_text(line + "\n")
        with pytest.raises(ConfigError, match="can only be given on the command line"):
            from_sources(str(f))


BAD_NAMES = ["rw.py", "yaml.py", "roctune.py", "../s", "runs/s", "settings/s", ".s", "-s", "s.yml", "s.yaml.py",
             "a b", "s\nx", "s\x00", "/tmp/s", str(os.sep) + "s.yaml", "s.yaml/", "", "--config=x"]


def test_save_settings_writes_only_settings_yaml(api):
    """Chain 2: "Save settings" takes a name (letters, digits, _ and -) and writes settings/NAME.yaml only: a
    Python file name, a path or a suffix other than .yaml is refused with one line and nothing is written."""
    client, _app, root = api
    before = files_in(root)
    args = _start_args(client, {"data": ["d.jsonl"], "output": "runs/x", "format_regex": "__import__('os')"})
    for name in BAD_NAMES:
        status = html.unescape(client.predict(name, *args, api_name="/on_save")[0])
        assert "roctune train: error: settings file" in status and "internal error" not in status, (name, status)
        assert files_in(root) == before and not (root / "settings").exists(), name


def test_save_settings_makes_its_folder_and_never_replaces(api):
    client, _app, root = api
    args = _start_args(client, {"data": ["d.jsonl"], "output": "runs/x", "lora_r": 4})
    for name in ("mine", "我的-设置_2.yaml"):
        status = html.unescape(client.predict(name, *args, api_name="/on_save")[0])
        assert "settings saved to" in status, status
    assert sorted(os.listdir(root / "settings")) == ["mine.yaml", "我的-设置_2.yaml"]
    assert "lora_r: 4" in (root / "settings" / "mine.yaml").read_text()
    status = html.unescape(client.predict("mine.yaml", *args, api_name="/on_save")[0])
    assert "already exists" in status
    loaded = client.predict("mine", api_name="/on_load")
    assert "settings loaded from" in html.unescape(loaded[0]) and "lora_r: 4" in loaded[1]
    # a settings folder that is a symlink out of the root, or a file, is refused with one line
    (root / "settings").rename(root / "old")
    (root / "settings").write_text("")
    status = html.unescape(client.predict("new", *args, api_name="/on_save")[0])
    assert "roctune train: error: settings file: " in status and "is not a folder" in status, status
    os.remove(root / "settings")
    os.symlink(root.parent, root / "settings")
    status = html.unescape(client.predict("new", *args, api_name="/on_save")[0])
    assert "outside the workspace" in status and not (root.parent / "new.yaml").exists(), status


def _wait(job, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while job.running and time.time() < deadline:
        time.sleep(0.1)
    assert not job.running, "the trainer did not exit"


def test_modules_in_the_root_are_never_imported_by_the_trainer(api, tmp_path, monkeypatch):
    """Chains 3 and 4: a `yaml.py`, `roctune.py` (and `sitecustomize.py`, `torch.py`) in the workspace root would
    replace the real modules if the root were the trainer's sys.path[0]. A real trainer is started (on a missing
    data file, so it stops at once with the CLI's line after reading its settings with yaml)."""
    import tempfile

    client, app, root = api
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for mod in ("yaml.py", "roctune.py", "sitecustomize.py", "torch.py"):
        (root / mod).write_text(PLANT)
    monkeypatch.chdir(root)  # the server itself started in the workspace, as `roctune webui` usually is
    args = _start_args(client, {"data": ["missing.jsonl"], "output": "runs/x", "max_steps": 1})
    status = html.unescape(client.predict(*args, api_name="/on_start")[0])
    assert "started: roctune train --config " in status, status
    job = app._roctune_state["job"]
    _wait(job)
    log = job.log_text()
    assert not list(root.rglob(MARKER)) and not list(tmp_path.rglob(MARKER)), log  # no planted module ran
    assert job.proc.returncode == 2 and "roctune train: error: " in log and "missing.jsonl" in log, log


# ------------------------------------------------------------------------------------ fuzz of the start path
BASE = {"sft": {"data": ["d.jsonl"], "output": "runs/x", "max_steps": 1},
        "dpo": {"data": ["d.jsonl"], "output": "runs/x", "max_steps": 1, "stage": "dpo"},
        "grpo": {"data": ["d.jsonl"], "output": "runs/x", "max_steps": 1, "stage": "grpo", "rewards": ["answer"]}}


def _handlers(tmp_path):
    gr = pytest.importorskip("gradio", reason="the web UI needs the webui extra (make setup installs it)")
    from types import SimpleNamespace

    from roctune.webui import Workspace
    from roctune.webui.train import start_handler
    from roctune.webui.train_form import form_specs

    root = tmp_path / "ws"
    root.mkdir()
    write_jsonl(root / "d.jsonl", [{"instruction": "Hi?", "input": "", "output": "Hello."}])
    specs = {s["name"]: s for s in form_specs()}
    state = {"job": None}
    ws = Workspace(str(root))
    return gr, specs, state, start_handler(gr, SimpleNamespace(fields=dict.fromkeys(specs)), ws, state), ws


def _form_row(specs, values: dict) -> list:
    """The handler's inputs as Gradio hands them over for a form left at its defaults plus `values`."""
    row = []
    for name, spec in specs.items():
        default = spec["default"]
        if name in ("data", "eval_data", "rewards", "report_to"):  # dropdowns: lists
            pass
        elif spec["kind"] == "list":
            default = " ".join(default)
        elif spec.get("unset") is not None:
            default = ""
        row.append(values.get(name, "" if default is None else default))
    return row


def _expected(spec, text: str, ws, base_value):
    """What the form makes of `text` typed into a free-text field: the value the trainer must get."""
    name, kind = spec["name"], spec["kind"]
    if name in ("data", "eval_data"):
        return [os.path.realpath(os.path.join(ws.root, text.strip()))]
    if kind == "list":
        return text.replace(",", " ").split()
    if name in ("output", "adapter", "reward_model"):  # run folders: resolved in the workspace
        return os.path.realpath(os.path.join(ws.root, text.strip()))
    return text.strip() if name != "model" else text.strip()


def _refused_line(status: str, value: str) -> None:
    text = html.unescape(status).replace("<br>", "\n")
    body = text.split(">", 1)[1].rsplit("<", 1)[0]
    # the CLI's line, or a typed settings error in the page's words (html.PAGE_ERRORS)
    assert body.startswith(("roctune train: error: ", "error: ")) and "internal error" not in body, body
    assert body.count("\n") <= value.count("\n"), body  # one line (a value with a newline may be echoed)


@pytest.mark.parametrize("stage", ["sft", "dpo", "grpo"])
def test_fuzz_every_field_gives_exactly_its_setting_or_one_line(stage, spawns, tmp_path):
    """Every form field, one at a time, set to each hostile string, for each stage: either the trainer's settings
    (its argv read by the real parser) are the base settings with exactly that field changed to what was typed,
    and its command is only `--config FILE`; or the start is refused with one line and nothing is spawned."""
    from roctune.config import TrainConfig

    gr, specs, state, on_start, ws = _handlers(tmp_path)
    base = _base_config(stage, specs, ws)
    started = refused = 0
    for value in [None, *HOSTILE]:
        for name, spec in specs.items():
            if value is None and name != "data":
                continue  # the base form alone, once
            values = dict(BASE[stage])
            if value is not None:
                values[name] = [value] if name in ("data", "eval_data", "rewards", "report_to") else value
            state["job"], n = None, len(spawns)
            status = on_start(*_form_row(specs, values))[0]
            if len(spawns) == n:
                _refused_line(status, value or "")
                refused += 1
                continue
            assert len(spawns) == n + 1 and "started: roctune train --config " in html.unescape(status), status
            _only_config_flag(spawns[-1], ws.root)
            got = _child_config(spawns[-1]["argv"]).to_dict()
            changed = {k for k in got if got[k] != base[k]}
            if value is None:
                assert not changed, changed
            else:
                assert changed <= {name}, (name, value, changed)  # no setting the form did not set
                if spec["kind"] in ("str", "list") and not spec["choices"]:  # free text: exactly what was typed
                    assert got[name] == _expected(spec, value, ws, base[name]), (name, value, got[name])
                assert got["reward_file"] == [] and got["trust_remote_code"] is False
            started += 1
    # both ways were exercised (41 starts for sft and dpo since module, template and column names are checked
    # as names and no text holds a control character; 50+ before)
    assert started > 30 and refused > 50
    assert TrainConfig().reward_file == []


def _base_config(stage: str, specs, ws) -> dict:
    from roctune.webui.train_form import form_config

    return form_config(dict(zip(specs, _form_row(specs, BASE[stage]))), ws)[0].to_dict()


@pytest.mark.parametrize("stage", ["sft", "dpo", "grpo"])
def test_fuzz_every_text_field_at_once(stage, spawns, tmp_path):
    """All free-text and list fields hostile at the same time: the trainer still gets exactly those values and
    only `--config FILE` (numbers, choices and boxes keep the base values)."""
    gr, specs, state, on_start, ws = _handlers(tmp_path)
    skip = ("data", "output", "adapter", "stage", "rewards", "report_to", "format_regex", "master_addr")
    texts = [n for n, s in specs.items() if s["kind"] in ("str", "list") and not s["choices"] and n not in skip]
    assert {"target_modules", "model", "answer_column", "modules_to_save"} <= set(texts), texts
    for value in HOSTILE:
        values = dict(BASE[stage], **dict.fromkeys(texts, value))
        values["freeze_trainable_modules"] = value if value.split() else "all"
        values["target_modules"] = value if value.split() else "auto"
        values["eval_data"] = [value]
        state["job"], n = None, len(spawns)
        status = on_start(*_form_row(specs, values))[0]
        if len(spawns) == n:
            _refused_line(status, value)
            continue
        _only_config_flag(spawns[-1], ws.root)
        got = _child_config(spawns[-1]["argv"])
        for name in texts:
            assert getattr(got, name) == _expected(specs[name], values[name] if name != "eval_data" else value, ws,
                                                   None), name
        assert got.reward_file == [] and not got.trust_remote_code and got.stage == stage


def test_fuzz_over_http(api, spawns):
    """The same over Gradio's HTTP API (what arrives after Gradio's own preprocessing): target modules, model and
    answer column with six of the hostile strings (each HTTP call costs a third of a second)."""
    client, app, root = api
    for value in [HOSTILE[i] for i in (0, 2, 4, 7, 8, 10)]:  # a flag, words, newline, NUL, shell, spaces
        for name in ("target_modules", "model", "answer_column"):
            app._roctune_state["job"], n = None, len(spawns)
            args = _start_args(client, {"data": ["d.jsonl"], "output": "runs/x", "max_steps": 1, name: value})
            status = client.predict(*args, api_name="/on_start")[0]
            if len(spawns) == n:
                _refused_line(status, value)
                continue
            _only_config_flag(spawns[-1], root)
            got = _child_config(spawns[-1]["argv"])
            assert not got.trust_remote_code and got.reward_file == [] and got.stage == "sft" and got.lr == 2e-4
            if name in ("target_modules", "answer_column", "model"):
                want = value.split() if name == "target_modules" else value.strip()
                assert getattr(got, name) == (want or None if name == "model" else want), (name, value)


# ------------------------------------------------------------------------------------------ the rest of issue 37
def test_settings_that_do_not_survive_the_file_are_refused(tmp_path):
    """write_settings reads the job's file back as the trainer will: a value the YAML cannot carry exactly (here a
    number among module names, which the file turns into text) refuses the start instead of training on another
    setting."""
    from roctune.config import TrainConfig
    from roctune.errors import ConfigError
    from roctune.webui.jobs import write_settings

    cfg = TrainConfig(data=["/d.jsonl"], output="/o", target_modules=["q_proj", 1])
    with pytest.raises(ConfigError, match="^target_modules: the value does not survive the settings file"):
        write_settings(cfg, str(tmp_path))
    cfg.target_modules = ["q_proj", "--trust-remote-code"]
    assert _child_config([sys.executable, "-P", "-m", "roctune", "train", "--config",
                          write_settings(cfg, str(tmp_path))]).to_dict() == cfg.to_dict()


def test_alias_bomb_is_refused_fast_with_its_line(tmp_path):
    """72 aliases (under the alias cap) that expand to 9^9 references: one line, in milliseconds."""
    from roctune.config import load_yaml
    from roctune.errors import ConfigError

    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    assert sum(line.count("*") for line in lines) == 72
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        load_yaml(str(bomb))
    assert time.perf_counter() - t0 < 1.0
    msg = str(e.value)
    assert msg.startswith(f"{bomb}:") and "alias bomb" in msg and "\n" not in msg, msg
    # a few aliases that add little are still fine; a collection containing itself is refused
    ok = tmp_path / "ok.yaml"
    ok.write_text("target_modules: &t [q_proj, v_proj]\nmodules_to_save: *t\n")
    assert load_yaml(str(ok)) == {"target_modules": ["q_proj", "v_proj"], "modules_to_save": ["q_proj", "v_proj"]}
    loop = tmp_path / "loop.yaml"
    loop.write_text("data: &d [a, *d]\n")
    with pytest.raises(ConfigError, match=r"loop.yaml:1: invalid YAML \(a recursive alias"):
        load_yaml(str(loop))


def test_symlinked_dataset_info_outside_the_root_is_not_read(api, tmp_path):
    client, _app, root = api
    secret = tmp_path / "info.json"
    secret.write_text(json.dumps({"the-secret-key": {"file_name": "d.jsonl"}}))
    (root / "lf").mkdir()
    os.symlink(secret, root / "lf" / "dataset_info.json")
    from roctune.webui import picks

    assert not any("the-secret-key" in d for d in picks.datasets(_app._roctune_workspace))
    for spec in ("lf", "lf:the-secret-key"):
        status, shown = client.predict(spec, api_name="/on_preview")
        status = html.unescape(status)
        assert "its dataset_info.json leads to" in status and "outside the workspace" in status, status
        assert "the-secret-key" not in json.dumps(shown) and status.count("the-secret-key") <= spec.count("secret")


def test_runs_compare_outside_the_root_shows_its_line(api, tmp_path):
    client, _app, root = api
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    for api_name in ("/on_pick_1", "/on_pick_2"):
        try:
            status, _plot = client.predict(str(outside), api_name=api_name)
        except ValueError:  # the endpoint names Gradio gave the two compare boxes
            continue
        status = html.unescape(status)
        assert "roctune webui: error: run " in status and "outside the workspace" in status, status
        break
    else:
        names = list(client.view_api(return_format="dict", print_info=False)["named_endpoints"])
        pytest.fail(f"no compare endpoint among {names}")


def _raw(url: str, data: bytes) -> tuple[int, dict]:
    import socket

    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(data)
        out = b""
        while b"\r\n\r\n" not in out or len(out.partition(b"\r\n\r\n")[2]) < _length(out):
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _length(out: bytes) -> int:
    for line in out.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            return int(v)
    return 1 << 30


def test_serve_raw_http_gets_openai_shaped_4xx():
    """Content-Length -1 and a 2 MB chunked body (one chunk, and many) to the serve API: a 400 / 413 with OpenAI's
    error shape (no model needed: the body is refused before the engine is asked anything)."""
    from types import SimpleNamespace

    from roctune.serve import ServerThread, Settings, create_app

    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
    body = b"x" * (2 << 20)
    many = b"".join(b"%x\r\n" % len(body[i:i + 65536]) + body[i:i + 65536] + b"\r\n"
                    for i in range(0, len(body), 65536)) + b"0\r\n\r\n"
    one = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    with ServerThread(create_app(SimpleNamespace(), Settings())) as url:
        chunked = head + b"Transfer-Encoding: chunked\r\n\r\n"
        cases = [(head + b"Content-Length: -1\r\n\r\n{}", 400), (chunked + many, 413), (chunked + one, 413)]
        for request, want in cases:
            status, answer = _raw(url, request)
            assert status == want and set(answer) == {"error"}, (status, answer)
            assert set(answer["error"]) == {"message", "type", "code", "param"} and answer["error"]["message"]
