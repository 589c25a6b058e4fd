"""The Chat panel with a picture, walked in headless Chromium as a person uses it, in English and Chinese: a tiny
SmolVLM-layout model picked from the list, a picture uploaded beside the message, the answer streamed and the
picture shown in the history; a second message keeps the picture in the conversation (the server's checked copy);
a picture for a text-only model is refused in the status line."""
from __future__ import annotations

import re
import shutil

import pytest

from test_webui import _field, _pick, _shot, browser, open_page, server  # noqa: F401 - pytest fixtures
from vision_models import picture


@pytest.mark.slow
def test_chat_with_an_uploaded_picture_in_both_languages(server, browser, tmp_path, tiny_vlm_dir,  # noqa: F811
                                                         tiny_model_dir, monkeypatch):
    from playwright.sync_api import expect

    import roctune.webui.chat as chat

    seen = []
    real = chat.stream_answer
    monkeypatch.setattr(chat, "stream_answer", lambda loaded, msgs, kw, use: seen.append(msgs) or real(loaded, msgs,
                                                                                                     kw, use))
    url, _app = server
    shutil.copytree(tiny_vlm_dir, tmp_path / "models" / "tiny-vlm")
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "tiny")
    picture().save(tmp_path / "squares.png")
    page = open_page(browser, url, height=1000)
    try:
        expect(page.locator("#rt-verdict")).to_have_text(re.compile("^(OK|WARN|FAIL)$"))  # the page is live
        page.locator("#rt-lang").get_by_text("中文").click()
        page.get_by_role("tab", name="对话").click()
        expect(page.locator("#rt-chat-image").get_by_text("图片（视觉语言模型）")).to_be_visible()
        page.locator("#rt-lang").get_by_text("English").click()
        expect(page.locator("#rt-chat-image").get_by_text("picture (a vision-language model)")).to_be_visible()

        _pick(page, "rt-chat-model", "models/tiny-vlm")
        _field(page, "rt-max-new").fill("4")
        page.locator("#rt-chat-image input[type=file]").set_input_files(str(tmp_path / "squares.png"))
        expect(page.locator("#rt-chat-image img").first).to_be_visible()
        _field(page, "rt-chat-input").fill("What colours are these?")
        page.locator("#rt-send").click()
        expect(page.locator("#rt-chat-status")).to_contain_text("answered in", timeout=120_000)
        expect(page.locator("#rt-ft-bot img").first).to_be_visible()  # the picture in the history
        expect(page.locator("#rt-chat-image img")).to_have_count(0)  # the upload is cleared for the next message
        _shot(page, tmp_path, "chat-picture-en", full_page=False)
        _field(page, "rt-chat-input").fill("And the top left one?")
        page.locator("#rt-send").click()
        for _ in range(1200):  # the status still reads the first answer's "answered in" until the second starts
            if len(seen) > 1:
                break
            page.wait_for_timeout(100)
        expect(page.locator("#rt-chat-status")).to_contain_text("answered in", timeout=120_000)
        first, second = seen[0][-1]["content"], seen[1][0]["content"]
        assert [p["type"] for p in first] == ["image", "text"] and first[1]["text"] == "What colours are these?"
        assert list(second[0]["image"].getdata()) == list(picture().getdata())  # the server's copy, both turns
        assert seen[1][-1] == {"role": "user", "content": "And the top left one?"}

        page.locator("#rt-lang").get_by_text("中文").click()
        _pick(page, "rt-chat-model", "models/tiny")
        page.locator("#rt-chat-image input[type=file]").set_input_files(str(tmp_path / "squares.png"))
        _field(page, "rt-chat-input").fill("hi")
        page.locator("#rt-send").click()
        expect(page.locator("#rt-chat-status")).to_contain_text("is a text-only model (no vision tower)")
        _shot(page, tmp_path, "chat-picture-refused-zh", full_page=False)
    except Exception:
        _shot(page, tmp_path, "failure")
        raise
