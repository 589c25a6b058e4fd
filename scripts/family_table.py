"""Write the README's model-family support table from a run of the matrix test (tests/test_families.py).

The table is never written by hand: this runs the matrix, reads what it found (.cache/family_results.json, written
by its last test) and replaces the README between the family-table markers. `make test` then checks that the README
still says what the matrix finds.

    .venv/bin/python scripts/family_table.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    results = os.path.join(REPO, ".cache", "family_results.json")
    if os.path.exists(results):
        os.unlink(results)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_families.py"],
                   cwd=REPO, check=False)
    if not os.path.exists(results):
        print("family_table: the matrix did not run to its last test; fix the failures above", file=sys.stderr)
        return 1
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from test_families import TABLE_END, TABLE_START, render_table

    with open(results, encoding="utf-8") as f:
        table = render_table(json.load(f))
    path = os.path.join(REPO, "README.md")
    readme = open(path, encoding="utf-8").read()
    start, end = readme.index(TABLE_START) + len(TABLE_START), readme.index(TABLE_END)
    with open(path, "w", encoding="utf-8") as f:
        f.write(readme[:start] + "\n" + table + "\n" + readme[end:])
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
