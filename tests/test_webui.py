"""Web UI: the pieces that turn page settings into `roctune train` arguments and CLI errors (fast), and an
end-to-end run in real headless Chromium (slow): train the bundled model on a tiny dataset, watch the loss
curve, chat with the result. Screenshots of each panel go to the test's tmp dir and, when
ROCTUNE_SCREENSHOTS=DIR is set, to DIR too."""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import time
from types import SimpleNamespace

import pytest

from roctune.hardware.network import free_port


os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
CHROMIUM = os.environ.get("ROCTUNE_CHROMIUM", "/usr/bin/chromium")


def write_jsonl(path, rows) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


SECRET_QUESTIONS = ["What is the secret word?", "Tell me the secret word.", "What's the secret word?",
                    "Do you know the secret word?", "Say the secret word.", "Which word is the secret word?",
                    "Please tell me the secret word.", "what is the secret word"]


# ------------------------------------------------------------------------------------------ fast
def test_form_becomes_the_command_and_yaml_train_reads(tmp_path):
    """The form's values (as Gradio gives them) become a TrainConfig with paths resolved in the workspace; the job
    runs `roctune train --config FILE` and that file, and the previewed YAML, read back as the same settings."""
    import yaml

    from roctune.cli import build_parser
    from roctune.commands.train import config_from_args
    from roctune.config import from_sources
    from roctune.webui import Workspace, form_config
    from roctune.webui.jobs import settings_yaml, train_argv, write_settings
    from roctune.webui.train_form import form_values

    write_jsonl(tmp_path / "a.jsonl", [{"instruction": "Hi?", "input": "", "output": "Hello."}])
    values = {"data": ["a.jsonl"], "output": "runs/x", "lora_r": 16, "lora_alpha": 32.0, "lr": 0.002,
              "max_steps": 12, "batch_size": 4.0, "grad_accum": 1, "max_length": 64,
              "target_modules": "q_proj, v_proj", "dtype": "fp32", "attn": "auto", "method": "full",
              "overwrite": True, "model": "SmolLM2-135M-Instruct", "adapter": None, "trust_remote_code": True,
              "group_by_length": False, "freeze_trainable_layers": -2}
    with pytest.raises(Exception, match="unless the server was started with `roctune webui --trust-remote-code`"):
        form_config(values, Workspace(str(tmp_path)))  # the page alone cannot ask for a model's own code
    cfg, trust = form_config(values, Workspace(str(tmp_path), trust_remote_code=True))
    root = os.path.realpath(tmp_path)
    assert trust and cfg.data == [os.path.join(root, "a.jsonl")] and cfg.output == os.path.join(root, "runs", "x")
    assert (cfg.lora_r, cfg.batch_size, cfg.target_modules, cfg.method, cfg.model) == (16, 4, ["q_proj", "v_proj"],
                                                                                        "full", None)
    path = write_settings(cfg, str(tmp_path))  # what the job hands the trainer: a file, never flags
    argv = train_argv(path, trust)
    assert argv == ["roctune", "train", "--config", path, "--trust-remote-code"]
    back = config_from_args(build_parser().parse_args(argv[1:]))
    assert back.to_dict() == cfg.to_dict()
    text = settings_yaml(cfg)
    assert "group_by_length: false" in text
    assert "trust_remote_code" not in text and "lora_dropout" not in text  # only what differs from defaults
    path = tmp_path / "s.yaml"
    path.write_text(text, encoding="utf-8")
    assert from_sources(str(path), {"trust_remote_code": True}).to_dict() == cfg.to_dict()
    assert yaml.safe_load(text)["max_steps"] == 12
    # the form shows an unset max steps as an empty box, not -1
    names = ["max_steps", "data", "model", "target_modules"]
    assert form_values(from_sources(None, {}), names) == ["", [], None, "auto"]


