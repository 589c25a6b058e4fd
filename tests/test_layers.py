"""The layers of the code base, top to bottom; imports (module-level and inside functions) only point down or
sideways. A new module gets a layer here; an import that points up fails this test with the line to fix."""
from __future__ import annotations

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "roctune")

LAYERS = [  # top first
    ("commands", ["cli", "commands", "__main__"]),
    ("front ends", ["webui", "serve", "bench", "doctor"]),
    ("recipes", ["recipes"]),
    ("inference: generation, merge, export, evaluation", ["generate", "decoding", "merge", "export", "eval", "agents"]),
    ("training engine", ["training"]),
    ("models", ["models", "hub", "methods", "memory", "vision", "gguf_header", "gguf_model"]),
    ("data formats", ["data"]),
    ("run directory and settings", ["rundir", "config"]),
    ("hardware, model-family, catalog, stage and method facts", ["hardware", "families", "catalog", "stages",
                                                                 "method_rows"]),
    ("errors", ["errors", "interrupts", "progress", "strict_yaml", "__init__"]),
]
RANK = {name: len(LAYERS) - i for i, (_, names) in enumerate(LAYERS) for name in names}


def _top(module: str) -> str:
    """roctune.training.loop -> training; roctune -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: str, package: str):
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] if base == "roctune" else [base]
            for name in names:
                yield node.lineno, name


def test_every_module_has_a_layer_and_imports_point_down():
    problems = []
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
            module = rel[:-len(".__init__")] if rel.endswith(".__init__") else rel
            mine = _top(module if module != "roctune" else "roctune.__init__")
            assert mine in RANK, f"{rel}: add its top-level name {mine!r} to a layer in tests/test_layers.py"
            for line, target in _imports(path, module if f == "__init__.py" else module.rsplit(".", 1)[0]):
                if target.split(".")[0] != "roctune" or target == "roctune":
                    continue
                other = _top(target)
                if RANK.get(other, 0) > RANK[mine]:
                    problems.append(f"{rel}.py:{line} imports {target} from a higher layer")
    assert not problems, "\n".join(problems)


def test_every_module_fits_500_lines():
    """A module holds one job: past 500 lines it holds several (split it, as rundir/ and config/ are split)."""
    long = []
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                n = sum(1 for _ in open(os.path.join(folder, f), encoding="utf-8"))
                if n > 500:
                    long.append(f"{os.path.relpath(os.path.join(folder, f), ROOT)}: {n} lines")
    assert not long, "\n".join(long)
