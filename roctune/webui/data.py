"""The Data panel: preview records as `roctune train` reads them, what training learns from one of them (as
`roctune data preview`: learned text highlighted, context dimmed), `roctune data check`, and the PII scrub.
Every path is checked against the workspace (`Workspace`) before anything is read or written."""
from __future__ import annotations

import os
import re
from types import SimpleNamespace

from roctune.webui.html import LEVEL_COLOR, box, esc, guard
from roctune.webui.i18n import choice_labels, t

DATA_TYPES = [".jsonl", ".json", ".csv", ".tsv", ".parquet"]
PREVIEW_ROWS = 20


def data_paths(text: str | list[str] | None) -> list[str]:
    """Dataset paths from a text box: one per line (or separated by commas)."""
    if isinstance(text, list):
        return [p for p in text if p]
    return [p.strip() for line in (text or "").splitlines() for p in line.split(",") if p.strip()]


def _need_paths(paths: list[str]) -> list[str]:
    from roctune.errors import ConfigError

    if not paths:
        raise ConfigError(t("no dataset: pick a file, upload one or type its path"))
    return paths


def preview_rows(paths_text: str | list[str], limit: int = PREVIEW_ROWS) -> tuple[list[list[str]], str]:
    """The first records as (where, prompt, answer) rows, read as `roctune train` reads them."""
    from roctune.data.records import iter_examples

    paths = _need_paths(data_paths(paths_text))
    rows = []
    for ex in iter_examples(paths):
        prompt = "\n".join(f"[{t(m['role'])}] {m['content']}" for m in ex.messages[:-1])
        rows.append([ex.where, prompt, ex.messages[-1]["content"]])
        if len(rows) >= limit:
            break
    return rows, t("first {n} record(s) of {paths}", n=len(rows), paths=", ".join(paths))


LEARNED_STYLE = "background:#d3f5d3;color:#0b3d0b;font-weight:bold"
CONTEXT_STYLE = "color:#888"


def learned_html(where: str, result: dict) -> str:
    """A `preview_record` result as HTML: learned text highlighted, context dimmed, with the token counts."""
    spans = "".join(f"<span style='{LEARNED_STYLE if s['train'] else CONTEXT_STYLE}'>{esc(s['text'])}</span>"
                    for s in result["segments"])
    counts = t("{tokens} tokens, {learned} learned", tokens=result["tokens"], learned=result["learned_tokens"])
    return (f"<p><b>{esc(where)}</b>: {counts} "
            f"(<span style='{LEARNED_STYLE}'>{t('learned')}</span>, <span style='{CONTEXT_STYLE}'>{t('context')}</span>)</p>"
            f"<pre style='white-space:pre-wrap' class='rt-learned'>{spans}</pre>")


def preview_learned(paths_text: str | list[str], index: float | None) -> str:
    """Record `index` of the first dataset, rendered and masked exactly as training does (the bundled model's
    template and the default settings), as HTML."""
    from roctune.data.preview import preview_record
    from roctune.models import load_tokenizer

    paths = _need_paths(data_paths(paths_text))
    where, result = preview_record(paths[0], load_tokenizer(None), int(index or 0))
    return learned_html(where, result)


CHECK_NAMES = {"empty_fields": "empty fields", "duplicates": "duplicates", "near_duplicates": "near duplicates",
               "conflicts": "conflicts", "answer_equals_prompt": "answer equals prompt",
               "eval_overlap": "eval overlap"}
CHECK_WHAT = {"empty_fields": "records with an empty or whitespace-only turn",
              "duplicates": "exact repeats of an earlier record",
              "near_duplicates": "repeats after ignoring case, punctuation and spacing",
              "conflicts": "prompts that have different answers",
              "answer_equals_prompt": "answers identical to their prompt",
              "eval_overlap": "training records also in the eval data"}


# check_data's example lines (English, for the CLI) as (pattern, the page's template); a line that matches none
# is shown as it is
EXAMPLE_FORMS = ((re.compile(r"^(?P<a>.+) repeats (?P<b>.+)$"), "{a} repeats {b}"),
                 (re.compile(r"^(?P<n>\d+) different answers: (?P<where>.+?)(?: and (?P<more>\d+) more)?$"),
                  "{n} different answers: {where}"),
                 (re.compile(r"^(?P<where>.+): (?P<role>\w+) turn (?P<i>\d+) is empty$"),
                  "{where}: {role} turn {i} is empty"))


def example_text(line: str) -> str:
    for pattern, template in EXAMPLE_FORMS:
        m = pattern.match(line)
        if m:
            values = {k: v for k, v in m.groupdict().items() if k != "more"}
            if "role" in values:
                values["role"] = t(values["role"])
            more = t(" and {k} more", k=m["more"]) if m.groupdict().get("more") else ""
            return t(template, **values) + more
    return line