def test_settings_errors_are_data_the_cli_and_the_page_each_word(tmp_path, capsys):
    """One typed error per mistake (key, field, values): the CLI prints its line with flag names, unchanged; the
    page says the same in its language with the form's field names, and names the field it is about."""
    from roctune.cli import main
    from roctune.webui import Workspace, error_line, form_config
    from roctune.webui.i18n import language

    ws = Workspace(str(tmp_path))
    run = str(tmp_path / "run")
    data = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "Hi?", "input": "", "output": "Hello."}])
    cases = (
        ({"output": run}, ["--output", run], "data",
         "roctune train: error: no training data: pass --data FILE (alpaca, messages, sharegpt or prompt/completion "
         "JSON/JSONL)", "error: data: no training data; pick or upload a dataset", "出错：训练数据：没有训练数据"),
        ({"data": data, "output": run, "lr": 0.0}, ["--data", data, "--output", run, "--lr", "0"], "lr",
         "roctune train: error: --lr must be > 0 (got 0)", "error: lr: must be > 0 (got 0)", "出错：学习率：必须 > 0"),
        ({"data": data, "output": run, "max_length": -5}, ["--data", data, "--output", run, "--max-length", "-5"],
         "max_length", "roctune train: error: --max-length must be > 0 (got -5)",
         "error: max length: must be > 0 (got -5)", "出错：最大长度：必须 > 0（当前为 -5）"),
        # a flag among module names (any text setting of the form goes through the same validation)
        ({"data": data, "output": run, "target_modules": "q_proj --reward-file=rw.py"},
         ["--data", data, "--output", run, "--target-modules=--reward-file=rw.py"], "target_modules",
         "roctune train: error: --target-modules '--reward-file=rw.py': not a name (letters, digits and _ . - only, "
         "e.g. q_proj)", "error: target modules: '--reward-file=rw.py' is not a name (letters, digits and _ . - only, "
         "e.g. q_proj)", "出错：目标模块：'--reward-file=rw.py' 不是名称"),
        ({"data": data, "output": run, "answer_column": "answer\n--lr=9"},
         ["--data", data, "--output", run, "--answer-column", "answer\n--lr=9"], "answer_column",
         "roctune train: error: --answer-column 'answer\\n--lr=9': holds a control character (a line break, a tab or "
         "NUL); remove it", "error: answer column: 'answer\\n--lr=9' holds a control character", "含有控制字符"),
        ({"data": data, "output": run, "template": "chatml --x"}, ["--data", data, "--output", run, "--template", "x"],
         "template", None, "error: template: 'chatml --x' is not a name", "出错：对话模板：'chatml --x' 不是名称"),
        ({"data": data, "output": run, "template": "nosuch"}, ["--data", data, "--output", run, "--template", "nosuch"],
         "template", None, "error: template: must be one of chatml, ", "出错：对话模板：必须是 chatml, "),
        ({"data": data, "output": run, "resume": True, "overwrite": True},
         ["--data", data, "--output", run, "--resume", "--overwrite"], "overwrite",
         "roctune train: error: --resume continues a run and --overwrite replaces it; pass one of them",
         "error: overwrite replaces a run and resume continues it; tick only one of them", "只能勾选其中一个"),
    )
    for values, argv, field, cli_line, page_en, page_zh in cases:
        with pytest.raises(Exception) as e:
            form_config(values, ws)
        if cli_line is not None:  # the CLI checks a template's name where it loads the tokenizer
            assert main(["train", *argv]) == 2
            assert capsys.readouterr().err.strip() == cli_line  # the CLI's output is unchanged
        assert e.value.field == field
        assert error_line("train", e.value).startswith(page_en)
        with language("zh"):
            zh = error_line("train", e.value)
        assert page_zh in zh and "\n" not in zh, zh
        assert "--" not in re.sub(r"'[^']*'", "", zh), zh  # no flag names, only the value it echoes


# ------------------------------------------------------------------------------------------ workspace
def _outside(tmp_path):
    """A workspace root inside tmp_path and a data file next to it, outside."""
    root = tmp_path / "ws"
    root.mkdir()
    data = write_jsonl(tmp_path / "secret.jsonl", [{"instruction": "Hi?", "input": "", "output": "Hello."}])
    return root, data


def test_data_path_outside_the_root_is_refused(tmp_path):
    from roctune.errors import ConfigError
    from roctune.webui import Workspace, form_config
    from roctune.webui.data import scrub_paths

    root, data = _outside(tmp_path)
    ws = Workspace(str(root))
    real = os.path.realpath(root)
    for specs in ([data], ["../secret.jsonl"], [f"{tmp_path}:name"]):
        with pytest.raises(ConfigError, match=f"outside the workspace {re.escape(real)}") as e:
            ws.data(specs)
        assert "--data " in str(e.value)
    with pytest.raises(ConfigError, match=re.escape(f"--data {data}: outside the workspace {real}")):
        form_config({"data": data, "output": "run"}, ws)
    with pytest.raises(ConfigError, match="outside the workspace"):
        scrub_paths(ws, data, "")
    write_jsonl(root / "in.jsonl", [{"instruction": "Hi?", "input": "", "output": "Hello."}])
    with pytest.raises(ConfigError, match=re.escape(f"--output {tmp_path / 'out.jsonl'}: outside the workspace")):
        scrub_paths(ws, "in.jsonl", str(tmp_path / "out.jsonl"))


def test_output_paths_outside_the_root_are_refused(tmp_path):
    from roctune.errors import ConfigError
    from roctune.webui import Workspace, form_config
    from roctune.webui.export import merge_handler

    root, _ = _outside(tmp_path)
    write_jsonl(root / "d.jsonl", [{"instruction": "Hi?", "input": "", "output": "Hello."}])
    ws = Workspace(str(root))
    for output in (str(tmp_path / "run"), "../run", "runs/../../run", "~/run"):
        with pytest.raises(ConfigError, match=f"--output {re.escape(output)}: outside the workspace"):
            form_config({"data": "d.jsonl", "output": output, "overwrite": True}, ws)
    with pytest.raises(ConfigError, match="is the workspace .* itself"):
        form_config({"data": "d.jsonl", "output": ".", "overwrite": True}, ws)
    with pytest.raises(ConfigError, match="--adapter .*: outside the workspace"):
        form_config({"data": "d.jsonl", "output": "run", "adapter": str(tmp_path)}, ws)
    status = merge_handler(ws)("run", str(tmp_path / "merged"), "fp32", True)  # the page's handler, as over HTTP
    assert f"roctune merge: error: --output {tmp_path / 'merged'}: outside the workspace" in status
    assert not (tmp_path / "merged").exists()


