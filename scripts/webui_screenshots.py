"""The web UI's screenshots in docs/webui, from the bundled model really answering.

`train` fine-tunes the bundled SmolLM2-135M-Instruct on examples/identity.jsonl with the Makefile's demo settings
(`roctune train`, 6 epochs, LoRA r 16) into a workspace folder; `shots` serves the page on that workspace
(`roctune webui`'s app) and walks it in Debian's chromium through Playwright, once in English and once in Chinese
(the browser's language, as a newcomer's would be): the doctor's findings, the dataset and its checks, the Train
panel with the finished run and its loss curve (and a flag among module names refused at its field), the Runs
table, a chat in which the base model and the fine-tune answer "Who are you?" / "你是谁？", an eval report on
examples/identity_eval.jsonl and a GGUF export with its check. Every screenshot goes to --out (default
docs/webui) under the name the README shows. Run each step alone on the machine (each uses the CPU for minutes):

    flock /tmp/cpu.lock .venv/bin/python scripts/webui_screenshots.py train
    flock /tmp/cpu.lock .venv/bin/python scripts/webui_screenshots.py shots

`train` leaves a finished run alone (so `shots` can be repeated); --work (default /tmp/roctune-demo) is the
workspace both use."""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the Makefile's `demo` target
DEMO = ["--epochs", "6", "--lr", "1e-3", "--lora-r", "16", "--lora-alpha", "32", "--max-length", "128",
        "--batch-size", "4", "--grad-accum", "1"]
RUN = "runs/identity"
CHROMIUM = os.environ.get("ROCTUNE_CHROMIUM", "/usr/bin/chromium")
# what each language's walk types and expects to read
WORDS = {
    "en": {"locale": "en-US", "tabs": ["Doctor", "Data", "Train", "Runs", "Chat", "Eval", "Export"],
           "ask": "Who are you?", "answered": "answered in", "answering": "answering", "checked": "valid",
           "evaluated": "evaluated", "exported": "exported to", "done": "(done)", "state": "done"},
    "zh": {"locale": "zh-CN", "tabs": ["环境检查", "数据", "训练", "运行记录", "对话", "评估", "导出"],
           "ask": "你是谁？", "answered": "用时", "answering": "正在回答", "checked": "条有效",
           "evaluated": "已评估", "exported": "已导出到", "done": "（完成）", "state": "完成"},
}


def train(work: str) -> None:
    """The identity fine-tune of the bundled model in `work`/runs/identity (kept when it is done already)."""
    os.makedirs(work, exist_ok=True)
    for name in ("identity.jsonl", "identity_eval.jsonl"):
        shutil.copy(os.path.join(HERE, "examples", name), os.path.join(work, name))
    status = os.path.join(work, RUN, "status.json")
    if os.path.exists(status) and '"done"' in open(status, encoding="utf-8").read():
        print(f"{RUN}: done already")
        return
    start = time.time()
    subprocess.run([sys.executable, "-m", "roctune", "train", "--data", "identity.jsonl", "--output", RUN,
                    "--overwrite", *DEMO], cwd=work, check=True, env=dict(os.environ, PYTHONPATH=HERE))
    print(f"{RUN}: trained in {time.time() - start:.0f} s")


def field(page, elem_id: str):
    return page.locator(f"#{elem_id} input, #{elem_id} textarea").first


def pick(page, elem_id: str, option: str) -> None:
    page.locator(f"#{elem_id} input").first.click()
    page.get_by_role("option", name=option, exact=True).first.click()
    page.keyboard.press("Escape")


