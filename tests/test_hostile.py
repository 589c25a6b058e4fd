"""Hostile input across every command (issue 13): each bad path, number or file is refused with exit 2 and one
line on stderr that names the flag, file or line, with no traceback; nothing is written, every file in the
working folder stays byte-identical (mode too), and no code from a pickle or a model folder runs (a marker file
would appear). Most cases fail before any model loads; the few that need one use the tiny model."""
from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import stat
import sys

import pytest

from roctune.cli import main

MARKER = "PWNED"  # the file a pickle payload or a model folder's code would create


class Payload:
    """Unpickling this creates the marker file: a checkpoint that runs code when loaded with pickle."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _unwritable_folder(root) -> str:
    """A folder the test user cannot create files in: chmod 555, or /proc/self for root (which ignores modes)."""
    if os.geteuid() == 0:
        return "/proc/self"
    ro = root / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    return str(ro)


def _write_rows(path, rows) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def _remote_code_model(folder, tiny_model_dir) -> None:
    """A model folder whose config points at its own Python (auto_map): importing it creates the marker."""
    import shutil

    shutil.copytree(tiny_model_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type="roctune_evil", auto_map={"AutoConfig": "evil.EvilConfig",
                                                   "AutoModelForCausalLM": "evil.EvilModel"})
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "evil.py").write_text(f"open({str(folder.parent / MARKER)!r}, 'w').close()\n"
                                    "from transformers import LlamaConfig, LlamaForCausalLM\n"
                                    "class EvilConfig(LlamaConfig):\n    model_type = 'roctune_evil'\n"
                                    "class EvilModel(LlamaForCausalLM):\n    config_class = EvilConfig\n")


def _adapter(folder, weights: bytes | None, run_yaml: str | None = None) -> None:
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4,
                                                            "target_modules": ["q_proj"], "task_type": "CAUSAL_LM"}))
    if weights is not None:
        (folder / "adapter_model.safetensors").write_bytes(weights)
    if run_yaml is not None:
        (folder / "run.yaml").write_text(run_yaml)


def _checkpoint_run(folder, tiny_model_dir, damage: str) -> None:
    """A run directory whose only checkpoint is damaged: a pickle optimizer.pt, or a truncated weights/state file."""
    import torch
    from safetensors.torch import save_file

    ck = folder / "checkpoint-2"
    ck.mkdir(parents=True)
    (folder / "run.yaml").write_text(f"base_model: {tiny_model_dir}\nconfig: {{method: lora}}\n")
    (ck / "trainer_state.json").write_text('{"step": 2}')
    save_file({"x": torch.zeros(64)}, str(ck / "adapter_model.safetensors"))
    if damage == "pickle":
        torch.save({"optimizer": Payload(str(folder.parent / MARKER)), "scheduler": {}}, str(ck / "optimizer.pt"))
        torch.save({"torch_rng": torch.get_rng_state()}, str(ck / "rng.pt"))
    else:
        save_file({"t0": torch.zeros(256)}, str(ck / "training_state.safetensors"))
        (ck / "training_state.json").write_text('{"optimizer": {"__tensor__": "t0"}, "scheduler": {}, "rng": []}')
        name = "adapter_model.safetensors" if damage == "weights" else "training_state.safetensors"
        blob = (ck / name).read_bytes()
        (ck / name).write_bytes(blob[:len(blob) // 2])


@pytest.fixture
def ws(tmp_path, monkeypatch, tiny_model_dir):
    """The working folder of a hostile user, with every bad file the cases below name."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from safetensors.torch import save as st_save
    import torch

    w = tmp_path / "w"
    w.mkdir()
    _write_rows(w / "d.jsonl", [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(4)])
    (w / "deep.jsonl").write_text('{"a": ' + "[" * 100000 + "]" * 100000 + "}\n")
    (w / "deep.json").write_text('[{"a": ' + "[" * 100000 + "]" * 100000 + "}]\n")
    (w / "deep.yaml").write_text("lr: " + "[" * 10000 + "]" * 10000 + "\n")
    (w / "latin1.yaml").write_bytes(b"lr: 1e-4\n# caf\xe9\n")
    (w / "latin1.jsonl").write_bytes(b'{"instruction": "caf\xe9", "output": "x"}\n')
    (w / "empty.yaml").write_text("")
    (w / "trust.yaml").write_text("trust_remote_code: true\n")
    (w / "afile").write_text("a plain file\n")
    (w / "existing.jsonl").write_text("the user's own file\n")
    (w / "existing.jsonl").chmod(0o644)
    _write_rows(w / "roles.jsonl", [{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                                                  {"role": "assistant", "content": "c"}]}])
    table = pa.table({"instruction": [f"question {i} " * 4 for i in range(3000)], "output": ["x" * 50] * 3000})
    pq.write_table(table, str(w / "good.parquet"), row_group_size=500, compression="NONE", use_dictionary=False)
    blob = bytearray((w / "good.parquet").read_bytes())
    blob[len(blob) // 2:len(blob) // 2 + 3000] = b"\xff" * 3000
    (w / "corrupt.parquet").write_bytes(bytes(blob))
    (w / "good.parquet").unlink()
    (w / "notmodel").mkdir()
    (w / "notmodel" / "config.json").write_text('{"a": ' + "[" * 100000 + "]" * 100000 + "}")
    (w / "outdir").mkdir()
    (w / "outdir" / "keep.txt").write_text("not a roctune run\n")
    weights = st_save({"x": torch.zeros(64)})
    _adapter(w / "no_weights", None)
    _adapter(w / "truncated", weights[:len(weights) // 2])
    _adapter(w / "bad_run_yaml", weights, run_yaml="config: [unclosed\n")
    _remote_code_model(w / "evil_model", tiny_model_dir)
    _adapter(w / "trusting", weights, run_yaml=f"base_model: {w / 'evil_model'}\nconfig:\n  trust_remote_code: true\n")
    for damage in ("pickle", "weights", "state"):
        _checkpoint_run(w / f"ck_{damage}", tiny_model_dir, damage)
    (w / "userrun" / "notes").mkdir(parents=True)  # a user's project folder that happens to hold a run.yaml
    (w / "userrun" / "run.yaml").write_text(f"base_model: {tiny_model_dir}\nconfig: {{method: lora}}\n")
    (w / "userrun" / "main.py").write_text("print('the user's code')\n")
    (w / "resumable").mkdir()  # what --resume compares: the settings run.yaml recorded
    (w / "resumable" / "run.yaml").write_text(json.dumps({"base_model": str(tiny_model_dir), "config": {
        "stage": "sft", "method": "lora", "model": str(tiny_model_dir), "data": ["d.jsonl"], "lora_r": 8}}))
    (w / "bomb.yaml").write_text("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 16)))
    (w / "dup.yaml").write_text("lr: 1.0e-4\nlr: 1.0e-3\n")
    (w / "variants.yaml").write_text("max-length: 64\nmax_length: 128\n")
    _write_rows(w / "other.jsonl", [{"instruction": "q", "output": "a"}])
    os.mkfifo(w / "fifo.jsonl")
    _write_rows(w / "rolelist.jsonl", [{"messages": [{"role": ["user"], "content": "a"},
                                                     {"role": "assistant", "content": "b"}]}])
    _write_rows(w / "fromobj.jsonl", [{"conversations": [{"from": {"a": 1}, "value": "a"},
                                                         {"from": "gpt", "value": "b"}]}])
    deep = "[" * 50000 + "]" * 50000
    _write_rows(w / "deeparg.jsonl", [{"messages": [{"role": "user", "content": "a"}, {
        "role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": deep}]}]}])
    _write_rows(w / "deeptools.jsonl", [{"messages": [{"role": "user", "content": "a"},
                                                      {"role": "assistant", "content": "b"}], "tools": deep}])
    (w / "lf").mkdir()
    (w / "lf" / "dataset_info.json").write_text('{"x": ' + deep + "}")
    _write_rows(w / os.fsdecode(b"caf\xe9.jsonl"), [{"instruction": "q", "output": "a"}])
    pq.write_table(pa.table({"instruction": ["q"], "output": ["a"], "history": pa.array(
        [[("earlier q", "earlier a")]], type=pa.map_(pa.string(), pa.string()))}), str(w / "map.parquet"))
    for name, change in (("a_notargets", {"target_modules": None}), ("a_rank0", {"r": 0}),
                         ("a_prefix", {"peft_type": "PREFIX_TUNING"}), ("a_rank", {})):
        _adapter(w / name, st_save({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight":
                                    torch.zeros(4 if name == "a_rank" else 2, 64)}))
        doc = json.loads((w / name / "adapter_config.json").read_text())
        doc.update(change)
        (w / name / "adapter_config.json").write_text(json.dumps(doc))
    (w / "badcfg").mkdir()
    (w / "badcfg" / "config.json").write_text("{not json")
    (w / "badtok").mkdir()
    for name in ("config.json", "tokenizer_config.json"):
        (w / "badtok" / name).write_bytes((pathlib.Path(tiny_model_dir) / name).read_bytes())
    (w / "badtok" / "tokenizer.json").write_text('{"model": ')
    (w / "bigint.jsonl").write_text('{"instruction": ' + "7" * 5000 + ', "output": "x"}\n')
    monkeypatch.chdir(w)
    return {"dir": w, "ro": _unwritable_folder(tmp_path), "tiny": tiny_model_dir}


def snapshot(root) -> dict:
    """Every file and folder under `root`: content hash and mode (a new or changed path shows)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            digest = ""
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(p, root)] = (stat.S_IMODE(st.st_mode), digest)
    return out


def refused(argv: list[str], capsys, names: str, stdin: bytes | None = None, monkeypatch=None) -> str:
    """Run `roctune argv`: exit 2, one stderr line naming `names`, no traceback, nothing written or changed."""
    root = os.getcwd()
    before = snapshot(root)
    capsys.readouterr()
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert lines[0].startswith("roctune") and ": error: " in lines[0], lines[0]
    assert names in lines[0], lines[0]
    assert snapshot(root) == before, "something was written or changed"
    assert not os.path.exists(os.path.join(os.path.dirname(root), MARKER)), "code from a file ran"
    return lines[0]


# (case id, argv, what the one line must name). RO is a folder no one may write in; TINY the tiny model.
CASES = {
    "doctor": [
        ("root-missing", "doctor --root nowhere", "--root nowhere"),
        ("root-file", "doctor --root afile", "--root afile"),
        ("explain-missing", "doctor --explain nowhere.log", "nowhere.log"),
        ("explain-under-file", "doctor --explain afile/x.log", "afile/x.log"),
        ("facts-not-json", "doctor --torch-facts notjson", "--torch-facts"),
        ("facts-deep", "doctor --torch-facts @deep.json", "nested too deeply"),
        ("facts-latin1", "doctor --torch-facts @latin1.yaml", "not UTF-8"),
        ("bad-flag", "doctor --frobnicate", "--frobnicate"),
        ("explain-device", "doctor --explain /dev/zero", "/dev/zero"),
    ],
    "data": [
        ("check-max-length-0", "data check d.jsonl --max-length 0", "--max-length"),
        ("preview-index-huge", "data preview d.jsonl --index 1000000000000000000000000000000", "--index"),
        ("check-max-length-negative", "data check d.jsonl --max-length -3", "--max-length"),
        ("scrub-deep-jsonl", "data scrub deep.jsonl outdir/x.jsonl", "deep.jsonl:1"),
        ("scrub-deep-json", "data scrub deep.json outdir/x.json", "deep.json: record 0"),
        ("scrub-corrupt-parquet", "data scrub corrupt.parquet outdir/x.parquet", "corrupt.parquet: row"),
        ("scrub-latin1", "data scrub latin1.jsonl outdir/x.jsonl", "latin1.jsonl:1"),
        ("scrub-existing-out", "data scrub d.jsonl existing.jsonl", "OUT existing.jsonl"),
        ("scrub-out-is-input", "data scrub d.jsonl d.jsonl", "d.jsonl"),
        ("scrub-out-folder", "data scrub d.jsonl outdir", "OUT outdir"),
        ("scrub-out-under-file", "data scrub d.jsonl afile/x.jsonl", "afile"),
        ("scrub-out-read-only", "data scrub d.jsonl RO/x.jsonl", "RO"),
        ("scrub-report-is-out", "data scrub d.jsonl outdir/x.jsonl --report outdir/x.jsonl", "--report"),
        ("scrub-report-is-input", "data scrub d.jsonl outdir/x.jsonl --report d.jsonl", "--report d.jsonl"),
        ("scrub-report-existing", "data scrub d.jsonl outdir/x.jsonl --report existing.jsonl", "--report"),
        ("scrub-missing-input", "data scrub nowhere.jsonl outdir/x.jsonl", "nowhere.jsonl"),
        ("scrub-out-py", "data scrub d.jsonl outdir/evil.py", "keeps the input's format (jsonl)"),
        ("split-ratio-nan", "data split d.jsonl --eval-ratio nan --out-train outdir/a.jsonl --out-eval outdir/b.jsonl",
         "--eval-ratio"),
        ("split-ratio-text", "data split d.jsonl --eval-ratio half --out-train outdir/a.jsonl --out-eval outdir/b.jsonl",
         "--eval-ratio"),
        ("split-seed-negative", "data split d.jsonl --eval-ratio 0.5 --seed -1 --out-train outdir/a.jsonl "
         "--out-eval outdir/b.jsonl", "--seed"),
        ("split-existing-out", "data split d.jsonl --eval-ratio 0.5 --out-train existing.jsonl "
         "--out-eval outdir/b.jsonl", "--out-train existing.jsonl"),
        ("split-out-folder", "data split d.jsonl --eval-ratio 0.5 --out-train outdir --out-eval outdir/b.jsonl",
         "--out-train outdir"),
        ("split-out-read-only", "data split d.jsonl --eval-ratio 0.5 --out-train RO/a.jsonl --out-eval outdir/b.jsonl",
         "RO"),
        ("split-deep", "data split deep.jsonl --eval-ratio 0.5 --out-train outdir/a.jsonl --out-eval outdir/b.jsonl",
         "deep.jsonl:1"),
        ("split-corrupt-parquet", "data split corrupt.parquet --eval-ratio 0.5 --out-train outdir/a.jsonl "
         "--out-eval outdir/b.jsonl", "corrupt.parquet"),
    ],
    "train": [
        ("lr-nan", "train --data d.jsonl --output outdir/r --lr nan", "--lr"),
        ("lr-inf", "train --data d.jsonl --output outdir/r --lr inf", "--lr"),
        ("lora-alpha-nan", "train --data d.jsonl --output outdir/r --lora-alpha nan", "--lora-alpha"),
        ("epochs-nan", "train --data d.jsonl --output outdir/r --epochs nan", "--epochs"),
        ("batch-size-0", "train --data d.jsonl --output outdir/r --batch-size 0", "--batch-size"),
        ("config-latin1", "train --config latin1.yaml --data d.jsonl --output outdir/r", "latin1.yaml"),
        ("config-deep", "train --config deep.yaml --data d.jsonl --output outdir/r", "deep.yaml"),
        ("config-trust-remote-code", "train --config trust.yaml --data d.jsonl --output outdir/r", "trust_remote_code"),
        ("override-trust-remote-code", "train --data d.jsonl --output outdir/r trust_remote_code=true",
         "trust_remote_code"),
        ("data-deep", "train --data deep.jsonl --output outdir/r", "deep.jsonl:1"),
        ("data-corrupt-parquet", "train --data corrupt.parquet --output outdir/r", "corrupt.parquet"),
        ("data-roles-out-of-order", "train --data roles.jsonl --output outdir/r", "roles.jsonl:1"),
        ("overwrite-foreign-folder", "train --data d.jsonl --output outdir --overwrite", "--output outdir"),
        ("output-is-file", "train --data d.jsonl --output afile", "--output afile"),
        ("output-under-file", "train --data d.jsonl --output afile/r", "afile"),
        ("output-read-only", "train --data d.jsonl --output RO/r", "RO"),
        ("output-proc", "train --data d.jsonl --output /proc/x --model TINY", "/proc"),
        ("overwrite-run-with-user-files", "train --data d.jsonl --output userrun --overwrite", "main.py"),
        ("epochs-huge", "train --data d.jsonl --output outdir/r --epochs 1e308", "--epochs"),
        ("max-steps-huge", "train --data d.jsonl --output outdir/r --max-steps 1000000000000000", "--max-steps"),
        ("lora-r-huge", "train --data d.jsonl --output outdir/r --model TINY --lora-r 10000000", "--lora-r"),
        ("config-alias-bomb", "train --config bomb.yaml --data d.jsonl --output outdir/r", "bomb.yaml"),
        ("config-duplicate-key", "train --config dup.yaml --data d.jsonl --output outdir/r", "dup.yaml:2"),
        ("config-spelling-variants", "train --config variants.yaml --data d.jsonl --output outdir/r", "max_length"),
        ("data-fifo", "train --data fifo.jsonl --output outdir/r", "fifo.jsonl"),
        ("data-huge-integer", "train --data bigint.jsonl --output outdir/r", "bigint.jsonl:1"),
        ("resume-other-rank", "train --data d.jsonl --output resumable --resume --model TINY --lora-r 16",
         "--lora-r"),
        ("resume-other-data", "train --data other.jsonl --output resumable --resume --model TINY", "--data"),
        ("resume-other-model", "train --data d.jsonl --output resumable --resume", "--model"),
        ("data-role-list", "train --data rolelist.jsonl --output outdir/r", "rolelist.jsonl:1"),
        ("data-from-object", "train --data fromobj.jsonl --output outdir/r", "fromobj.jsonl:1"),
        ("data-deep-arguments", "train --data deeparg.jsonl --output outdir/r", "deeparg.jsonl:1"),
        ("data-deep-tools", "train --data deeptools.jsonl --output outdir/r", "deeptools.jsonl:1"),
        ("data-deep-dataset-info", "train --data lf:x --output outdir/r", "dataset_info.json"),
        ("data-weight-infinite", "train --data d.jsonl:1e999 --output outdir/r", "weight"),
        ("data-name-not-utf8", "train --data caf\udce9.jsonl --output outdir/r", "not valid UTF-8"),
        ("data-parquet-map", "train --data map.parquet --output outdir/r", "'history'"),
        ("model-config-not-json", "train --data d.jsonl --output outdir/r --model badcfg", "badcfg/config.json"),
        ("model-tokenizer-not-json", "train --data d.jsonl --output outdir/r --model badtok", "tokenizer.json"),
        ("adapter-rank-mismatch", "train --data d.jsonl --output outdir/r --model TINY --adapter a_rank", "rank 4"),
    ],
    "chat": [
        ("max-new-tokens-0", "chat --max-new-tokens 0", "--max-new-tokens"),
        ("temperature-nan", "chat --temperature nan", "--temperature"),
        ("temperature-negative", "chat --temperature -1", "--temperature"),
        ("top-p-5", "chat --top-p 5", "--top-p"),
        ("adapter-missing-weights", "chat --adapter no_weights", "adapter_model.safetensors"),
    ],
    "generate": [
        ("max-new-tokens-0", "generate --prompt hi --max-new-tokens 0", "--max-new-tokens"),
        ("temperature-nan", "generate --prompt hi --temperature nan", "--temperature"),
        ("top-p-5", "generate --prompt hi --top-p 5", "--top-p"),
        ("batch-size-0", "generate --prompt hi --batch-size 0", "--batch-size"),
        ("input-deep", "generate --input deep.jsonl", "deep.jsonl:1"),
        ("output-folder", "generate --input d.jsonl --output outdir", "--output outdir"),
        ("output-is-input", "generate --input d.jsonl --output d.jsonl", "--output d.jsonl"),
        ("output-existing", "generate --input d.jsonl --output existing.jsonl", "--output existing.jsonl"),
        ("output-under-file", "generate --input d.jsonl --output afile/x.jsonl", "afile"),
        ("output-read-only", "generate --input d.jsonl --output RO/x.jsonl", "RO"),
        ("adapter-missing", "generate --prompt hi --adapter nowhere", "--adapter nowhere"),
        ("adapter-missing-weights", "generate --prompt hi --adapter no_weights", "adapter_model.safetensors"),
        ("adapter-truncated", "generate --prompt hi --adapter truncated", "truncated"),
        ("run-yaml-invalid", "generate --prompt hi --adapter bad_run_yaml", "run.yaml"),
        ("adapter-no-targets", "generate --prompt hi --adapter a_notargets", "target_modules"),
        ("adapter-rank-0", "generate --prompt hi --adapter a_rank0", "r is 0"),
        ("adapter-rank-mismatch", "generate --prompt hi --adapter a_rank", "rank 4"),
        ("adapter-not-lora", "generate --prompt hi --adapter a_prefix", "PREFIX_TUNING"),
        ("model-config-not-json", "generate --prompt hi --model badcfg", "badcfg/config.json"),
        ("model-tokenizer-not-json", "generate --prompt hi --model badtok", "badtok/tokenizer.json"),
    ],
    "eval": [
        ("max-new-tokens-0", "eval --adapter no_weights --data d.jsonl --max-new-tokens 0", "--max-new-tokens"),
        ("batch-size-0", "eval --adapter no_weights --data d.jsonl --batch-size 0", "--batch-size"),
        ("adapter-missing", "eval --adapter nowhere --data d.jsonl", "--adapter nowhere"),
        ("run-yaml-invalid", "eval --adapter bad_run_yaml --data d.jsonl", "run.yaml"),
        ("data-deep", "eval --adapter no_weights --data deep.jsonl", "deep.jsonl:1"),
        ("output-not-a-report", "eval --adapter no_weights --data d.jsonl --output outdir", "--output outdir"),
        ("output-read-only", "eval --adapter no_weights --data d.jsonl --output RO/rep", "RO"),
        ("adapter-missing-weights", "eval --adapter no_weights --data d.jsonl", "adapter_model.safetensors"),
    ],
    "export": [
        ("adapter-missing", "export --adapter nowhere --output outdir/e", "--adapter nowhere"),
        ("unknown-quant", "export --adapter truncated --output outdir/e --quant q3_x", "--quant"),
        ("unknown-format", "export --adapter truncated --output outdir/e --format onnx", "--format"),
        ("output-is-adapter", "export --adapter truncated --output truncated --overwrite", "--output truncated"),
        ("overwrite-foreign-folder", "export --adapter truncated --output outdir --overwrite", "--output outdir"),
        ("output-under-file", "export --adapter truncated --output afile/e", "afile"),
    ],
    "merge": [
        ("adapter-missing", "merge --adapter nowhere --output outdir/m", "--adapter nowhere"),
        ("output-is-adapter", "merge --adapter truncated --output truncated --overwrite", "--output truncated"),
        ("output-inside-adapter", "merge --adapter truncated --output truncated/m", "--output truncated/m"),
        ("overwrite-foreign-folder", "merge --adapter truncated --output outdir --overwrite", "--output outdir"),
        ("output-under-file", "merge --adapter truncated --output afile/m", "afile"),
        ("adapter-truncated", "merge --adapter truncated --output outdir/m", "truncated"),
        ("adapter-missing-weights", "merge --adapter no_weights --output outdir/m", "adapter_model.safetensors"),
        ("adapter-rank-mismatch", "merge --adapter a_rank --output outdir/m", "rank 4"),
    ],
    "estimate": [
        ("vram-nan", "estimate --no-detect --vram nan", "--vram"),
        ("vram-inf", "estimate --no-detect --vram inf", "--vram"),
        ("vram-0", "estimate --no-detect --vram 0", "--vram"),
        ("batch-size-0", "estimate --no-detect --batch-size 0", "--batch-size"),
        ("lora-dropout-nan", "estimate --no-detect --lora-dropout nan", "--lora-dropout"),
        ("supervised-fraction-5", "estimate --no-detect --supervised-fraction 5", "--supervised-fraction"),
        ("model-deep-config", "estimate --no-detect --model notmodel", "config.json"),
    ],
    "models": [
        ("pull-path", "models pull ../evil", "not a hub id"),
        ("pull-three-parts", "models pull a/b/c", "not a hub id"),
        ("unknown-action", "models bogus", "bogus"),
    ],
    "bench": [
        ("max-steps-0", "bench --max-steps 0", "--max-steps"),
        ("lr-nan", "bench --lr nan", "--lr"),
        ("batch-size-0", "bench --batch-size 0", "--batch-size"),
        ("lora-alpha-nan", "bench --lora-alpha nan", "--lora-alpha"),
        ("attn-unknown", "bench --attn sdpa,warp", "--attn"),
        ("data-missing", "bench --data nowhere.jsonl", "nowhere.jsonl"),
        ("json-folder", "bench --json outdir", "--json outdir"),
        ("json-foreign-file", "bench --json existing.jsonl", "--json existing.jsonl"),
        ("json-read-only", "bench --json RO/b.json", "RO"),
    ],
    "serve": [
        ("port-out-of-range", "serve --port 99999", "--port"),
        ("batch-wait-nan", "serve --batch-wait-ms nan", "--batch-wait-ms"),
        ("max-batch-0", "serve --max-batch 0", "--max-batch"),
        ("threads-negative", "serve --threads -1", "--threads"),
        ("adapter-root-missing", "serve --adapter-root nowhere", "--adapter-root"),
        ("adapter-spec", "serve --adapter nodir", "--adapter"),
        ("host-without-key", "serve --host 0.0.0.0", "--host 0.0.0.0"),
    ],
    "webui": [
        ("port-0", "webui --port 0", "--port"),
        ("root-missing", "webui --root nowhere", "--root nowhere"),
        ("host-without-auth", "webui --host 0.0.0.0", "--host 0.0.0.0"),
        ("auth-malformed", "webui --auth nocolon", "--auth"),
        ("auth-file-missing", "webui --auth-file nowhere", "--auth-file"),
        ("auth-file-fifo", "webui --auth-file fifo.jsonl", "--auth-file fifo.jsonl: not a regular file"),
    ],
}
PARAMS = [pytest.param(cmd, argv, names, id=f"{cmd}-{cid}") for cmd, cases in CASES.items()
          for cid, argv, names in cases]


@pytest.mark.parametrize("command, argv, names", PARAMS)
def test_refused_cleanly(ws, capsys, command, argv, names):
    ro = ws["ro"]
    args = [a.replace("RO", ro).replace("TINY", str(ws["tiny"])) for a in argv.split()]
    refused(args, capsys, names.replace("RO", ro))


def test_count_per_command():
    """The suite covers every command of the CLI (and the issue asks for 60+ cases)."""
    from roctune.cli import COMMANDS

    assert set(CASES) == set(COMMANDS)
    assert len(PARAMS) >= 60


# ----------------------------------------------------------------- cases where the tiny model has to load
def test_run_yaml_trust_remote_code_never_runs_the_model_folders_code(ws, capsys):
    line = refused(["generate", "--prompt", "hi", "--adapter", "trusting"], capsys, "trust")
    assert "--trust-remote-code" in line or "trust_remote_code" in line


@pytest.mark.parametrize("damage, names", [("pickle", "optimizer.pt"), ("weights", "adapter_model.safetensors"),
                                           ("state", "training_state.safetensors")])
def test_resume_from_a_damaged_checkpoint(ws, capsys, damage, names):
    refused(["train", "--data", "d.jsonl", "--output", f"ck_{damage}", "--resume", "--model", ws["tiny"],
             "--max-steps", "3", "--max-length", "128", "--save-steps", "1"], capsys, names)


def test_chat_refuses_non_utf8_stdin(ws, capsys, monkeypatch):
    line = refused(["chat", "--model", ws["tiny"], "--max-new-tokens", "2"], capsys, "stdin line 1",
                   stdin=b"caf\xe9\n", monkeypatch=monkeypatch)
    assert "UTF-8" in line


def test_scrub_overwrite_keeps_the_files_mode(ws, capsys):
    out = ws["dir"] / "existing.jsonl"
    out.chmod(0o640)
    assert main(["data", "scrub", "d.jsonl", str(out), "--overwrite"]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert out.read_text().count("\n") == 4


# ------------------------------------------------------------------------------- web UI path confinement
@pytest.mark.parametrize("text", ["/etc/passwd", "../outside.jsonl", "sub/../../outside.jsonl", "link/x"])
def test_webui_paths_stay_inside_the_workspace(ws, text):
    from roctune.errors import ConfigError
    from roctune.webui.workspace import Workspace

    root = ws["dir"] / "outdir"
    (root / "link").symlink_to(ws["dir"])
    space = Workspace(str(root))
    before = snapshot(ws["dir"])
    with pytest.raises(ConfigError, match="outside the workspace"):
        space.path(text, "--output", write=True)
    assert snapshot(ws["dir"]) == before


def test_webui_merge_handler_refuses_outside_paths(ws):
    from roctune.webui.export import merge_handler
    from roctune.webui.workspace import Workspace

    before = snapshot(ws["dir"])
    html = merge_handler(Workspace(str(ws["dir"] / "outdir")))(str(ws["dir"] / "truncated"), "../m", "fp32", True)
    assert "outside the workspace" in str(html)
    assert snapshot(ws["dir"]) == before
