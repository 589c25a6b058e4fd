"""The web UI's Models panel in a real browser (Playwright + Debian's chromium), on the Chinese page: the model list,
a download from a local server in the Hugging Face hub's layout (tests/test_models_hub.py's), a page that goes away
while the hub drips the download (the download stops and the panel takes the next one, which resumes it), and the
downloaded model becoming the Train panel's model."""
from __future__ import annotations

import os
import re
import time

import pytest

from roctune.webui import hub_panel
from test_models_hub import REPO_ID, WEIGHTS, Hub, tiny_repo  # noqa: F401 - tiny_repo is a fixture used below
from test_webui import _field, browser, open_page, server  # noqa: F401 - fixtures used below


@pytest.fixture
def hub(tiny_repo, tmp_path, monkeypatch):  # noqa: F811 - the fixture imported above
    import huggingface_hub.constants

    served = Hub(tiny_repo)
    monkeypatch.setenv("HF_ENDPOINT", served.url)  # roctune.hub reads it at each pull
    monkeypatch.setenv("ROCTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # conftest's offline switch
    yield served
    served.server.shutdown()
    served.server.server_close()


def test_models_panel_downloads_a_model_that_becomes_the_train_model(hub, server, browser, tmp_path):  # noqa: F811
    from playwright.sync_api import expect

    url, _app = server
    page = open_page(browser, url)
    try:
        expect(page.locator("#rt-verdict")).to_have_text(re.compile("^(OK|WARN|FAIL)$"))  # the page has loaded
        page.locator("#rt-lang").get_by_text("中文").click()
        page.get_by_role("tab", name="模型").click()
        table = page.locator("#rt-models-table")
        expect(table).to_contain_text("Qwen/Qwen2.5-0.5B-Instruct")
        expect(table).to_contain_text("许可证")
        first = table.locator("tbody tr").first
        expect(first).to_contain_text("否")  # not downloaded

        box = _field(page, "rt-pull-id")
        box.fill(REPO_ID)
        box.press("Enter")
        hub.drip, hub.drip_after = {WEIGHTS: 0.05}, 1_000_000  # a hub that drips the weights after 1 MB
        page.locator("#rt-pull").click()
        expect(page.locator("#rt-pull-status")).to_contain_text("正在下载")
        deadline = time.monotonic() + 30
        while hub.sent.get(WEIGHTS, 0) <= 1_000_000 and time.monotonic() < deadline:  # the drip has begun
            time.sleep(0.1)
        page.reload(wait_until="domcontentloaded")  # the page goes away mid-download: the download stops
        deadline = time.monotonic() + 20
        while hub_panel._running and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not hub_panel._running, "the abandoned download still holds the Models panel"
        hub.drip = {}
        # the reloaded page is live again, in the language the browser remembers (it may show English first)
        expect(page.locator("#rt-verdict")).to_have_text(re.compile("^(正常|警告|失败)$"))
        page.get_by_role("tab", name="模型").click()
        box = _field(page, "rt-pull-id")
        box.fill(REPO_ID)
        box.press("Enter")
        page.locator("#rt-pull").click()  # the next download is taken, and resumes the part that came
        folder = os.path.join(str(tmp_path / "home"), "models", "tiny-org--tiny-llama")
        expect(page.locator("#rt-pull-status")).to_contain_text("已下载到")
        expect(page.locator("#rt-pull-status")).to_contain_text(folder)
        expect(table.locator("tr", has_text=REPO_ID)).to_contain_text("是")
        assert os.path.isfile(os.path.join(folder, "roctune_pulled.json"))
        ranges = [rng for method, name, rng in hub.requests if method == "GET" and name == WEIGHTS]
        assert ranges[0] is None and int(ranges[-1].split("=")[1].split("-")[0]) >= 1_000_000, ranges

        page.get_by_role("tab", name="训练").click()
        expect(_field(page, "rt-train-model")).to_have_value(re.compile(re.escape(folder)))
        page.get_by_role("tab", name="模型").click()
        page.screenshot(path=str(tmp_path / "models-zh.png"), full_page=True)
    finally:
        page.close()
