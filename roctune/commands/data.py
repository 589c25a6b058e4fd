"""`roctune data check|scrub|split|preview`: inspect, redact, split datasets (every format `train` reads) and
show what training learns from one record."""
from __future__ import annotations

import argparse
import json
import sys

DATA_HELP = ("a .jsonl, .json, .csv/.tsv or .parquet file, or DIR:NAME for a LLaMA-Factory data directory "
             "(dataset_info.json)")


def register(subparsers) -> None:
    p = subparsers.add_parser("data", help="check, scrub (redact personal data) and split datasets",
                              description="Check, scrub and split datasets in any format `roctune train` reads.")
    sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    p.set_defaults(func=run, _data_parser=p)

    c = sub.add_parser("check", help="schema errors, duplicates, conflicts, token lengths",
                       description="Read every record and report schema errors (exit 1) and warnings (exit 0).")
    c.add_argument("paths", nargs="+", metavar="PATH", help=DATA_HELP)
    c.add_argument("--model", help="tokenizer for token-length statistics (a local model dir or a name)")
    c.add_argument("--max-length", type=int, help="count the examples this many tokens would truncate "
                   "(uses the default model's tokenizer when --model is not given)")
    c.add_argument("--eval", action="append", default=[], metavar="PATH",
                   help="evaluation data: report training records that also appear in it (repeatable)")
    c.add_argument("--json", action="store_true", help="print the findings as JSON")

    s = sub.add_parser("scrub", help="redact phone numbers, ID cards, bank cards, e-mails, IPs",
                       description="Write a copy of IN to OUT with personal data replaced by typed "
                                   "placeholders (<PHONE>, <ID_CARD>, ...). IN is never changed.")
    s.add_argument("input", metavar="IN")
    s.add_argument("output", metavar="OUT")
    s.add_argument("--types", nargs="+", metavar="TYPE",
                   help="only these types (default all): email id_card bank_card phone landline ip")
    s.add_argument("--report", metavar="FILE", help="also write the counts as JSON to FILE")
    s.add_argument("--overwrite", action="store_true", help="replace an existing OUT (and --report FILE)")

    sp = sub.add_parser("split", help="de-duplicate, then split into train and eval files",
                        description="Drop duplicates (after normalising case, punctuation and spacing), then "
                                    "split with a seeded shuffle so no example is in both parts.")
    sp.add_argument("paths", nargs="+", metavar="IN", help=DATA_HELP)
    sp.add_argument("--eval-ratio", type=float, required=True, metavar="R")
    sp.add_argument("--seed", type=int, default=0, metavar="S")
    sp.add_argument("--out-train", required=True, metavar="A")
    sp.add_argument("--out-eval", required=True, metavar="B")
    sp.add_argument("--overwrite", action="store_true", help="replace existing A and B files")

    pv = sub.add_parser("preview", help="show one record as training renders it: learned text highlighted",
                        description="Render one record with the model's chat template exactly as `roctune train` "
                                    "does; learned text (answers, tool calls, reasoning) is highlighted, context "
                                    "(system and user turns, tool lists and results, template headers) dimmed.")
    pv.add_argument("source", metavar="SOURCE", help=DATA_HELP)
    pv.add_argument("--index", type=int, default=0, metavar="N", help="which record (0-based; default 0)")
    pv.add_argument("--model", help="whose tokenizer and chat template (default: the bundled model)")
    pv.add_argument("--template", metavar="NAME", help="chat template by name (--template of `train`; default: "
                    "the model's own, else its family's)")
    pv.add_argument("--max-length", type=int, metavar="L", help="cut the record at L tokens, as training does")
    pv.add_argument("--no-learn-reasoning", dest="learn_reasoning", action="store_false",
                    help="show reasoning as context only (--no-learn-reasoning of `train`)")
    pv.add_argument("--empty-think", choices=("learn", "mask", "drop"), default="learn",
                    help="an empty <think></think> block: learn, mask or drop it (default learn)")
    pv.add_argument("--json", action="store_true",
                    help='print {"segments": [{"text", "train"}], "tokens": N, "learned_tokens": N}')


def run(args: argparse.Namespace) -> int:
    cmd = getattr(args, "data_command", None)
    if cmd == "check":
        return _check(args)
    if cmd == "scrub":
        return _scrub(args)
    if cmd == "split":
        return _split(args)
    if cmd == "preview":
        return _preview(args)
    args._data_parser.print_help()
    return 2


def _stderr(line: str) -> None:
    """Progress lines go to stderr: stdout keeps the report (and --json stays parseable)."""
    print(line, file=sys.stderr, flush=True)


def _console():
    from rich.console import Console

    return Console(highlight=False)


