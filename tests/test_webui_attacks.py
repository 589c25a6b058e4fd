"""The web UI's boundary, attacked over Gradio's HTTP API the way any local user (the loopback page has no login)
could: the official `gradio_client` calls the same endpoints the page's buttons call.

Replayed: the code-execution chain (upload a config.json whose auto_map names a module, write the module with the
scrub, train with trust_remote_code), the root escapes (a dataset_info.json naming a file outside the root, a hub
id that is a folder beside the server), and scrub outputs replacing existing files. Each must fail with the CLI's
one line, and leave the workspace as it was."""
from __future__ import annotations

import html
import json
import os

import pytest

from conftest import files_in, served_page, write_jsonl

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

SECRET = "the-secret-outside-the-root"
# what the module would do if it were ever imported: leave a file behind
MODULE = "import pathlib\npathlib.Path(__file__).with_name('PWNED').write_text('ran')\n"


@pytest.fixture
def api(tmp_path):
    """(client, app, root): a served page confined to tmp_path/ws, and a secret file beside the root."""
    root = tmp_path / "ws"
    root.mkdir()
    write_jsonl(tmp_path / "secret.jsonl", [{"instruction": "Hi?", "input": "", "output": SECRET}])
    with served_page(root) as (client, app):
        yield client, app, root


def _train_args(client, values: dict) -> list:
    """The Start button's 53 inputs in the page's order: the form's defaults, with `values` put in."""
    from roctune.webui.train_form import form_specs

    specs = {s["name"]: s for s in form_specs()}
    labels = [p["label"] for p in client.view_api(return_format="dict", print_info=False)
              ["named_endpoints"]["/on_start"]["parameters"]]
    names = [label.replace(" ", "_") for label in labels]
    assert set(names) == set(specs) and "reward_file" not in names  # no way to hand the page Python code
    args = []
    for name in names:
        default = specs[name]["default"]
        if isinstance(default, list) and not specs[name]["choices"]:  # a text box; a list of choices stays a list
            default = "\n".join(default)
        args.append(values.get(name, "" if default is None or callable(default) else default))
    return args


def test_code_execution_chain_fails(api, tmp_path):
    from gradio_client import handle_file

    client, app, root = api
    # 1. a config.json whose auto_map names a module: a data-shaped upload, so it is taken (it is inert without
    #    trust_remote_code), but a .py upload is not
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "evil", "architectures": ["EvilForCausalLM"],
                               "auto_map": {"AutoConfig": "evil.EvilConfig",
                                            "AutoModelForCausalLM": "evil.EvilForCausalLM"}}))
    status, taken = client.predict(handle_file(str(cfg)), api_name="/on_upload")
    assert taken == str(root / "uploads" / "config.json")
    py = tmp_path / "evil.py"
    py.write_text(MODULE)
    try:
        status, _ = client.predict(handle_file(str(py)), api_name="/on_upload")
        assert "the page takes data files only" in status
    except Exception as e:  # noqa: BLE001 - Gradio's own file-type check may refuse it first
        assert "evil.py" in str(e) or "file type" in str(e).lower()
    # 2. the module's text as a "dataset" (a JSON string per line reads as JSON lines), scrubbed into a .py
    src = tmp_path / "mod.jsonl"
    src.write_text(json.dumps({"instruction": MODULE, "input": "", "output": "x"}) + "\n")
    _, data = client.predict(handle_file(str(src)), api_name="/on_upload")
    for out in ("uploads/evil.py", "uploads/evil.pyc", "uploads/__init__.py"):
        status, _, _ = client.predict(data, out, [], api_name="/on_scrub")
        status = html.unescape(status)
        assert "roctune data: error: " in status and "keeps the input's format (jsonl)" in status, status
    # 3. train on that folder as a model with trust_remote_code ticked
    before = files_in(root)
    args = _train_args(client, {"model": "uploads", "data": data, "output": "runs/evil", "trust_remote_code": True,
                                "max_steps": 1})
    status = html.unescape(client.predict(*args, api_name="/on_start")[0])
    assert "roctune train: error: trust_remote_code: " in status and "roctune webui --trust-remote-code" in status
    assert app._roctune_state["job"] is None  # no training process was started
    assert files_in(root) == before and not any(n.endswith(".py") for n in before)
    assert not list(root.rglob("PWNED"))


def test_root_escapes_fail(api, tmp_path, monkeypatch):
    from gradio_client import handle_file

    client, _app, root = api
    # a dataset_info.json whose file_name is a path outside the root, and one with ../
    for i, file_name in enumerate((str(tmp_path / "secret.jsonl"), "../../secret.jsonl")):
        folder = root / f"lf{i}"
        folder.mkdir()
        (folder / "dataset_info.json").write_text(json.dumps({"s": {"file_name": file_name}}))
        for api_name, extra in (("/on_preview", ()), ("/on_check", (0,)), ("/on_learned", (0,))):
            status, shown = client.predict(f"lf{i}", *extra, api_name=api_name)
            assert "roctune data: error: --data lf" in status and "outside the workspace" in status, status
            assert SECRET not in json.dumps(shown) and SECRET not in status
    # the same through an upload: the uploaded dataset_info.json lands in uploads/, which is then a data folder
    info = tmp_path / "dataset_info.json"
    info.write_text(json.dumps({"s": {"file_name": str(tmp_path / "secret.jsonl")}}))
    client.predict(handle_file(str(info)), api_name="/on_upload")
    status, shown = client.predict("uploads:s", api_name="/on_preview")
    assert "outside the workspace" in status and SECRET not in json.dumps(shown)
    # a hub id that is also a folder in the server's working folder (outside the root)
    beside = tmp_path / "cwd"
    (beside / "org" / "name").mkdir(parents=True)
    (beside / "org" / "name" / "config.json").write_text("{}")
    monkeypatch.chdir(beside)
    status = client.predict("hi", "", "", "org/name", False, 8, 0, 1.0, "", [], [], api_name="/on_send")[3]  # no checkpoint
    status = html.unescape(status)
    assert "roctune chat: error: --model org/name: is a folder in the server's working folder" in status, status
    args = _train_args(client, {"model": "org/name", "data": "lf0", "output": "runs/x", "max_steps": 1})
    status = html.unescape(client.predict(*args, api_name="/on_start")[0])
    assert "roctune train: error: --" in status and "outside the workspace" in status, status


def test_scrub_never_replaces_a_file(api):
    client, _app, root = api
    data = write_jsonl(root / "d.jsonl", [{"instruction": "mail me at a@b.example", "input": "", "output": "ok"}])
    keep = write_jsonl(root / "keep.jsonl", [{"instruction": "mine", "input": "", "output": "mine"}])
    run = root / "runs" / "r"
    run.mkdir(parents=True)
    (run / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    before = files_in(root)
    for out in ("keep.jsonl", "runs/r/adapter_config.json", "d.jsonl"):
        status, _, _ = client.predict("d.jsonl", out, [], api_name="/on_scrub")
        assert "roctune data: error: " in status, status
    assert files_in(root) == before
    # with no output given the copy goes to a new name each time
    outs = [client.predict("d.jsonl", "", [], api_name="/on_scrub")[2] for _ in range(2)]
    assert outs == [str(root / "d.scrubbed.jsonl"), str(root / "d.scrubbed-2.jsonl")]
    assert open(keep).read() == before["keep.jsonl"].decode() and "a@b.example" not in open(outs[1]).read()
    assert open(data).read() == before["d.jsonl"].decode()