def _warning_rows(report: dict) -> str:
    rows = []
    for name, f in report["warnings"].items():
        if name == "eval_overlap" and not report["eval_paths"]:
            continue
        color = LEVEL_COLOR["warn"] if f["count"] else LEVEL_COLOR["ok"]
        ex = "<br>".join(esc(example_text(x)) for x in f["examples"][:3])
        title, what = t(CHECK_NAMES.get(name, name)), t(CHECK_WHAT[name]) if name in CHECK_WHAT else f["what"]
        rows.append(f"<tr><td>{esc(title)}<div class='rt-why'>{esc(what)}</div></td>"
                    f"<td style='color:{color};font-weight:bold'>{f['count']}</td><td>{ex}</td></tr>")
    return "".join(rows)


def _token_line(tok: dict) -> str:
    """Token lengths; examples cut by the max length as a warning (training drops or truncates them)."""
    line = esc(t("tokens per example: p50 {p50}, p95 {p95}, max {max}, mean {mean}", **{
        k: tok[k] for k in ("p50", "p95", "max", "mean")}))
    out = f"<p>{line}</p>"
    if tok["max_length"]:
        cut = t("max length {n} truncates {k} example(s)", n=tok["max_length"], k=tok["truncated"])
        out += box(cut, "warn" if tok["truncated"] else "ok").replace("<div ", "<div id='rt-truncated' ", 1)
    return out


def check_report_html(report: dict) -> str:
    """A `check_data` report as HTML in the page's language: counts, schema errors, the warnings table, token
    lengths (examples longer than the max length as a warning box)."""
    errs = report["schema_errors"]
    parts = ["<p>" + t("<b>{n}</b> records read from {paths}: {valid} valid, {bad} with schema errors",
                       n=report["records"], paths=esc(", ".join(report["paths"])), valid=report["valid"],
                       bad=errs["count"]) + "</p>"]
    if errs["count"]:
        items = "".join(f"<li><code>{esc(e)}</code></li>" for e in errs["first"][:20])
        parts.append(f'<p class="rt-error">{t("Schema errors (training refuses this data until they are fixed):")}'
                     f"</p><ul>{items}</ul>")
    heads = "".join(f"<th>{t(h)}</th>" for h in ("check", "count", "first examples"))
    parts.append(f'<table class="rt-table"><thead><tr>{heads}</tr></thead><tbody>{_warning_rows(report)}</tbody>'
                 "</table>")
    if report.get("tokens"):
        parts.append(_token_line(report["tokens"]))
    parts.append(f"<p class='rt-error'>{t('schema errors: training refuses this data')}</p>" if errs["count"]
                 else f"<p style='color:#1a7f37'>{t('no schema errors')}</p>")
    return "".join(parts)


def run_check(paths_text: str | list[str], max_length: float | None) -> str:
    from roctune.data.check import check_data
    from roctune.errors import ConfigError

    paths = _need_paths(data_paths(paths_text))
    tokenizer = None
    if max_length:  # empty or 0: no token statistics
        if max_length < 0:
            raise ConfigError(f"--max-length must be > 0 (got {max_length:g})", key="bound", field="max_length",
                              op=">", limit="0", got=f"{max_length:g}")
        from roctune.models import load_tokenizer

        tokenizer = load_tokenizer(None)
    return check_report_html(check_data(paths, [], tokenizer, int(max_length) if max_length else None))


def default_scrub_output(path: str) -> str:
    """`<input>.scrubbed.<ext>`, or `.scrubbed-2`, `-3`... beside it: the page never replaces a file."""
    stem, ext = os.path.splitext(path)
    out, n = f"{stem}.scrubbed{ext}", 2
    while os.path.lexists(out):
        out, n = f"{stem}.scrubbed-{n}{ext}", n + 1
    return out


def run_scrub(path: str, out: str, types: list[str] | None) -> str:
    """Scrub `path` into `out` (both already checked); the report as HTML."""
    from roctune.data.pii import LABELS, PLACEHOLDERS
    from roctune.data.scrub import scrub_file

    # never over an existing file: over the page's API that could replace a dataset or a run's adapter config
    report = scrub_file(path, out, types or None, overwrite=False)
    rows = "".join(f"<tr><td>{esc(t(LABELS[kind]))}</td><td><code>{esc(PLACEHOLDERS[kind])}</code></td><td>{n}</td>"
                   "</tr>" for kind, n in report["counts"].items())
    heads = "".join(f"<th>{t(h)}</th>" for h in ("type", "placeholder", "count"))
    return ("<p>" + t("Redacted in {n} records ({changed} changed); wrote {path}", n=report["records"],
                      changed=report["records_changed"], path=f"<code>{esc(out)}</code>") + "</p>"
            f'<table class="rt-table"><thead><tr>{heads}</tr></thead><tbody>{rows}</tbody></table>')


def scrub_paths(ws, paths_text: str, output: str) -> tuple[str, str]:
    """The one input file and where its scrubbed copy goes, both inside the workspace."""
    from roctune.errors import ConfigError

    paths = data_paths(paths_text)
    if len(paths) != 1:
        raise ConfigError(t("scrub takes one input file; pick exactly one dataset"))
    src = ws.data([paths[0]])[0]
    if not os.path.isfile(src):
        raise ConfigError(f"--data {paths[0]}: scrub takes one file, not a data directory")
    out = ws.path((output or "").strip() or default_scrub_output(src), "--output", write=True)
    return src, out