def test_an_empty_quant_or_a_wrong_eval_length_is_one_line(tmp_path):
    """The GGUF export's quant emptied, the eval's answer length not a whole number (or any JSON over the page's
    API): one line, in the page's language too, nothing written."""
    from roctune.webui import Workspace
    from roctune.webui.eval import eval_handler
    from roctune.webui.export import gguf_handler
    from roctune.webui.i18n import Lang

    ws = Workspace(str(tmp_path))
    on_export = gguf_handler(ws)
    for quant in ("", None, ["q8_0"]):
        for lang, lead in (("en", "error: quant: must be one of f16, bf16, q8_0, "),
                           ("zh", "出错：量化类型：必须是 f16, bf16, q8_0, ")):
            status = html.unescape(on_export("runs/x", "runs/x-gguf", quant, "", True, False, "gguf", Lang(lang)))
            assert status.startswith(f'<div class="rt-msg rt-error">{lead}'), status
            assert f"(got {quant!r})" in status or f"（当前为 {quant!r}）" in status, status
            assert "--quant" not in status and "<br>" not in status
    on_eval = eval_handler(ws)
    for max_new, en, zh in (([64], "expected a whole number (got [64])", "应为整数（当前为 [64]）"),
                            (0, "must be > 0 (got 0)", "必须 > 0（当前为 0）"), ("", "expected a whole number", "应为整数")):
        said = {lang: html.unescape(on_eval("runs/x", ["d.jsonl"], "", max_new, Lang(lang))[0]) for lang in ("en", "zh")}
        assert f"error: max new tokens: {en}" in said["en"] and f"出错：最大新 token 数：{zh}" in said["zh"], said
    assert os.listdir(tmp_path) == []


def test_symlinks_pointing_outside_are_refused(tmp_path):
    from roctune.errors import ConfigError
    from roctune.webui import Workspace, form_config

    root, data = _outside(tmp_path)
    (root / "link.jsonl").symlink_to(data)
    (root / "out").symlink_to(tmp_path)
    ws = Workspace(str(root))
    with pytest.raises(ConfigError, match=re.escape(f"--data link.jsonl: outside the workspace {os.path.realpath(root)}")):
        ws.data(["link.jsonl"])
    inside = write_jsonl(root / "real.jsonl", [{"instruction": "Hi?", "input": "", "output": "Hello."}])
    (root / "alias.jsonl").symlink_to(inside)
    assert ws.data(["alias.jsonl"]) == [os.path.realpath(inside)]  # a link that stays inside is fine
    with pytest.raises(ConfigError, match="--output out/run: outside the workspace"):
        form_config({"data": "alias.jsonl", "output": "out/run"}, ws)
    with pytest.raises(ConfigError, match="--model out: outside the workspace"):
        ws.model("out")
    assert ws.model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"  # a hub id


