"""Count the non-clean runs of the hostile GGUF cases (issue 46) per class and command, for any checkout of roctune:
the cases of tests/test_hostile_gguf.py (tests/hostile_gguf.py writes the files and runs them), judged the same
way (clean: refused in one line naming the file, exit 2, nothing written, no template code run). Run it on this
checkout and on one without the GGUF checks to compare them:

    git worktree add /tmp/gguf-before main     # or any commit
    PYTHONPATH=. python scripts/hostile_gguf_counts.py --roctune /tmp/gguf-before --timeout 20
    PYTHONPATH=. python scripts/hostile_gguf_counts.py

A case still running after --timeout seconds counts as a hang (`serve` on a base it should refuse keeps
serving); each case may add --memory-gib of address space (a template that writes without end on code without the
limits stops at a MemoryError instead of filling the machine's memory).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--roctune", help="the checkout whose roctune runs (default: this one)")
    ap.add_argument("--timeout", type=float, default=20)
    ap.add_argument("--memory-gib", type=float, default=3)
    ap.add_argument("--commands", default="preview,train,serve")
    ap.add_argument("--verbose", action="store_true", help="each non-clean case and why")
    args = ap.parse_args()
    from hostile_gguf import CLASSES, prepare, problem, run_cases

    commands = args.commands.split(",")
    with tempfile.TemporaryDirectory(prefix="hostile-gguf-") as root:
        cases, folders = prepare(Path(root))
        cases = [c for c in cases if c["name"].split("/")[1] in commands]
        ran = run_cases(cases, args.timeout, args.roctune, args.memory_gib)
        bad, why = collections.Counter(), collections.Counter()
        for name, r in ran.items():
            reason = problem(r, folders[name], args.timeout)
            if reason:
                case, command = name.split("/")
                cls = next(c for c, members in CLASSES.items() if case in members)
                bad[cls, command] += 1
                why[reason.split(":")[0].split(",")[0]] += 1
                if args.verbose:
                    print(f"{name}: {reason[:300]!r}")
    print(f"roctune from {args.roctune or 'this checkout'}: non-clean runs of {len(ran)}")
    print(f"{'class':18s} {'cases':>5s} " + " ".join(f"{c:>8s}" for c in commands))
    for cls, members in CLASSES.items():
        print(f"{cls:18s} {len(members):5d} " + " ".join(f"{bad[cls, c]:8d}" for c in commands))
    print("how: " + ", ".join(f"{k} {v}" for k, v in why.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
