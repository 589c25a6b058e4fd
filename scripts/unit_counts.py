"""Where the units' facts are spelled out, counted from the code's own syntax (issue 47's before/after counts).

- methods: string literals that are a method name (lora, qlora, freeze, full), comparisons with them and with lists
  of names kept by hand, outside the method rows (roctune/method_rows.py) and the methods' own files
  (roctune/methods/); a comparison that asks a row (`run.stage.produces != SCORER`) is not counted;
- stages: the same for the stage names (sft, pt, dpo, kto, rm, grpo) outside the stage rows (roctune/stages.py) and
  the stages' own recipe files, rm and pt shown apart;
- quant facts: displays (tuple, list, set, dict) holding two or more quant names, and quant names given as a default
  (a parameter's, a flag's, an `x or "q8_0"`; f16/bf16 defaults are dtypes), each a place where a fact about the
  quant types is declared;
- vLLM facts: the files that state what vLLM can load, its LoRA rank limit, its server command line or a tool
  format's vLLM parser (and the hermes branch of the streaming parse), counted once per fact and file.

Not counted: a method name used as something else (the "lora" group of flags, the doctor's "qlora" check, the
GGUF's adapter type "lora", the doctor's check titles) and a stage name used as something else ("pt" as torch's
tensor type, "grpo" as a GRPO loss type); they are listed in IGNORED below.

    python scripts/unit_counts.py          # the totals
    python scripts/unit_counts.py -v       # and every place, file:line
    python scripts/unit_counts.py DIR      # another tree's roctune/ (e.g. main's, exported with git archive)
"""
from __future__ import annotations

import ast
import os
import sys

ROOT = next((a for a in sys.argv[1:] if not a.startswith("-")), None) or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "roctune")
METHODS = {"lora", "qlora", "freeze", "full"}
STAGES = {"sft", "pt", "dpo", "kto", "rm", "grpo"}
QUANTS = {"f16", "bf16", "q8_0", "q4_k_m", "q4_k_s", "q5_k_m", "q5_k_s", "q6_k", "q3_k_m", "q2_k", "q4_0", "q5_0"}
# the units' own rows and files: naming themselves there is the point
METHOD_HOME = ("method_rows.py", "methods/")
STAGE_HOME = ("stages.py", "recipes/")
# (keyword argument, or call whose first arguments these are): a name meaning something else
IGNORED_KEYWORDS = {"group", "framework", "return_tensors"}
IGNORED_CALLS = {"safe_open", "add", "add_string"}  # safe_open(path, "pt"); doctor's out.add("qlora"); GGUF's type
IGNORED_NAMES = ("GROUP_TITLES", "GROUP_TITLES_ZH", "FORM_GROUPS", "OPEN_GROUPS", "LOSS_TYPES", "CHECK_TITLES")
# lists of unit names kept by hand outside the rows, which a comparison of a `method`/`stage` tests against
HAND_LISTS = {"ADAPTER_METHODS", "METHODS", "AUTO_RECIPES"}
# vLLM facts: (what, code that states it: the declaration, or a test of it written out again)
VLLM_FACTS = (("what vLLM can load", ("def unloadable(", "PLAIN_INITS = (", 'lm_head|wte"', '"lm_head", "wte"')),
              ("its LoRA rank limit", ("LORA_RANKS = (", "LORA_RANKS[-1]")),
              ("its server command line", ('"--enable-lora"',)),
              ("tool formats' vLLM parsers and streaming", ("TOOL_PARSERS = {", 'TOOL_FORMATS["hermes"]',
                                                           "vllm_parser=")))


def _files():
    for folder, _, files in os.walk(ROOT):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                yield os.path.relpath(path, ROOT).replace(os.sep, "/"), path


def _parents(tree):
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    return parents