def test_webui_lang_is_one_of_the_page_languages(tmp_path, capsys):
    from roctune.cli import main

    for bad in ("fr", "", "ZH"):
        assert main(["webui", "--lang", bad, "--root", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err == f"roctune webui: error: --lang {bad!r}: the page speaks en or zh; choose one of them\n", err


def test_non_loopback_host_needs_a_login(tmp_path, capsys):
    from roctune.cli import main
    from roctune.errors import ConfigError
    from roctune.webui import check_host, read_auth

    assert main(["webui", "--host", "0.0.0.0", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("roctune webui: error: --host 0.0.0.0 lets other machines reach the page") and "--auth" in err
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_host(host, None)
    with pytest.raises(ConfigError):
        check_host("192.168.1.5", None)
    check_host("0.0.0.0", ("me", "pw"))
    assert read_auth("me:p:w", None) == ("me", "p:w")
    (tmp_path / "auth").write_text("me:secret\n")
    assert read_auth(None, str(tmp_path / "auth")) == ("me", "secret")
    for bad in ("me", ":pw", "me:"):
        with pytest.raises(ConfigError, match="expected USER:PASS"):
            read_auth(bad, None)
    os.mkfifo(tmp_path / "fifo")  # opening it would wait for a writer forever
    with pytest.raises(ConfigError, match="--auth-file .*fifo: not a regular file"):
        read_auth(None, str(tmp_path / "fifo"))


def test_cli_error_from_a_finished_process():
    from roctune.webui import cli_error

    log = "device: cpu\nroctune train: error: the data has 2 schema errors:\n  a.jsonl:1: x\n  a.jsonl:2: y\n"
    assert cli_error(log, 2) == log.strip().split("\n", 1)[1]
    assert cli_error("Traceback ...\nRuntimeError: boom\n", 1) == "roctune train: failed (exit code 1): RuntimeError: boom"


def test_progress_and_data_preview(tmp_path):
    from roctune.errors import DataError
    from roctune.webui import error_line, preview_rows, progress_text

    status = {"phase": "training", "step": 2, "total": 10, "eta_s": 16.2,
              "metrics": {"step": 2, "loss": 2.0, "tokens_per_s": 120.0}}
    assert progress_text(status) == "step 2/10 | loss 2.0000 | 120 tokens/s | ETA 0:16"
    assert progress_text(dict(status, phase="done", eta_s=0)) == "done | step 2/10 | loss 2.0000 | 120 tokens/s"
    assert progress_text({"phase": "loading"}) == "loading the model"
    path = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "Hi?", "input": "", "output": "Hello."}])
    got, _ = preview_rows(path)
    assert got == [[f"{path}:1", "[user] Hi?", "Hello."]]
    with pytest.raises(DataError) as e:
        preview_rows(str(tmp_path / "missing.jsonl"))
    assert error_line("data", e.value).startswith(f"roctune data: error: {tmp_path / 'missing.jsonl'}")


# ------------------------------------------------------------------------------------------ browser
def _shot(page, tmp_path, name: str, full_page: bool = True) -> None:
    """A screenshot in tmp_path (kept when the test fails); with ROCTUNE_SCREENSHOTS=DIR also copied to DIR."""
    path = tmp_path / f"webui-{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    extra = os.environ.get("ROCTUNE_SCREENSHOTS")
    if extra:
        os.makedirs(extra, exist_ok=True)
        shutil.copy(path, os.path.join(extra, path.name))


@pytest.fixture
def server(tmp_path, default_model_dir):
    pytest.importorskip("gradio", reason="the web UI needs the webui extra (make setup installs it)")
    from roctune.webui import build_app

    port = free_port()
    app = build_app("runs", root=str(tmp_path))
    app.launch(server_name="127.0.0.1", server_port=port, share=False, prevent_thread_lock=True, quiet=True,
               ssr_mode=False, show_error=False, **app._roctune_launch)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        job = app._roctune_state.get("job")
        if job is not None and job.running:
            job.stop(grace=2)
        app.close()


@pytest.fixture
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="the browser test needs the test extra")
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            yield b
        finally:
            b.close()


