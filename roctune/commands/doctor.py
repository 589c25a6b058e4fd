"""`roctune doctor`: check this machine (or a mounted system image) for LoRA training and print what to
fix; `--explain LOG` recognises known failures in a training log. The facts come from `roctune.hardware`,
the checks live in `roctune.doctor`."""
from __future__ import annotations

import json
import os
import sys

LEVEL_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "doctor",
        help="check GPU, drivers, permissions and libraries for training, with fixes",
        description="Check what this machine can do for LoRA training (GPU, ROCm/CUDA, permissions, torch "
                    "build, dtype, attention kernel, QLoRA, memory) and print the fix for each problem. "
                    "Exit code 0 when the verdict is ok or warn, 1 when something fails.",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--root", metavar="DIR", default="/",
                   help="read /sys, /dev, /etc, /proc and /opt under DIR (a mounted system image)")
    p.add_argument("--user", metavar="NAME", help="judge this user's group membership (default: you)")
    p.add_argument("--explain", metavar="LOGFILE",
                   help="recognise known failures in a training log ('-' reads stdin) and print cause and fix")
    p.add_argument("--torch-facts", metavar="JSON|@FILE",
                   help="for tests and for diagnosing another machine: facts about torch as JSON (e.g. "
                        "'{\"backend\": \"rocm\", \"cuda_available\": true, \"arch_list\": [\"gfx1100\"]}') "
                        "instead of the running torch; also read from $ROCTUNE_DOCTOR_TORCH_FACTS")
    p.add_argument("--no-tools", action="store_true", help="do not run rocminfo / nvidia-smi even when present")
    p.add_argument("--install-plan", action="store_true",
                   help="which torch wheel index, bitsandbytes build and attention kernel fit this machine (as "
                        "`make setup` chooses them), with the reason for each; reads --root")
    p.add_argument("--selftest", action="store_true",
                   help="also train a tiny model for a few steps on the path training would use (device, dtype, "
                        "each attention kernel, 4-bit, packing) and compare with a float64 CPU reference")
    p.set_defaults(func=run)


def run(args) -> int:
    from roctune import doctor, hardware

    if args.explain:
        return _explain(doctor, args)
    if args.install_plan:
        from roctune.hardware import install_plan

        p = install_plan.plan(args.root)
        print(json.dumps(p.to_dict(), indent=2) if args.json else install_plan.format_text(p))
        return 0
    spec = args.torch_facts or os.environ.get(doctor.TORCH_FACTS_ENV)
    facts = hardware.load_torch_facts(spec) if spec else None
    if not os.path.isdir(args.root):
        from roctune.errors import ConfigError

        raise ConfigError(f"--root {args.root}: not a directory")
    machine = hardware.gather(args.root, args.user, facts, use_tools=not args.no_tools)
    report = doctor.diagnose(machine)
    if args.selftest:
        from roctune.doctor.selftest import selftest

        report.findings += selftest()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        _print_report(report)
    return report.exit_code


def _print_report(report) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=False)
    m, t = report.machine, report.machine.torch
    where = "" if m.live else f" (image at {m.root})"
    console.print(f"[bold]roctune doctor[/bold]{where}: user {m.user}, torch {t.get('version') or 'missing'} "
                  f"({t.get('backend')}{' ' + (t.get('hip') or t.get('cuda') or '') if t.get('backend') in ('rocm', 'cuda') else ''})")
    if m.gpus:
        gt = Table(title="GPUs", title_justify="left")
        for col in ("#", "vendor", "name", "arch", "VRAM", "used"):
            gt.add_column(col)
        for i, g in enumerate(m.gpus):
            gt.add_row(str(i), g.vendor, g.name, g.gfx or g.compute_capability or "?",
                       _gib(g.vram_bytes), _gib(g.vram_used_bytes))
        console.print(gt)
    ft = Table(title="Checks", title_justify="left", show_lines=True)
    ft.add_column("check", no_wrap=True)
    ft.add_column("level", no_wrap=True)
    ft.add_column("finding (why, fix)")
    for f in report.findings:
        finding = Text(f.message)
        if f.why:
            finding.append("\n" + f.why, style="dim")
        if f.fix:
            finding.append("\nfix: ", style="bold")
            finding.append(f.fix, style="cyan")
        ft.add_row(f.id, Text(f.level.upper(), style=LEVEL_STYLE[f.level]), finding)
    console.print(ft)
    console.print(Text.assemble("verdict: ", (report.verdict.upper(), LEVEL_STYLE[report.verdict])))


def _gib(n) -> str:
    return f"{n / 2**30:.1f} GiB" if n else "-"


def _explain(doctor, args) -> int:
    text = doctor.read_log(args.explain)
    found = doctor.explain(text)
    if args.json:
        from dataclasses import asdict

        print(json.dumps({"matches": [asdict(e) for e in found]}, indent=2))
        return 0
    source = "stdin" if args.explain == "-" else args.explain
    if not found:
        print(f"Nothing in {source} matched a known failure. Run `roctune doctor` to check the machine, "
              "and look at the first Traceback in the log.")
        return 0
    out = sys.stdout
    for e in found:
        print(f"== {e.title}  [{e.id}, line {e.line}]", file=out)
        print(f"   log:   {e.evidence}", file=out)
        print(f"   cause: {e.cause}", file=out)
        for fix in e.fix:
            print(f"   fix:   {fix}", file=out)
        print(file=out)
    return 0