def _ignored(node, parents) -> bool:
    """A name literal that means something other than the unit (see the module docstring)."""
    parent = parents.get(node)
    if isinstance(parent, ast.keyword) and parent.arg in IGNORED_KEYWORDS:
        return True
    if isinstance(parent, ast.Call) and node in parent.args:
        func = parent.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in IGNORED_CALLS:
            return True
    while parent is not None:  # inside an assignment to a table of something else
        if isinstance(parent, (ast.Assign, ast.AnnAssign)):
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            return any(isinstance(t, ast.Name) and t.id.endswith(IGNORED_NAMES) for t in targets)
        parent = parents.get(parent)
    return False


def named(names: set[str], home: tuple[str, ...], word: str) -> list[str]:
    """file:line of each literal name and each comparison of a `word` (method, stage) outside `home`."""
    out = []
    for rel, path in _files():
        if rel.startswith(home) or rel in home:
            continue
        src = open(path, encoding="utf-8").read()
        tree = ast.parse(src)
        parents = _parents(tree)
        counted = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                texts = [ast.get_source_segment(src, s) or "" for s in sides]
                lits = [c for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant) and c.value in names]
                lists = [s for s in sides if isinstance(s, ast.Name) and s.id in HAND_LISTS]
                if any("loss_type" in t for t in texts):  # "grpo" as a GRPO loss type, not a stage
                    counted.update(lits)
                    continue
                if lits or (lists and any(word in t for t in texts)):
                    shown = " ".join(ast.get_source_segment(src, node).split())[:70]
                    out.append(f"{rel}:{node.lineno} compares {shown}")
                    counted.update(lits)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and node not in counted \
                    and not _ignored(node, parents):
                out.append(f"{rel}:{node.lineno} names {node.value!r}")
    return out


def quant_places() -> list[str]:
    out = []
    for rel, path in _files():
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in ast.walk(tree):
            items = None
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                items = node.elts
            elif isinstance(node, ast.Dict):
                items = node.keys
            if items is not None:
                n = sum(isinstance(i, ast.Constant) and i.value in QUANTS for i in items)
                if n >= 2:
                    out.append(f"{rel}:{node.lineno} a table of {n} quant names")
                continue
            if isinstance(node, ast.arguments):
                for d in node.defaults + [d for d in node.kw_defaults if d is not None]:
                    if isinstance(d, ast.Constant) and d.value in QUANTS and d.value.startswith("q"):
                        out.append(f"{rel}:{d.lineno} default {d.value!r}")
            elif isinstance(node, ast.keyword) and node.arg in ("default", "value") and \
                    isinstance(node.value, ast.Constant) and node.value.value in QUANTS and \
                    node.value.value.startswith("q"):
                out.append(f"{rel}:{node.lineno} default {node.value.value!r}")
            elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and any(
                    isinstance(v, ast.Constant) and v.value in QUANTS for v in node.values):
                out.append(f"{rel}:{node.lineno} fallback to a quant name")
    return out


def vllm_places() -> list[str]:
    out = []
    for rel, path in _files():
        lines = open(path, encoding="utf-8").read().splitlines()
        for what, marks in VLLM_FACTS:
            hits = [i + 1 for i, line in enumerate(lines) if any(m in line for m in marks)]
            if hits:
                out.append(f"{rel}:{hits[0]} {what}")
    return out


def main() -> None:
    verbose = "-v" in sys.argv
    methods = named(METHODS, METHOD_HOME, "method")
    stages = named(STAGES, STAGE_HOME, "stage")
    rm_pt = [p for p in stages if "'rm'" in p or "'pt'" in p or '"rm"' in p or '"pt"' in p]
    quants, vllm = quant_places(), vllm_places()
    rows = (("method names/literals/comparisons outside the method rows", methods),
            ("stage names/comparisons outside the stage rows and recipes", stages),
            ("  of which rm or pt", rm_pt),
            (f"quant facts declared (places; files: {len({q.split(':')[0] for q in quants})})", quants),
            (f"vLLM facts declared (fact x file; files: {len({v.split(':')[0] for v in vllm})})", vllm))
    for title, places in rows:
        print(f"{len(places):4d}  {title}")
        if verbose:
            for p in places:
                print(f"        {p}")


if __name__ == "__main__":
    main()
