"""The page for a Chinese newcomer, in a real browser (Playwright + Debian's chromium) with a zh-CN locale: it opens
in Chinese without being asked, and no panel it walks through shows an English word outside an allow-list (paths,
numbers, model ids, units, names of things such as LoRA or GGUF), the doctor's findings and the PII types included.
Also: errors in the form's words at their field (a bad number, a flag among module names),
a second Start refused with the running job named until dismissed, Start disabled for a model that does not exist,
and a reload that shows the workspace's last run and fills Eval and Export from it."""
from __future__ import annotations

import re
import shutil

import pytest

from conftest import write_jsonl
from test_webui import SECRET_QUESTIONS, _field, _pick, _shot, browser, server  # noqa: F401 - fixtures

# Words that read the same on a Chinese page: names of things, formats, units, the program's name, and the values
# of choices a user picks (a method, a stage, an attention kernel).
ALLOWED = {
    "roctune", "LoRA", "QLoRA", "DoRA", "ROCm", "CUDA", "NVIDIA", "AMD", "CPU", "GPU", "GPUs", "GiB", "MiB", "token",
    "JSON", "JSONL", "CSV", "TSV", "Parquet", "GGUF", "Ollama", "llama", "cpp", "Modelfile", "DEPLOY", "md",
    "transformers", "torch", "PyTorch", "BLEU", "ROUGE", "ROUGE-L", "PII", "IP", "ID", "KL", "SimPO", "RoPE", "FSDP", "TRL",
    "sft", "dpo", "grpo", "pt", "kto", "rm", "KTO", "label", "kto_tag", "lora", "qlora", "freeze", "full", "auto", "sdpa", "eager", "SFT", "DPO", "GRPO",
    "alpha", "dropout", "logits", "LLaMA", "Factory", "yaml", "YAML", "cpu", "cuda", "ADAPTER", "gguf", "lora-gguf",
    "FlashAttention", "IOMMU", "WSL", "AdamW", "Hub", "rsLoRA", "sqrt", "r", "think", "text", "prompt", "chosen",
    "rejected", "DIR", "PATH", "W", "N", "TYPE", "NF4", "all", "all-linear", "mlp", "self_attn", "norm", "epsilon",
    "gamma", "DAPO", "vLLM", "name", "English", "LLaMA-Factory", "bitsandbytes", "chatml", "gemma", "mistral",
    "dynamic", "yarn",  # names of tools, chat templates and RoPE types in help texts
    "GB", "ModelScope", "qwen-research",  # the Models panel: a unit, a hub's name, a model's licence
    "tiny", "no-such-model",  # the test's own model names
}


def _choice_values() -> set[str]:
    """The values of the settings' choices (a template, a loss, a scheduler): names a user picks as they are."""
    from roctune import config

    return {str(c) for s in config.form_fields() for c in (s["choices"] or ())}


ALLOWED |= _choice_values()
# Gradio's own parts of the page that a handler does not write (its progress timer, hidden templates, and its
# screen-reader announcer, which is not drawn and says "In queue: 1 of 2" while an event waits behind another; Gradio
# has no Chinese for that line)
GRADIO_OWN = ".progress-text, .meta-text, .meta-text-center, .eta-bar, .toast-wrap, .wrap.default, svg, .hide, .sr-only"
# the dataset's own text (the preview table's cells, what training learns from a record): data, not the page
DATA_TEXT = (".rt-learned, #rt-preview-table, .cm-editor, "  # .cm-editor: the command and YAML (code)
             ".rt-example, #rt-gguf-status td, "  # the eval report's records and the GGUF check's answers
             "#rt-ft-bot .message, #rt-base-bot .message, #rt-ft-bot [data-testid], #rt-base-bot [data-testid]")  # chat

VISIBLE_TEXT = """(skip) => {
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!el || !n.textContent.trim() || el.closest(skip) || el.closest('script, style, code, pre')) continue;
    if (!el.checkVisibility({checkOpacity: true, checkVisibilityCSS: true})) continue;
    if (el.closest('details:not([open])') && !el.closest('summary')) continue;  // folded away
    out.push(n.textContent);
  }
  for (const el of document.querySelectorAll('input[placeholder], textarea[placeholder]')) {
    if (el.checkVisibility() && el.placeholder) out.push(el.placeholder);
  }
  return out;
}"""


