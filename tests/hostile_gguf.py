"""GGUF files for the hostile-input tests, written with the `gguf` package's GGUFWriter (a tiny llama: hidden size 32,
one layer, a byte-level vocabulary of 260 tokens with ChatML's markers, a ChatML chat template) and, for the
broken headers no writer would produce, as raw bytes. Each builder takes the changes that make it hostile."""
from __future__ import annotations

import struct

import numpy as np

HIDDEN, HEADS, KV_HEADS, FF, LAYERS = 32, 2, 1, 64, 1
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGED = "\u0120t"  # one merge (space + t), so the vocabulary has merges to read


def _byte_tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    return [spelling[b] for b in range(256)]


def _tensors(vocab: int, layers: int) -> dict[str, np.ndarray]:
    """llama.cpp's tensor names; shapes in numpy order (ggml's reversed), small random values."""
    rng = np.random.default_rng(0)
    head = HIDDEN // HEADS

    def w(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    out = {"token_embd.weight": w(vocab, HIDDEN), "output_norm.weight": np.ones(HIDDEN, np.float32)}
    for i in range(layers):
        out.update({f"blk.{i}.attn_norm.weight": np.ones(HIDDEN, np.float32),
                    f"blk.{i}.attn_q.weight": w(HEADS * head, HIDDEN),
                    f"blk.{i}.attn_k.weight": w(KV_HEADS * head, HIDDEN),
                    f"blk.{i}.attn_v.weight": w(KV_HEADS * head, HIDDEN),
                    f"blk.{i}.attn_output.weight": w(HIDDEN, HEADS * head),
                    f"blk.{i}.ffn_norm.weight": np.ones(HIDDEN, np.float32),
                    f"blk.{i}.ffn_gate.weight": w(FF, HIDDEN),
                    f"blk.{i}.ffn_up.weight": w(FF, HIDDEN),
                    f"blk.{i}.ffn_down.weight": w(HIDDEN, FF)})
    return out


def write_gguf(path, template: str | None = CHATML, meta: dict | None = None, layers: int = LAYERS,
               tensors: dict | None = None) -> str:
    """A tiny llama GGUF at `path`. `meta`: metadata keys set (a value) or dropped (None) after the defaults;
    `layers`: how many blocks of tensors it holds; `tensors`: tensors replaced (an array) or dropped (None)."""
    import gguf

    tokens = _byte_tokens() + [MERGED] + list(SPECIALS)
    defaults = {"llama.context_length": 256, "llama.embedding_length": HIDDEN, "llama.block_count": LAYERS,
                "llama.feed_forward_length": FF, "llama.attention.head_count": HEADS,
                "llama.attention.head_count_kv": KV_HEADS, "llama.rope.dimension_count": HIDDEN // HEADS,
                "llama.attention.layer_norm_rms_epsilon": 1e-5, "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
                "tokenizer.ggml.token_type": [1] * 257 + [3] * len(SPECIALS),
                "tokenizer.ggml.merges": [" ".join(MERGED)], "tokenizer.ggml.bos_token_id": 257,
                "tokenizer.ggml.eos_token_id": 259, "tokenizer.ggml.padding_token_id": 257, "tokenizer.chat_template": template}
    defaults.update(meta or {})
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    for key, value in defaults.items():
        _add(w, key, value)
    arrays = _tensors(len(tokens), layers)
    arrays.update(tensors or {})
    for name, array in arrays.items():
        if array is not None:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _add(w, key: str, value) -> None:
    import gguf

    if value is None:
        return
    if isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value) if 0 <= value < 2 ** 32 else w.add_key_value(key, value, gguf.GGUFValueType.UINT64)
    else:
        w.add_array(key, value)


# Broken headers: raw bytes after the magic and version (GGUF v3, little-endian).
def _string(text: bytes, length: int | None = None) -> bytes:
    return struct.pack("<Q", len(text) if length is None else length) + text


def raw_header(tensor_count: int = 0, kv_count: int = 1, body: bytes | None = None) -> bytes:
    """GGUF v3 with the given counts and metadata bytes (default: general.architecture = llama)."""
    if body is None:
        body = _string(b"general.architecture") + struct.pack("<I", 8) + _string(b"llama")
    return b"GGUF" + struct.pack("<IQQ", 3, tensor_count, kv_count) + body


BROKEN_HEADERS = {  # name: the file's bytes
    "kv-count-2^62": raw_header(kv_count=2 ** 62),
    "tensor-count-2^62": raw_header(tensor_count=2 ** 62),
    "string-2^60": raw_header(body=_string(b"general.architecture") + struct.pack("<I", 8)
                              + _string(b"llama", 2 ** 60)),
    "key-2^60": raw_header(body=_string(b"general.architecture", 2 ** 60)),
    "array-2^62": raw_header(body=_string(b"general.architecture") + struct.pack("<I", 8) + _string(b"llama")
                             + _string(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 0, 2 ** 62),
                             kv_count=2),
    "not-gguf": b"PK\x03\x04" + bytes(60),
    "empty": b"",
}