def _layout(gr) -> SimpleNamespace:
    from roctune.data.pii import LABELS

    ui = SimpleNamespace()
    with gr.Row():
        ui.path = gr.Dropdown([], label="dataset (pick from the workspace or type a path)", allow_custom_value=True,
                              scale=3, elem_id="rt-data-path")
        ui.upload = gr.File(label="or upload a file", file_types=DATA_TYPES, scale=2, elem_id="rt-data-upload")
    with gr.Row():
        ui.preview_btn = gr.Button("Preview", elem_id="rt-preview")
        ui.check_len = gr.Number(label="token lengths vs max length (0: skip)", value=0, precision=0,
                                 elem_id="rt-check-len")
        ui.check_btn = gr.Button("Run checks", variant="primary", elem_id="rt-check")
    ui.status = gr.HTML(elem_id="rt-data-status")
    ui.preview = gr.Dataframe(headers=["where", "prompt", "answer"], interactive=False, wrap=True, max_height=420,
                              label="records", elem_id="rt-preview-table")
    ui.check_out = gr.HTML(elem_id="rt-check-out")
    with gr.Row():
        ui.learn_index = gr.Number(label="record number (from 0)", value=0, precision=0, elem_id="rt-learn-index")
        ui.learn_btn = gr.Button("Show what training learns from it", elem_id="rt-learn")
    ui.learn_out = gr.HTML(elem_id="rt-learn-out")
    with gr.Accordion("PII scrub (phone numbers, ID and bank cards, e-mails, IPs)", open=False):
        with gr.Row():
            ui.scrub_types = choice_labels(gr.CheckboxGroup, LABELS, label="types (none ticked: all)",
                                           elem_id="rt-scrub-types")
            ui.scrub_out_path = gr.Textbox(label="write the scrubbed copy to",
                                           placeholder="default: <input>.scrubbed.<ext>")
        ui.scrub_btn = gr.Button("Scrub", elem_id="rt-scrub")
        ui.scrub_out = gr.HTML()
    ui.use_btn = gr.Button("Use this dataset in the Train panel", size="sm", elem_id="rt-use-data")
    return ui


def build(gr, ws) -> SimpleNamespace:
    """The Data tab (call inside gr.Tabs). Returns its components; `use_btn` sends `path` to the Train panel."""
    with gr.Tab("Data", id="data"):
        ui = _layout(gr)

    @guard("data", 2)
    def on_upload(f):
        taken = ws.take_upload(f if isinstance(f, str) else getattr(f, "name", ""))
        return box(t("uploaded into the workspace: {path}", path=taken), "info"), taken

    @guard("data", 2)
    def on_preview(paths):
        import pandas as pd

        rows, note = preview_rows(ws.data(data_paths(paths)))
        return box(note, "info"), pd.DataFrame(rows, columns=[t("where"), t("prompt"), t("answer")])

    @guard("data", 2)
    def on_learned(paths, index):
        return box(t("learned text highlighted, context dimmed"), "info"), preview_learned(ws.data(data_paths(paths)),
                                                                                        index)

    @guard("data", 2)
    def on_pick(paths, index):  # a dataset picked: what training learns from its first record, at once
        if not data_paths(paths):
            return "", ""
        return on_learned.__wrapped__(paths, index)

    @guard("data", 2)
    def on_check(paths, max_len):
        return box(t("checked"), "ok"), run_check(ws.data(data_paths(paths)), max_len)

    @guard("data", 3)
    def on_scrub(paths, out, types):
        src, dest = scrub_paths(ws, paths, out)
        text = run_scrub(src, dest, types)
        return box(t("scrubbed copy written to {path}", path=dest), "ok"), text, dest

    ui.handlers = (on_upload, on_preview, on_learned, on_check, on_scrub, on_pick)
    return ui


def wire(ui, lang) -> None:
    """The Data panel's events; `lang` (the page's language state) is the last input of each."""
    on_upload, on_preview, on_learned, on_check, on_scrub, on_pick = ui.handlers
    ui.upload.upload(on_upload, [ui.upload, lang], [ui.status, ui.path])
    ui.preview_btn.click(on_preview, [ui.path, lang], [ui.status, ui.preview])
    ui.path.change(on_pick, [ui.path, ui.learn_index, lang], [ui.status, ui.learn_out])
    ui.learn_btn.click(on_learned, [ui.path, ui.learn_index, lang], [ui.status, ui.learn_out])
    ui.check_btn.click(on_check, [ui.path, ui.check_len, lang], [ui.status, ui.check_out])
    ui.scrub_btn.click(on_scrub, [ui.path, ui.scrub_out_path, ui.scrub_types, lang],
                       [ui.status, ui.scrub_out, ui.scrub_out_path])