def _check(args) -> int:
    from roctune.config import check_number
    from roctune.data.check import check_data

    check_number("--max-length", args.max_length, gt=0)
    tokenizer = None
    if args.model or args.max_length:
        from roctune.vision import tokenizer_for

        tokenizer = tokenizer_for(args.model)  # a vision model's processor counts image tokens
    report = check_data(args.paths, args.eval, tokenizer, args.max_length, _stderr)
    if args.json:
        json.dump(report, sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
    else:
        _print_check(report)
    return 1 if report["schema_errors"]["count"] else 0


def _print_check(report: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    con = _console()
    errs = report["schema_errors"]
    con.print(f"[bold]{report['records']}[/] records read from {escape(', '.join(report['paths']))}: "
              f"{report['valid']} valid, {errs['count']} with schema errors")
    if errs["count"]:
        con.print("[bold red]Schema errors[/] (training refuses this data until they are fixed):")
        for e in errs["first"][:20]:
            con.print(f"  {escape(e)}", soft_wrap=True)
        if errs["count"] > 20:
            con.print(f"  ... and {errs['count'] - 20} more (--json lists the first {len(errs['first'])})")
    table = Table(title="Warnings", title_justify="left")
    table.add_column("check")
    table.add_column("count", justify="right")
    table.add_column("what it means")
    shown = {}
    for name, f in report["warnings"].items():
        if name == "eval_overlap" and not report["eval_paths"]:
            continue
        style = "yellow" if f["count"] else "green"
        table.add_row(name.replace("_", " "), f"[{style}]{f['count']}[/]", f["what"])
        if f["count"]:
            shown[name] = f
    con.print(table)
    for name, f in shown.items():
        con.print(f"[yellow]{name.replace('_', ' ')}[/], first {len(f['examples'])}:")
        for ex in f["examples"]:
            con.print(f"  {escape(ex)}", soft_wrap=True)
    tok = report["tokens"]
    if tok:
        line = (f"tokens per example: p50 {tok['p50']}, p90 {tok['p90']}, p95 {tok['p95']}, p99 {tok['p99']}, "
                f"max {tok['max']}, mean {tok['mean']}")
        if tok["max_length"]:
            line += (f"; --max-length {tok['max_length']} truncates {tok['truncated']} example(s) "
                     f"({100 * tok['truncated_share']:.1f}%, {tok['tokens_cut']:,} tokens cut = "
                     f"{100 * tok['tokens_cut_share']:.1f}%); --truncation split would make "
                     f"{tok['split_examples']:,} examples of them")
        con.print(line)
    images = report.get("images")
    if images:
        per = images["tokens_per_image"]
        con.print(f"images: {images['images']} in {images['records_with_images']} records (at most "
                  f"{images['max_per_record']} in one), every one read and decoded; "
                  + (f"tokens per image {per['min']}-{per['max']} (mean {per['mean']}, {per['total']:,} in all; "
                     "counted in the lengths above)" if per else "their token counts need a vision model: --model"))
    con.print("[bold red]schema errors: exit 1[/]" if errs["count"] else "[green]no schema errors[/]")


def _scrub(args) -> int:
    from rich.table import Table

    from roctune.data.pii import PLACEHOLDERS
    from roctune.data.readers import file_kind
    from roctune.data.scrub import check_outputs, scrub_file, write_report

    types = None
    if args.types:
        types = [t.strip() for item in args.types for t in item.split(",") if t.strip()]
    file_kind(args.input)  # a missing input is named before any output
    check_outputs(args.input, args.output, args.report, args.overwrite)  # both, before anything is written
    report = scrub_file(args.input, args.output, types, overwrite=args.overwrite, say=_stderr)
    if args.report:
        write_report(report, args.report)
    table = Table(title=f"Redacted in {report['records']} records ({report['records_changed']} changed)",
                  title_justify="left")
    table.add_column("type")
    table.add_column("placeholder")
    table.add_column("count", justify="right")
    for t, n in report["counts"].items():
        table.add_row(t, PLACEHOLDERS[t], str(n))
    con = _console()
    con.print(table)
    con.print(f"wrote {args.output}" + (f"; report in {args.report}" if args.report else ""))
    return 0


def _split(args) -> int:
    from roctune.config import check_number, check_settings
    from roctune.data.split import split_data

    check_number("--eval-ratio", args.eval_ratio, gt=0, lt=1)
    check_settings(args, ("seed",))

    r = split_data(args.paths, args.out_train, args.out_eval, args.eval_ratio, args.seed, overwrite=args.overwrite)
    _console().print(f"{r['records']} records, {r['duplicates_dropped']} duplicates dropped: "
                     f"{r['train']} -> {args.out_train}, {r['eval']} -> {args.out_eval} (seed {r['seed']})")
    return 0


def _preview(args) -> int:
    from rich.text import Text

    from roctune.data.preview import preview_record, template_choice
    from roctune.data.render import RenderOptions
    from roctune.errors import ConfigError
    from roctune.vision import tokenizer_for

    if args.max_length is not None and args.max_length <= 0:
        raise ConfigError("--max-length must be a positive number of tokens")
    options = RenderOptions(args.learn_reasoning, args.empty_think)
    reader = tokenizer_for(args.model, template=args.template)  # a vision model's: its processor, with images
    where, result = preview_record(args.source, reader, args.index, options, args.max_length)
    result["template"] = template_choice(getattr(reader, "tokenizer", reader), options)
    if args.json:
        json.dump(result, sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
        return 0
    con = _console()
    con.print(f"chat template: {result['template']['name'] or 'own'} ({result['template']['reason']})",
              markup=False)
    if result["template"]["reasoning"]:
        con.print(f"reasoning: {result['template']['reasoning']}", markup=False)
    con.print(f"[bold]{where}[/]: {result['tokens']} tokens, {result['learned_tokens']} learned "
              "([bold green]learned[/], [dim]context[/])")
    for k, image in enumerate(result.get("images", ())):
        con.print(f"image {k + 1}: {image['source']} ({image['width']}x{image['height']}), {image['tokens']} tokens "
                  "(context)", markup=False)
    text = Text()
    for seg in result["segments"]:
        text.append(seg["text"], style="bold green" if seg["train"] else "dim")
    con.print(text, soft_wrap=True)
    return 0