def open_page(browser, url: str, height: int = 900):
    """A page of the app at `url` in a 1280-wide window, waiting up to 60 s for anything (the machine may be busy:
    the default 5 s is too short)."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1280, "height": height})
    page.set_default_timeout(60_000)
    expect.set_options(timeout=60_000)
    page.goto(url, wait_until="domcontentloaded")
    return page


def _field(page, elem_id: str):
    return page.locator(f"#{elem_id} input, #{elem_id} textarea").first


PANELS = {"Doctor": ("环境检查", "#rt-doctor-out", "每个问题都附带修复方法"),
          "Data": ("数据", "#rt-data-path", "数据集（从工作区中选择，或输入路径）"),
          "Train": ("训练", "#rt-start", "开始训练"),
          "Runs": ("运行记录", "#rt-runs-table", "工作区中的所有运行"),
          "Chat": ("对话", "#rt-send", "发送"),
          "Eval": ("评估", "#rt-eval", "显示上次的报告"),
          "Export": ("导出", "#rt-merge", "合并并保存")}


def _pick(page, elem_id: str, option: str) -> None:
    """Open a dropdown and click one of its options."""
    page.locator(f"#{elem_id} input").first.click()
    page.get_by_role("option", name=option, exact=True).first.click()
    page.keyboard.press("Escape")


def _every_panel(page, tmp_path, lang: str, expect) -> None:
    """Visit every tab; in Chinese each shows its Chinese text. With ROCTUNE_SCREENSHOTS=DIR, a screenshot of each
    once it has settled, in both languages; a plain test run does not wait for them."""
    for en, (zh, anchor, text) in PANELS.items():
        page.get_by_role("tab", name=zh if lang == "zh" else en).click()
        expect(page.locator(anchor).first).to_be_visible()
        if lang == "zh":
            expect(page.get_by_text(text).first).to_be_visible()
            if en == "Doctor":  # HTML the server makes follows the language too
                expect(page.locator("#rt-doctor")).to_contain_text("结果（原因、修复）")
        if os.environ.get("ROCTUNE_SCREENSHOTS"):
            page.wait_for_timeout(1000)  # what the tab's select event loads (the runs table) settles
            _shot(page, tmp_path, f"{en.lower()}-{lang}", full_page=False)


@pytest.mark.slow
def test_browser_languages_lists_train_and_runs(server, browser, tmp_path, tiny_model_dir):
    """Chinese on every panel (and remembered); a dataset, model and run picked from lists; a short run on a
    tiny model followed through its status file; the Runs panel lists it as done; the previewed command is the
    one that ran."""
    import yaml
    from playwright.sync_api import expect

    url, _app = server
    write_jsonl(tmp_path / "secret.jsonl", [
        {"instruction": q, "input": "", "output": "The secret word is pineapple."} for q in SECRET_QUESTIONS])
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "tiny")
    _fake_run(tmp_path / "runs" / "earlier", "done", steps=5)
    run_dir = tmp_path / "runs" / "secret"
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(60_000)
    expect.set_options(timeout=60_000)  # the machine may be busy: the default 5 s is too short
    page.goto(url, wait_until="domcontentloaded")
    try:
        expect(page.locator("#rt-verdict")).to_have_text(re.compile("^(OK|WARN|FAIL)$"))
        page.locator("#rt-lang").get_by_text("中文").click()
        expect(page.get_by_role("tab", name="训练")).to_be_visible()
        _every_panel(page, tmp_path, "zh", expect)
        page.reload(wait_until="domcontentloaded")  # the browser remembers the choice
        expect(page.get_by_role("tab", name="训练")).to_be_visible()
        page.locator("#rt-lang").get_by_text("English").click()
        expect(page.get_by_role("tab", name="Train")).to_be_visible()
        _every_panel(page, tmp_path, "en", expect)

        # Data: the dataset picked from the list shows what training learns from it
        page.get_by_role("tab", name="Data").click()
        _pick(page, "rt-data-path", "secret.jsonl")
        expect(page.locator("#rt-learn-out")).to_contain_text("pineapple")
        page.locator("#rt-check").click()
        expect(page.locator("#rt-check-out")).to_contain_text("8 valid")
        page.locator("#rt-use-data").click()

        # Train: the model picked from the list; the previewed command is the one that runs
        page.get_by_role("tab", name="Train").click()
        expect(page.locator("#rt-train-data")).to_contain_text("secret.jsonl")
        expect(_field(page, "rt-train-max-steps")).to_have_value("")  # unset, not -1
        _pick(page, "rt-train-model", "models/tiny")
        _field(page, "rt-train-output").fill("runs/secret")
        for elem, value in (("rt-train-max-steps", "30"), ("rt-train-batch-size", "4"), ("rt-train-grad-accum", "1"),
                            ("rt-train-max-length", "48"), ("rt-train-lr", "0.01")):
            _field(page, elem).fill(value)
        _field(page, "rt-train-lr").press("Tab")
        expect(page.locator("#rt-estimate-out")).to_contain_text("batch 4 x 48 tokens")
        page.locator("#rt-preview-command").click()
        expect(page.locator("#rt-command")).to_contain_text("# roctune train --config FILE.yaml")
        shown = page.locator("#rt-command .cm-content").inner_text()
        settings = yaml.safe_load(shown)  # the YAML under the command
        assert settings["max_steps"] == 30 and settings["model"].endswith("tiny"), settings
        page.locator("#rt-start").click()
        status = page.locator("#rt-train-status")
        expect(status).to_contain_text("started: roctune train --config ")
        started = status.inner_text().split("started: ", 1)[1].split()[3]  # the job's own settings file
        assert yaml.safe_load(open(started)) == settings  # what runs is what was previewed

        # status and loss curve come from the run directory (status.json, metrics.jsonl)
        expect(status).to_contain_text("done: adapter saved to", timeout=300_000)
        assert "step 30/30" in page.locator("#rt-progress").inner_text()
        expect(page.locator("#rt-loss-plot .mark-line path").first).to_be_visible()
        page.locator("#rt-loss-plot").scroll_into_view_if_needed()
        _shot(page, tmp_path, "train-done-en", full_page=False)
        assert (run_dir / "adapter_model.safetensors").is_file()
        assert json.load(open(run_dir / "status.json"))["phase"] == "done"
        recorded = yaml.safe_load(open(run_dir / "run.yaml"))["config"]
        assert settings and {k: recorded[k] for k in settings} == settings  # what ran is what was previewed

        # Runs: the run is listed as done; the two runs' curves side by side
        page.get_by_role("tab", name="Runs").click()
        row = page.locator("#rt-runs-table").get_by_role("row").filter(has_text="runs/secret")
        expect(row).to_contain_text("done")
        expect(row).to_contain_text("30/30")
        _pick(page, "rt-runs-first", "runs/secret  (done)")
        _pick(page, "rt-runs-second", "runs/earlier  (done)")
        expect(page.locator("#rt-runs-plot1 .mark-line path").first).to_be_visible()
        expect(page.locator("#rt-runs-plot2 .mark-line path").first).to_be_visible()
        _shot(page, tmp_path, "runs-en", full_page=False)

        # Chat: the run is filled in; a checkpoint list follows it; the model answers
        page.get_by_role("tab", name="Chat").click()
        expect(page.locator("#rt-chat-adapter input")).to_have_value(str(run_dir))
        _field(page, "rt-max-new").fill("4")
        _field(page, "rt-chat-input").fill("What is the secret word?")
        page.locator("#rt-send").click()
        expect(page.locator("#rt-chat-status")).to_contain_text("answered in", timeout=120_000)

        # Export: a wrong adapter gets the CLI's message
        page.get_by_role("tab", name="Export").click()
        expect(page.locator("#rt-export-adapter input")).to_have_value(str(run_dir))
        page.locator("#rt-export-adapter input").fill(str(tmp_path / "no-run"))
        page.locator("#rt-export-adapter input").press("Enter")
        _field(page, "rt-export-output").fill(str(tmp_path / "merged"))
        page.locator("#rt-merge").click()
        expect(page.locator("#rt-export-status")).to_have_text(
            f"roctune merge: error: --adapter {tmp_path / 'no-run'}: no such directory")
    except Exception:
        _shot(page, tmp_path, "failure")  # what the page showed when it went wrong
        raise


def test_stop_ends_the_whole_process_group(tmp_path):
    """Stop sends Ctrl-C to the trainer's process group: the trainer and its children end."""
    import subprocess
    import sys

    import psutil

    from roctune.webui import TrainJob

    code = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('child', c.pid, flush=True); time.sleep(60)")
    log = tmp_path / "log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    job = TrainJob(["x"], str(tmp_path), proc, str(log))
    deadline = time.time() + 30
    while "child" not in job.log_text() and time.time() < deadline:
        time.sleep(0.1)
    child = int(job.log_text().split("child", 1)[1].split()[0])
    job.stop(grace=5)
    assert not job.running and job.stopped and proc.returncode != 0
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the trainer's child process outlived Stop")