def truncated(path, out) -> str:
    """The file at `path` cut in the middle of its tensor data."""
    blob = open(path, "rb").read()
    open(out, "wb").write(blob[:len(blob) * 2 // 3])
    return str(out)


# ---------------------------------------------------------------------------------------- the cases
MARKER = "PWNED"
NESTED = "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}" + CHATML
HUGE = "{% for a in range(99999) %}{{ 'x' * 99999 }}{% endfor %}" + CHATML
TEMPLATES = {  # case: the GGUF's chat template
    "template-nested-loops": NESTED,
    "template-huge-output": HUGE,
    "template-doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                         "{% endfor %}" + CHATML,
    "template-raises": "{{ raise_exception('this template refuses every conversation') }}",
    "template-mro": "{{ ''.__class__.__mro__[1].__subclasses__() }}" + CHATML,
    "template-globals": "{{ cycler.__init__.__globals__.os.system('touch " + MARKER + "') }}" + CHATML,
    "template-self": "{{ self._TemplateReference__context.environment }}" + CHATML,
    "template-syntax": "{% for m in messages %}{{ m['content'] }",
}
META = {  # case: metadata changed
    "bos-past-vocab": {"tokenizer.ggml.bos_token_id": 100000},
    "eos-past-vocab": {"tokenizer.ggml.eos_token_id": 2 ** 31},
    "zero-heads": {"llama.attention.head_count": 0},
    "kv-heads-not-dividing": {"llama.attention.head_count_kv": 3},
    "vocab-size-10": {"llama.vocab_size": 10},
    "block-count-1000": {"llama.block_count": 1000},
    "block-count-list": {"llama.block_count": [1, 1]},
    "no-vocabulary": {"tokenizer.ggml.tokens": None, "tokenizer.ggml.token_type": None},
}
COMMANDS = {
    "preview": ["data", "preview", "d.jsonl", "--model", "{file}"],
    "train": ["train", "--model", "{file}", "--data", "d.jsonl", "--output", "run", "--max-steps", "1"],
    "serve": ["serve", "--model", "{file}", "--port", "0"],
}
SHAPES = ("attn-q-shape", "ffn-down-shape", "embedding-rows", "missing-attn-k", "missing-output-norm")
CLASSES = {  # the issue's classes: {class: its cases}
    "GGUF header": ("truncated", *BROKEN_HEADERS),
    "GGUF metadata": (*META, *SHAPES),
    "template attacks": tuple(TEMPLATES),
}
CASES = [case for cases in CLASSES.values() for case in cases]


def case_files(folder) -> dict[str, str]:
    """{case: path of its hostile file}, written into `folder`."""
    out = {}
    for name, template in TEMPLATES.items():
        out[name] = write_gguf(folder / f"{name}.gguf", template=template)
    for name, meta in META.items():
        out[name] = write_gguf(folder / f"{name}.gguf", meta=meta)
    out["attn-q-shape"] = write_gguf(folder / "attn-q-shape.gguf",
                                     tensors={"blk.0.attn_q.weight": np.zeros((HIDDEN * 2, HIDDEN), np.float32)})
    out["ffn-down-shape"] = write_gguf(folder / "ffn-down-shape.gguf",
                                       tensors={"blk.0.ffn_down.weight": np.zeros((HIDDEN, FF // 2), np.float32)})
    out["embedding-rows"] = write_gguf(folder / "embedding-rows.gguf",
                                       tensors={"token_embd.weight": np.zeros((300, HIDDEN), np.float32)})
    out["missing-attn-k"] = write_gguf(folder / "missing-attn-k.gguf", tensors={"blk.0.attn_k.weight": None})
    # a tensor the checks do not ask for: transformers would leave the final norm random (its loading info says so)
    out["missing-output-norm"] = write_gguf(folder / "missing-output-norm.gguf", tensors={"output_norm.weight": None})
    out["truncated"] = truncated(write_gguf(folder / "whole.gguf"), folder / "truncated.gguf")
    for name, blob in BROKEN_HEADERS.items():
        (folder / f"{name}.gguf").write_bytes(blob)
        out[name] = str(folder / f"{name}.gguf")
    return out


def snapshot(root) -> dict[str, int]:
    import os

    return {os.path.relpath(os.path.join(d, f), root): os.path.getsize(os.path.join(d, f))
            for d, _, files in os.walk(root) for f in files}


def prepare(root) -> tuple[list[dict], dict]:
    """(the cases for run_cases, {"case/command": (working folder, home, file, the folder's files before)}):
    every case under every command, each in a working folder and a $ROCTUNE_HOME of its own under `root`."""
    import json

    (root / "files").mkdir()
    cases, folders = [], {}
    for case, path in case_files(root / "files").items():
        for command, argv in COMMANDS.items():
            cwd, home = root / command / case / "w", root / command / case / "home"
            cwd.mkdir(parents=True)
            home.mkdir()
            (cwd / "d.jsonl").write_text(json.dumps({"instruction": "Say hi.", "output": "Hi."}) + "\n")
            folders[f"{case}/{command}"] = (cwd, home, path, snapshot(cwd))
            cases.append({"name": f"{case}/{command}", "cwd": str(cwd), "home": str(home),
                          "argv": [a.replace("{file}", path) for a in argv]})
    return cases, folders


def problem(r: dict, folders: tuple, timeout: float) -> str | None:
    """What is not clean about a case's run (None: refused in one line naming the file, exit 2, nothing written,
    no code run)."""
    import os

    cwd, home, path, before = folders
    lines = r["err"].strip().splitlines()
    checks = ((r["rc"] is None, f"still running after {timeout} s (a hang)"),
              ("Traceback" in r["err"], "a traceback: " + r["err"][-3000:]),
              (r["rc"] != 2 or len(lines) != 1, f"exit {r['rc']}, {len(lines)} lines: " + r["err"][-3000:]),
              (bool(lines) and (path not in lines[0] or ": error: " not in lines[0]), f"not naming the file: {lines}"),
              (os.path.exists(home / "models"), "wrote under $ROCTUNE_HOME/models"),
              (snapshot(cwd) != before, "wrote in the working folder"),
              ((cwd / MARKER).exists(), "ran the template's code"))
    return next((why for bad, why in checks if bad), None)


# ---------------------------------------------------------------------------------------- running the CLI
# Every case runs `roctune ...` in a process of its own, forked from one driver process that imported roctune,
# torch and transformers once (a fresh interpreter per case would spend ~5 s importing); a case that does not end
# within the timeout is killed and reported as a hang. (Forked before any torch op ran: no OpenMP pool to inherit.)
def run_cases(cases: list[dict], timeout: float, roctune: str | None = None, memory_gib: float = 0) -> dict[str, dict]:
    """{name: {"rc", "err", "out", "seconds"}} for cases {"name", "argv", "cwd", "home"}; rc None: killed after
    `timeout` seconds. `roctune`: the checkout whose roctune runs (default this one); `memory_gib`: address space a
    case may add to the driver's (0: no limit; scripts/hostile_gguf_counts.py runs code without the checks)."""
    import json
    import os
    import subprocess
    import sys

    roctune = roctune or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (roctune, os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, os.path.abspath(__file__), str(timeout), str(memory_gib)],
                       input=json.dumps(cases),
                       capture_output=True, text=True, env=env, timeout=timeout * len(cases) + 300)
    if r.returncode:
        raise RuntimeError(f"the case driver failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.splitlines()[-1])


def _run_one(case: dict, timeout: float, memory_gib: float) -> dict:
    import os
    import signal
    import sys
    import time

    err, out = os.path.join(case["cwd"], ".stderr"), os.path.join(case["cwd"], ".stdout")
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: roctune's CLI in the case's folder and home, its output into two files
        try:
            if memory_gib:
                import resource

                with open("/proc/self/statm") as f:
                    size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
                limit = size + int(memory_gib * 2 ** 30)
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            os.chdir(case["cwd"])
            os.environ["ROCTUNE_HOME"] = case["home"]
            for fd, path in ((1, out), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            from roctune.cli import main

            try:
                rc = main(case["argv"])
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - printed as the traceback the test looks for
            import traceback

            traceback.print_exc()
            rc = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    rc = None
    while time.monotonic() - start < timeout:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    read = lambda p: open(p, errors="replace").read() if os.path.exists(p) else ""  # noqa: E731
    result = {"rc": rc, "err": read(err), "out": read(out)[-2000:], "seconds": round(time.monotonic() - start, 2)}
    for p in (err, out):
        if os.path.exists(p):
            os.unlink(p)
    return result


if __name__ == "__main__":  # the driver run_cases starts
    import json
    import sys

    # Imported once here, so that every forked case starts warm (cold, each case spent 0.3-0.5 s importing).
    import fastapi  # noqa: F401
    import gguf  # noqa: F401
    import jinja2  # noqa: F401
    import rich  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import transformers.generation.utils  # noqa: F401
    import transformers.modeling_utils  # noqa: F401
    import transformers.utils.chat_template_utils  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import roctune.cli  # noqa: F401 - and what the three commands import on their way to a refusal
    import roctune.commands.data  # noqa: F401
    import roctune.commands.serve  # noqa: F401
    import roctune.commands.train  # noqa: F401
    import roctune.data.preview  # noqa: F401
    import roctune.export  # noqa: F401
    import roctune.generate  # noqa: F401
    import roctune.hub  # noqa: F401
    import roctune.methods  # noqa: F401
    import roctune.models  # noqa: F401
    import roctune.recipes.sft  # noqa: F401
    import roctune.serve.server  # noqa: F401 - fastapi, uvicorn
    import roctune.vision  # noqa: F401

    limit, memory = float(sys.argv[1]), float(sys.argv[2])
    results = {c["name"]: _run_one(c, limit, memory) for c in json.load(sys.stdin)}
    print(json.dumps(results))