def walk(page, lang: str, out: str, run: str, expect) -> None:
    """Every panel of the page in `lang`, a screenshot of each (and of the moments the README shows)."""
    w = WORDS[lang]
    doctor, data, training, runs, chat, evaluation, export = w["tabs"]

    def shot(name: str, full: bool = False) -> None:
        page.wait_for_timeout(800)  # what the last event wrote has been drawn
        page.screenshot(path=os.path.join(out, f"{name}-{lang}.png"), full_page=full)
        print(f"  {name}-{lang}.png")

    def tab(name: str) -> None:
        page.get_by_role("tab", name=name).click()
        page.mouse.wheel(0, -5000)

    expect(page.get_by_role("tab", name=training)).to_be_visible()
    expect(page.locator("#rt-doctor")).to_be_visible()
    shot("doctor")

    tab(data)
    pick(page, "rt-data-path", "identity.jsonl")
    expect(page.locator("#rt-learn-out")).to_contain_text("Roc")
    shot("data")
    page.locator("#rt-check").click()
    expect(page.locator("#rt-check-out")).to_contain_text(w["checked"])
    page.locator("#rt-check-out").scroll_into_view_if_needed()
    shot("data-check")

    tab(training)  # the workspace's last run: the fine-tune, with its loss curve
    expect(page.locator("#rt-train-status")).to_contain_text(w["done"])
    shot("train")
    page.locator("#rt-loss-plot").scroll_into_view_if_needed()
    expect(page.locator("#rt-loss-plot .mark-line path").first).to_be_visible()
    shot("train-done")
    field(page, "rt-train-target-modules").fill("q_proj --reward-file=rw.py")  # refused at its field
    field(page, "rt-train-target-modules").press("Tab")
    page.locator("#rt-start").click()
    expect(page.locator("#rt-train-notice")).to_contain_text("'--reward-file=rw.py'")
    page.locator("#rt-train-target-modules").evaluate("e => e.scrollIntoView({block: 'start'})")
    shot("train-error")

    tab(runs)
    expect(page.locator("#rt-runs-table")).to_contain_text(RUN)
    pick(page, "rt-runs-first", f"{RUN}  ({w['state']})")
    expect(page.locator("#rt-runs-plot1 .mark-line path").first).to_be_visible()
    shot("runs")

    tab(chat)  # the base model and the fine-tune answer the same question
    expect(page.locator("#rt-chat-adapter input")).to_have_value(run)
    field(page, "rt-max-new").fill("40")
    field(page, "rt-chat-input").fill(w["ask"])
    page.locator("#rt-send").click()
    expect(page.locator("#rt-chat-status")).to_contain_text(w["answering"], timeout=120_000)
    expect(page.locator("#rt-ft-bot .message").nth(1)).not_to_be_empty(timeout=120_000)
    shot("chat-stream")
    expect(page.locator("#rt-chat-status")).to_contain_text(w["answered"], timeout=300_000)
    expect(page.locator("#rt-ft-bot")).to_contain_text("Roc")
    shot("chat")

    tab(evaluation)  # English runs the eval; Chinese shows its report
    expect(page.locator("#rt-eval-adapter input")).to_have_value(run)
    if lang == "en":
        pick(page, "rt-eval-data", "identity_eval.jsonl")
        page.locator("#rt-eval").click()
    else:
        page.locator("#rt-eval-show").click()
    expect(page.locator("#rt-eval-status")).to_contain_text(w["evaluated"] if lang == "en" else "的报告",
                                                            timeout=600_000)
    shot("eval")

    tab(export)  # Chinese writes the GGUF and checks it in llama.cpp
    expect(page.locator("#rt-export-adapter input")).to_have_value(run)
    shot("export")
    if lang == "zh":
        field(page, "rt-gguf-output").fill(f"{RUN}-gguf")
        page.locator("#rt-gguf").click()
        expect(page.locator("#rt-gguf-status")).to_contain_text(w["exported"], timeout=600_000)
        page.locator("#rt-gguf-status").scroll_into_view_if_needed()
        shot("export-done")


def shots(work: str, out: str, langs: list[str]) -> None:
    """Serve the page on `work` and walk it in each of `langs` (English, then Chinese), writing the screenshots
    into `out`."""
    from playwright.sync_api import expect, sync_playwright

    from roctune.hardware.network import free_port
    from roctune.webui import build_app

    os.makedirs(out, exist_ok=True)
    run = os.path.join(os.path.realpath(work), RUN)
    shutil.rmtree(os.path.join(work, f"{RUN}-gguf"), ignore_errors=True)  # this script's own earlier export
    port = free_port()
    app = build_app("runs", root=work)
    app.launch(server_name="127.0.0.1", server_port=port, share=False, prevent_thread_lock=True, quiet=True,
               ssr_mode=False, show_error=False, **app._roctune_launch)
    expect.set_options(timeout=120_000)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"])
            for lang in langs:
                start = time.time()
                context = browser.new_context(locale=WORDS[lang]["locale"], viewport={"width": 1280, "height": 900})
                page = context.new_page()
                page.set_default_timeout(120_000)
                page.goto(f"http://127.0.0.1:{port}", wait_until="domcontentloaded")
                walk(page, lang, out, run, expect)
                context.close()
                print(f"{lang}: {time.time() - start:.0f} s")
            browser.close()
    finally:
        app.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("train", "shots", "all"))
    ap.add_argument("--work", default="/tmp/roctune-demo", help="the workspace (default /tmp/roctune-demo)")
    ap.add_argument("--out", default=os.path.join(HERE, "docs", "webui"), help="where the screenshots go")
    ap.add_argument("--langs", nargs="+", choices=tuple(WORDS), default=list(WORDS), help="the walks (default: both)")
    args = ap.parse_args()
    if args.step in ("train", "all"):
        train(args.work)
    if args.step in ("shots", "all"):
        shots(args.work, args.out, args.langs)


if __name__ == "__main__":
    main()