def english_words(page) -> list[str]:
    """The visible ASCII words of the page not in ALLOWED (`words_of`)."""
    return words_of(page.evaluate(VISIBLE_TEXT, f"{GRADIO_OWN}, {DATA_TEXT}"))


def words_of(texts, allowed: set[str] = frozenset()) -> list[str]:
    """The ASCII words of `texts` not in ALLOWED (nor `allowed`); paths, numbers, model ids and flags-with-values
    are not words (a token holding a digit, a slash, a dot, an underscore or a colon is a name or a value)."""
    found = []
    for text in texts:
        for token in re.split(r"[\s，。；：（）、“”！？,;()<>\[\]{}|=]+", text):
            if not token or re.search(r"[\d/._:@~\\]", token) or not re.search("[A-Za-z]", token):
                continue
            for word in re.findall(r"[A-Za-z][A-Za-z'-]*", token):
                if not {word, word.strip("-'")} & (ALLOWED | allowed):
                    found.append(word)
    return sorted(set(found))


def assert_chinese(page, where: str) -> None:
    page.wait_for_timeout(500)  # what the last event wrote has been drawn
    words = english_words(page)
    assert not words, f"{where}: English on the Chinese page: {words}"


@pytest.mark.slow
def test_chinese_newcomer_walk(server, browser, tmp_path, tiny_model_dir):
    from playwright.sync_api import expect

    url, app = server
    write_jsonl(tmp_path / "secret.jsonl", [
        {"instruction": q, "input": "", "output": "The secret word is pineapple."} for q in SECRET_QUESTIONS])
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "tiny")
    context = browser.new_context(locale="zh-CN", viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    expect.set_options(timeout=60_000)
    page.goto(url, wait_until="domcontentloaded")
    try:
        # first visit: the browser's language, nobody clicked 中文
        expect(page.get_by_role("tab", name="训练")).to_be_visible()
        expect(page.locator("#rt-verdict")).to_have_text(re.compile("^(正常|警告|失败)$"))
        expect(page.locator("#rt-doctor")).to_contain_text("训练使用")  # the findings themselves, in Chinese
        assert not page.locator("#rt-doctor details").count()  # nothing folded away as English
        assert_chinese(page, "doctor")
        _shot(page, tmp_path, "zh-first-visit", full_page=False)

        page.get_by_role("tab", name="模型").click()  # the catalog: sizes, licences and hubs are names
        expect(page.locator("#rt-models-table")).to_be_visible()
        assert_chinese(page, "models")

        # data: preview and check; a max length that cuts examples is a warning
        page.get_by_role("tab", name="数据").click()
        _pick(page, "rt-data-path", "secret.jsonl")
        expect(page.locator("#rt-learn-out")).to_contain_text("pineapple")
        page.locator("#rt-preview").click()
        expect(page.locator("#rt-data-status")).to_contain_text("前 8 条记录")
        expect(page.locator("#rt-preview-table")).to_contain_text("提示")  # its headers (the table is skipped below)
        _field(page, "rt-check-len").fill("-5")
        page.locator("#rt-check").click()
        expect(page.locator("#rt-data-status")).to_contain_text("出错：最大长度：必须 > 0（当前为 -5）")
        _field(page, "rt-check-len").fill("8")
        page.locator("#rt-check").click()
        expect(page.locator("#rt-check-out")).to_contain_text("8 条有效")
        expect(page.locator("#rt-truncated")).to_have_class(re.compile("rt-warn"))
        expect(page.locator("#rt-truncated")).to_contain_text("最大长度 8 会截断 8 条样本")
        page.get_by_text("隐私脱敏").click()  # the PII scrub's types, labelled in Chinese
        expect(page.locator("#rt-scrub-types")).to_contain_text("身份证号")
        assert_chinese(page, "data")
        page.locator("#rt-use-data").click()

        # train: a model that does not exist disables Start; a bad length is refused at its field in Chinese
        page.get_by_role("tab", name="训练").click()
        expect(page.locator("#rt-one-run")).to_contain_text("每个服务同一时间只能进行一个训练")
        model = page.locator("#rt-train-model input").first
        model.fill("no-such-model")
        model.press("Enter")
        expect(page.locator("#rt-start")).to_be_disabled()
        expect(page.locator("#rt-estimate-out")).to_contain_text("出错：模型 no-such-model：找不到")
        assert_chinese(page, "train form with a model that does not exist")
        _pick(page, "rt-train-model", "models/tiny")
        expect(page.locator("#rt-start")).to_be_enabled()
        expect(page.locator("#rt-estimate-out")).to_contain_text("估计峰值内存")
        _field(page, "rt-train-output").fill("runs/zh")
        _field(page, "rt-train-max-length").fill("-5")
        _field(page, "rt-train-max-length").press("Tab")
        page.locator("#rt-start").click()
        notice = page.locator("#rt-train-notice")
        expect(notice).to_contain_text("出错：最大长度：必须 > 0（当前为 -5）")
        expect(page.locator("#rt-train-max-length")).to_have_class(re.compile("rt-bad"))
        assert "--" not in notice.inner_text()
        assert_chinese(page, "train form with an error")
        _shot(page, tmp_path, "zh-train-error", full_page=False)
        _field(page, "rt-train-max-length").fill("64")
        _field(page, "rt-train-target-modules").fill("q_proj --reward-file=rw.py")  # a flag among module names
        _field(page, "rt-train-target-modules").press("Tab")
        page.locator("#rt-start").click()
        expect(notice).to_contain_text("出错：目标模块：'--reward-file=rw.py' 不是名称")
        expect(page.locator("#rt-train-target-modules")).to_have_class(re.compile("rt-bad"))
        _field(page, "rt-train-target-modules").fill("auto")

        # a short run; a second Start is refused, naming the running job, and stays until dismissed
        for elem, value in (("rt-train-max-length", "64"), ("rt-train-max-steps", "6"), ("rt-train-batch-size", "2"),
                            ("rt-train-grad-accum", "1")):
            _field(page, elem).fill(value)
        _field(page, "rt-train-grad-accum").press("Tab")
        page.locator("#rt-start").click()
        expect(notice).to_contain_text("已开始：roctune train --config")
        expect(page.locator("#rt-train-max-length")).not_to_have_class(re.compile("rt-bad"))
        page.locator("#rt-start").click()
        expect(notice).to_contain_text("已有训练在进行")
        expect(notice).to_contain_text(str(tmp_path / "runs" / "zh"))
        page.wait_for_timeout(2500)  # the progress timer ticks; the refusal stays
        expect(notice).to_contain_text("已有训练在进行")
        page.locator("#rt-dismiss").click()
        expect(notice).not_to_contain_text("已有训练在进行")
        status = page.locator("#rt-train-status")
        expect(status).to_contain_text("完成：适配器已保存到", timeout=300_000)
        expect(page.locator("#rt-progress .rt-bar")).to_be_visible()
        expect(page.locator("#rt-progress")).to_contain_text("第 6/6 步")
        assert_chinese(page, "train done")
        _shot(page, tmp_path, "zh-train-done", full_page=False)

        # a reload shows the last run of the workspace and fills Eval and Export from it
        app._roctune_state["job"] = None  # as after a server restart: only the workspace remembers
        page.reload(wait_until="domcontentloaded")
        run = str(tmp_path / "runs" / "zh")
        page.get_by_role("tab", name="训练").click()  # the page opens on the Doctor tab
        expect(page.locator("#rt-train-status")).to_contain_text(f"工作区中最近的运行：{run}（完成）")
        expect(_field(page, "rt-train-max-steps")).to_have_value("6")
        expect(page.locator("#rt-loss-plot .mark-line path").first).to_be_visible()
        page.get_by_role("tab", name="评估").click()
        expect(page.locator("#rt-eval-adapter input")).to_have_value(run)
        assert_chinese(page, "eval")
        page.get_by_role("tab", name="导出").click()
        expect(page.locator("#rt-export-adapter input")).to_have_value(run)
        assert_chinese(page, "export")
        page.get_by_role("tab", name="运行记录").click()
        expect(page.locator("#rt-runs-table")).to_contain_text("runs/zh")
        assert_chinese(page, "runs")

        # chat with a system prompt: the answer streams in ("正在回答"), then the time it took
        page.get_by_role("tab", name="对话").click()
        expect(page.locator("#rt-chat-adapter input")).to_have_value(run)
        _field(page, "rt-max-new").fill("8")
        _field(page, "rt-chat-system").fill("你是 Roc。")
        _field(page, "rt-chat-input").fill("你是谁？")
        page.locator("#rt-send").click()
        expect(page.locator("#rt-chat-status")).to_contain_text("用时", timeout=120_000)
        assert_chinese(page, "chat")
        _shot(page, tmp_path, "zh-chat", full_page=False)

        # eval of the run on a data file, then a GGUF export with its fidelity check
        page.get_by_role("tab", name="评估").click()
        _pick(page, "rt-eval-data", "secret.jsonl")
        page.locator("#rt-eval").click()
        expect(page.locator("#rt-eval-status")).to_contain_text("已评估", timeout=300_000)
        assert_chinese(page, "eval report")
        page.get_by_role("tab", name="导出").click()
        _field(page, "rt-gguf-output").fill("runs/zh-gguf")
        page.locator("#rt-gguf").click()
        expect(page.locator("#rt-gguf-status")).to_contain_text("已导出到", timeout=300_000)
        expect(page.locator("#rt-gguf-status")).to_contain_text("保真度检查")
        assert_chinese(page, "export done")
        _shot(page, tmp_path, "zh-export-done", full_page=False)
    except Exception:
        _shot(page, tmp_path, "zh-failure")
        raise
    finally:
        context.close()


def test_first_visit_follows_the_browser_language():
    from roctune.webui.i18n import from_accept_language

    assert from_accept_language("zh-CN,zh;q=0.9,en;q=0.8") == "zh"
    assert from_accept_language("en-US,en;q=0.9,zh-CN;q=0.8") == "en"
    assert from_accept_language("fr-FR,zh-TW;q=0.5") == "zh"
    assert from_accept_language("fr,de;q=0.5") == "en" and from_accept_language("") == "en"


def test_data_check_report_in_chinese_with_the_truncation_as_a_warning(tmp_path):
    from roctune.webui.data import check_report_html
    from roctune.webui.i18n import language

    warn = {"count": 0, "examples": [], "what": "English from the library"}
    report = {"paths": ["d.jsonl"], "eval_paths": [], "records": 3, "valid": 3,
              "schema_errors": {"count": 0, "first": []},
              "warnings": {k: warn for k in ("empty_fields", "duplicates", "near_duplicates", "conflicts",
                                             "answer_equals_prompt", "eval_overlap")},
              "tokens": {"p50": 20, "p95": 30, "max": 31, "mean": 21.5, "max_length": 16, "truncated": 2}}
    with language("zh"):
        page = check_report_html(report)
    assert "最大长度 16 会截断 2 条样本" in page and "rt-warn" in page and "3 条有效" in page
    shown = re.sub(r"<[^>]+>|d\.jsonl|token", "", page)  # tags, the path, and "token" (the Chinese texts use it)
    assert not re.search(r"[A-Za-z]{2,}", shown), shown


def test_export_reports_only_files_that_exist_after_it(tmp_path):
    from roctune.webui.export import written

    (tmp_path / "model.gguf").write_bytes(b"x" * 2**20)
    (tmp_path / "Modelfile").write_text("FROM ./model.gguf\n")
    (tmp_path / ".tmp-1234").mkdir()  # a staging folder: never reported
    text = written("exported", str(tmp_path))
    assert text.splitlines() == ["exported", "  Modelfile  (0.0 MiB)", "  model.gguf  (1.0 MiB)"]


def test_eval_report_in_the_page_language():
    from roctune.webui.eval import report_html
    from roctune.webui.i18n import language

    scores = {"loss": 2.0, "perplexity": 7.39, "bleu4": 10.0, "rouge1": 20.0, "rouge2": 5.0, "rougeL": 18.0,
              "exact_match": 0.0}
    result = {"n": 1, "meta": {"data": ["held.jsonl"], "max_new_tokens": 16}, "base": scores,
              "tuned": dict(scores, loss=1.5, rougeL=30.0),
              "examples": [{"index": 0, "prompt": "你好", "reference": "你好！", "base": {"answer": "嗨", "rougeL": 0.0},
                            "tuned": {"answer": "你好！", "rougeL": 100.0}}]}
    with language("zh"):
        page = report_html(result)
    assert "损失（越低越好）" in page and "-0.5000" in page and "微调后的回答" in page
    shown = re.sub(r"<[^>]+>|held\.jsonl|token|BLEU|ROUGE|&rarr;|rt-[a-z]+", "", page)
    assert not re.search(r"[A-Za-z]{2,}", shown), shown
