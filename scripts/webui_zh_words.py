"""The English words on the web UI's Chinese page, counted panel by panel (issue 46's "no English word outside the
allow-list, doctor's report included").

Serves the page of whichever roctune is on PYTHONPATH (this checkout's, or another's to compare) on an empty
workspace, opens it in Debian's chromium with a zh-CN locale, unfolds everything folded on each panel (on main the
doctor's findings sat in a folded "details (English)") and prints, per panel, the visible ASCII words outside the
allow-list of tests/test_webui_zh.py (the same rules the browser test asserts; the allow-list is always this
checkout's, so two versions are counted alike). Takes about a minute:

    flock /tmp/cpu.lock env PYTHONPATH=$PWD .venv/bin/python scripts/webui_zh_words.py
    flock /tmp/cpu.lock env PYTHONPATH=/path/to/other/checkout .venv/bin/python scripts/webui_zh_words.py
"""
from __future__ import annotations

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(HERE, "tests"))  # after PYTHONPATH: the roctune counted is the one it names
CHROMIUM = os.environ.get("ROCTUNE_CHROMIUM", "/usr/bin/chromium")
TABS = ("环境检查", "模型", "数据", "训练", "运行记录", "对话", "评估", "导出")
UNFOLD = "() => document.querySelectorAll('details').forEach(d => { d.open = true; })"


def main() -> None:
    from playwright.sync_api import sync_playwright

    import roctune
    from roctune.hardware.network import free_port
    from roctune.webui import build_app
    from test_webui_zh import DATA_TEXT, GRADIO_OWN, VISIBLE_TEXT, words_of

    print(f"roctune from {os.path.dirname(roctune.__file__)}")
    port = free_port()
    app = build_app("runs", root=tempfile.mkdtemp(prefix="zh-words-"))
    app.launch(server_name="127.0.0.1", server_port=port, share=False, prevent_thread_lock=True, quiet=True,
               ssr_mode=False, show_error=False, **getattr(app, "_roctune_launch", {}))
    total = set()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"])
            page = browser.new_context(locale="zh-CN", viewport={"width": 1280, "height": 900}).new_page()
            page.set_default_timeout(60_000)
            page.goto(f"http://127.0.0.1:{port}", wait_until="domcontentloaded")
            page.get_by_role("tab", name=TABS[3]).wait_for()
            page.locator("#rt-doctor td").first.wait_for()  # the findings are drawn
            for name in TABS:
                tab = page.get_by_role("tab", name=name)
                if not tab.count():
                    continue
                tab.click()
                page.wait_for_timeout(1000)
                page.evaluate(UNFOLD)
                words = words_of(page.evaluate(VISIBLE_TEXT, f"{GRADIO_OWN}, {DATA_TEXT}"))
                total |= set(words)
                print(f"{name}: {len(words)} {' '.join(words)}")
            browser.close()
    finally:
        app.close()
    print(f"all panels: {len(total)} distinct English words")


if __name__ == "__main__":
    main()