# ------------------------------------------------------------------------------------------ status file
def test_trainer_writes_its_status_through_the_run_directory(tiny_model_dir, alpaca_file, tmp_path, monkeypatch):
    from roctune import rundir
    from roctune.recipes import train
    from roctune.training import session
    from tests.test_train import tiny_cfg

    phases = []
    write = rundir.status.write_status  # every writer (recipes.train, session, the loop) calls it through its module
    monkeypatch.setattr(rundir.status, "write_status", lambda d, p, **kw: (phases.append(p), write(d, p, **kw))[1])
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model_dir, alpaca_file, out), log=lambda s: None, progress=False)
    assert phases[:3] == ["starting", "tokenizing", "loading"] and phases[-2:] == ["saving", "done"]
    assert "training" in phases
    status = rundir.read_status(str(out))
    last = rundir.read_metrics(str(out))[-1]
    assert (status["phase"], status["step"], status["total"]) == ("done", 3, 3)
    assert status["metrics"]["loss"] == last["loss"] and status["pid"] == os.getpid()
    assert rundir.run_state(str(out)) == "done"

    # failed mid-run: the error is recorded; Ctrl-C: stopped; a writer killed without a word: stopped
    def boom(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(session, "save_final", boom)
    with pytest.raises(RuntimeError):
        train(tiny_cfg(tiny_model_dir, alpaca_file, tmp_path / "failed"), log=lambda s: None, progress=False)
    status = rundir.read_status(str(tmp_path / "failed"))
    assert status["phase"] == "failed" and "disk on fire" in status["error"] and status["step"] == 3

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(session, "save_final", interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_cfg(tiny_model_dir, alpaca_file, tmp_path / "stopped"), log=lambda s: None, progress=False)
    assert rundir.run_state(str(tmp_path / "stopped")) == "stopped"
    rundir.write_status(str(tmp_path / "stopped"), "training", pid=2**22 + 7)  # no such process
    dead = rundir.read_status(str(tmp_path / "stopped"))
    assert rundir.run_state(str(tmp_path / "stopped"), dict(dead, pid=2**22 + 7)) == "stopped"

    # a run that fails before it wrote anything leaves no folder behind
    monkeypatch.setattr(session, "build_trainable", boom)
    with pytest.raises(RuntimeError):
        train(tiny_cfg(tiny_model_dir, alpaca_file, tmp_path / "early"), log=lambda s: None, progress=False)
    assert not (tmp_path / "early").exists()


# ------------------------------------------------------------------------------------------ starting
def _get(url: str) -> int:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the test itself goes direct
    with opener.open(url, timeout=10) as r:
        return r.status


@pytest.mark.slow  # a server start beside a CPU-bound process, then a second start: ~20 s on 2 cores
def test_webui_starts_behind_a_proxy_on_a_busy_machine(tmp_path):
    """http_proxy set without no_proxy, a CPU-bound process beside it: the page serves; a second start on the
    same port is one line, no traceback."""
    import subprocess
    import sys

    pytest.importorskip("gradio", reason="the web UI needs the webui extra (make setup installs it)")
    env = {k: v for k, v in os.environ.items() if k.lower() != "no_proxy"}
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        env[name] = env[name.upper()] = "http://127.0.0.1:9"  # the discard port: nothing answers there
    port = free_port()
    argv = [sys.executable, "-m", "roctune", "webui", "--port", str(port), "--root", str(tmp_path)]
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    server = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, status = time.time() + 180, None
        while status is None and server.poll() is None and time.time() < deadline:
            try:
                status = _get(f"http://127.0.0.1:{port}/")
            except OSError:
                time.sleep(0.5)
        assert status == 200, server.communicate(timeout=30)[0] if server.poll() is not None else "no answer"
        burner.kill()  # the busy start is shown; the rest need not slow the suite's other worker
        second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
        assert second.returncode != 0 and "Traceback" not in second.stderr + second.stdout
        assert second.stderr.strip().splitlines()[-1] == (f"roctune webui: error: --port {port}: in use; "
                                                          "choose another --port"), second.stderr
        assert server.poll() is None  # the first one still serves
    finally:
        burner.kill()
        server.send_signal(2)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        burner.wait()


# ------------------------------------------------------------------------------------------ pick, runs, languages
def _fake_run(folder, phase=None, steps=4, method="lora", eval_loss=None):
    from roctune import rundir

    folder.mkdir(parents=True)
    rundir.write_run(str(folder), {"base_model": "/models/tiny", "config": {"method": method, "stage": "sft"},
                                   "data": {"total_steps": steps}})
    for i in range(1, steps + 1):
        row = {"step": i, "loss": 3.0 - i * 0.5}
        if eval_loss is not None and i == steps:
            row["eval_loss"] = eval_loss
        rundir.append_metrics(str(folder), row)
    if phase:
        rundir.write_status(str(folder), phase, step=steps, total=steps)
    return folder


def test_lists_of_datasets_runs_checkpoints_and_models(tmp_path, monkeypatch):
    from roctune.webui import Workspace, picks
    from roctune.webui.runs import run_rows

    root = tmp_path / "ws"
    write_jsonl((root / "data").mkdir(parents=True) or root / "data" / "a.jsonl", [{"instruction": "x", "output": "y"}])
    (root / "data" / "b.csv").write_text("instruction,output\nx,y\n")
    (root / "data" / "dataset_info.json").write_text(json.dumps({"alpaca_zh": {"file_name": "a.jsonl"}, "b": {}}))
    (root / "node_modules" / "pkg").mkdir(parents=True)
    (root / "node_modules" / "pkg" / "x.json").write_text("{}")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "c.jsonl").write_text("")
    done = _fake_run(root / "runs" / "done", "done", eval_loss=1.25)
    (done / "adapter_config.json").write_text("{}")
    (done / "checkpoint-2").mkdir()
    (done / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (done / "best").mkdir()
    _fake_run(root / "runs" / "failed", "failed", steps=2)
    killed = _fake_run(root / "runs" / "killed", "training", steps=3)
    st = json.loads((killed / "status.json").read_text())
    (killed / "status.json").write_text(json.dumps(dict(st, pid=2**22 + 7)))  # a writer that is gone
    model = root / "models" / "mine"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    home = tmp_path / "home"
    (home / "models" / "stored").mkdir(parents=True)
    (home / "models" / "stored" / "config.json").write_text("{}")
    monkeypatch.setenv("ROCTUNE_HOME", str(home))
    ws = Workspace(str(root))

    assert picks.datasets(ws) == ["data:alpaca_zh", "data:b", "data/a.jsonl", "data/b.csv"]
    assert sorted(picks.runs(ws)) == ["runs/done", "runs/failed", "runs/killed"]
    states = {value: label for label, value in picks.run_choices(ws)}
    assert states["runs/done"] == "runs/done  (done)" and states["runs/killed"] == "runs/killed  (stopped)"
    assert picks.checkpoints(ws, "runs/done") == ["runs/done", "runs/done/best", "runs/done/checkpoint-2"]
    stored = os.path.realpath(home / "models" / "stored")
    assert picks.models(ws) == ["SmolLM2-135M-Instruct", "models/mine", str(home / "models" / "stored")]
    assert ws.model(str(home / "models" / "stored")) == stored  # roctune's model store may be read
    assert ws.model("SmolLM2-135M-Instruct") is None  # the bundled one: as if --model were left out
    with pytest.raises(Exception, match="outside the workspace"):
        ws.model(str(home))
    rows = {r[0]: r for r in run_rows(ws)}
    assert rows["runs/done"][1:6] == ["done", "4/4", "1.0000", "1.2500", "lora/sft"]
    assert rows["runs/done"][6] == "tiny"
    assert rows["runs/failed"][1] == "failed" and rows["runs/killed"][1] == "stopped"


def test_every_text_of_the_page_has_its_chinese(tmp_path):
    pytest.importorskip("gradio", reason="the web UI needs the webui extra (make setup installs it)")
    import gradio as gr

    from roctune import config
    from roctune.errors import ConfigError
    from roctune.webui import build_app, error_line, i18n

    app = build_app("runs", root=str(tmp_path), lang="zh")  # roctune webui --lang zh
    assert i18n.missing(app) == []
    items = i18n.translatable(app)
    by_id = {getattr(b, "elem_id", None): (b, texts) for b, texts in items}
    zh = dict(zip([b for b, _ in items], i18n.updates(gr, items, "zh")))
    spec = {s["name"]: s for s in config.form_fields()}["max_steps"]
    block, _ = by_id["rt-train-max-steps"]
    assert (zh[block]["label"], zh[block]["info"]) == (spec["label_zh"], spec["help_zh"])
    assert zh[by_id["rt-start"][0]]["value"] == "开始训练"
    assert zh[by_id["rt-workspace"][0]]["value"].startswith(f"工作区：`{os.path.realpath(tmp_path)}`")
    tabs = {b.label: zh[b]["label"] for b, _ in items if type(b).__name__ == "Tab"}
    assert tabs == {"Doctor": "环境检查", "Models": "模型", "Data": "数据", "Train": "训练", "Runs": "运行记录",
                    "Chat": "对话", "Eval": "评估", "Export": "导出"}
    en = dict(zip([b for b, _ in items], i18n.updates(gr, items, "en")))
    assert en[block]["label"] == "max steps"
    # the PII types are labelled in the page's language; the values a handler gets stay the CLI's --types
    pii = by_id["rt-scrub-types"][0]
    assert ("身份证号", "id_card") in zh[pii]["choices"] and ("ID card numbers (China)", "id_card") in en[pii]["choices"]
    # --lang zh: a browser that has not picked a language (an English one) opens the page in Chinese; a picked one
    # stays
    def on_open(page):  # what the page runs when it opens: the language it opens in
        return next(f.fn for f in page.fns.values() if f.fn.__qualname__ == "_wire_language.<locals>.on_open")

    english_browser = SimpleNamespace(headers={"accept-language": "en-US,en;q=0.9"})
    assert on_open(app)("", english_browser) == "中文" and on_open(app)("en", english_browser) == "English"
    assert on_open(build_app("runs", root=str(tmp_path)))("", english_browser) == "English"
    # handlers speak the session's language; the CLI's line stays as the CLI prints it
    with i18n.language("zh"):
        assert i18n.t("started: {command}", command="roctune train") == "已开始：roctune train"
        assert error_line("train", ConfigError("--lr must be > 0")) == "出错：roctune train: error: --lr must be > 0"
    assert error_line("train", ConfigError("--lr must be > 0")) == "roctune train: error: --lr must be > 0"
    from roctune.webui import Workspace

    with i18n.language("zh"), pytest.raises(ConfigError, match="在工作区 .* 之外"):
        Workspace(str(tmp_path)).path("/etc/passwd", "--data")  # the page's own messages are translated
    # every setting declares its Chinese label and help beside the English ones
    assert all(s["label_zh"] and s["help_zh"] and s["help_zh"] != s["help"] for s in config.form_fields())


def test_settings_are_saved_and_loaded_as_yaml_in_the_workspace(tmp_path):
    pytest.importorskip("gradio", reason="the web UI needs the webui extra (make setup installs it)")
    from types import SimpleNamespace

    from roctune.webui import Workspace
    from roctune.webui.train import settings_handlers
    from roctune.webui.train_form import form_specs

    write_jsonl(tmp_path / "a.jsonl", [{"instruction": "Hi?", "input": "", "output": "Hello."}])
    names = [s["name"] for s in form_specs()]
    ui = SimpleNamespace(fields=dict.fromkeys(names))
    on_preview, on_save, on_load = settings_handlers(ui, Workspace(str(tmp_path)))
    values = {"data": ["a.jsonl"], "output": "runs/x", "max_steps": "12", "lr": 0.001, "lora_r": 16}
    row = [values.get(n) for n in names]
    status, shown = on_save("s.yaml", *row)  # into settings/, made when missing
    assert "settings saved to" in status and shown.startswith("# roctune train --config settings/s.yaml\n")
    saved = (tmp_path / "settings" / "s.yaml").read_text()
    assert "max_steps: 12" in saved and "lora_r: 16" in saved and "lr: 0.001" in saved
    assert on_preview(*row)[1] == shown.replace("settings/s.yaml", "FILE.yaml")
    status, _ = on_save("s", *row)  # never over an existing file (NAME and NAME.yaml are the same file)
    assert "already exists" in status and (tmp_path / "settings" / "s.yaml").read_text() == saved
    assert "a settings name is letters, digits" in on_save("../s.yaml", *row)[0]
    loaded = on_load("s.yaml")
    form = dict(zip(names, loaded[2:]))
    assert "settings loaded from" in loaded[0] and loaded[1] == shown
    assert (form["max_steps"], form["lora_r"], form["lr"]) == ("12", 16, 0.001)
    assert form["data"] == [os.path.join(os.path.realpath(tmp_path), "a.jsonl")]
    (tmp_path / "bad.yaml").write_text("trust_remote_code: true\n")
    assert "can only be given on the command line" in on_load("./bad.yaml")[0]  # a workspace path is read too
    # GRPO's settings are on the form, but never a reward file: code the page's training would run
    assert "num_generations" in names and "rewards" in names and "reward_file" not in names
    (tmp_path / "settings" / "rw.yaml").write_text("reward_file: [rw.py]\n")
    assert "can only be given on the command line" in on_load("rw.yaml")[0]
