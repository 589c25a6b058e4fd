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


# ---------------------------------------------------------------------------------------- running the CLI
# Every case runs `roctune ...` in a process of its own, forked from one driver process that imported roctune,
# torch and transformers once (a fresh interpreter per case would spend ~5 s importing); a case that does not end
# within the timeout is killed and reported as a hang. (Forked before any torch op ran: no OpenMP pool to inherit.)
def run_cases(cases: list[dict], timeout: float) -> dict[str, dict]:
    """{name: {"rc", "err", "out", "seconds"}} for cases {"name", "argv", "cwd", "home"}; rc None: killed after
    `timeout` seconds."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, os.path.abspath(__file__), str(timeout)], input=json.dumps(cases),
                       capture_output=True, text=True, env=env, timeout=timeout * len(cases) + 300)
    if r.returncode:
        raise RuntimeError(f"the case driver failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.splitlines()[-1])


def _run_one(case: dict, timeout: float) -> dict:
    import os
    import signal
    import sys
    import time

    err, out = os.path.join(case["cwd"], ".stderr"), os.path.join(case["cwd"], ".stdout")
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: roctune's CLI in the case's folder and home, its output into two files
        try:
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

    import gguf  # noqa: F401 - imported once here, so that every forked case starts warm
    import jinja2  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import transformers.utils.chat_template_utils  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import roctune.cli  # noqa: F401
    import roctune.serve  # noqa: F401 - fastapi, uvicorn

    limit = float(sys.argv[1])
    results = {c["name"]: _run_one(c, limit) for c in json.load(sys.stdin)}
    print(json.dumps(results))
