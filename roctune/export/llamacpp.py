"""llama.cpp itself, in this process: its own quantizer for the K-quants and its own loader and forward pass to
check a written GGUF, through `llama-cpp-py-sync` (the `gguf` extra).

Why that package: it is a CFFI binding shipped with llama.cpp's prebuilt shared libraries (no compiler, installs
in seconds), tracking llama.cpp's releases; `llama-cpp-python` builds llama.cpp from source on install (about
half an hour on a small machine) and is still used when it is the one installed (`gguf_file.kquantize`).

The prebuilt libraries are linked against GLIBC 2.38; older systems (Debian 12 has 2.36) lack four C23 parsing
functions (`__isoc23_strtol` and friends), so the loader refuses them. Then roctune makes a compatible copy under
$ROCTUNE_HOME/llamacpp/: the libraries with that version need marked weak (ELF `.gnu.version_r`, VER_FLG_WEAK),
and a four-function shim built with the system's C compiler that forwards to the C library's own functions.
The installed package is never changed.
"""
from __future__ import annotations

import ctypes
import glob
import logging
import os
import shutil
import struct
import subprocess

from roctune.errors import EnvironmentProblem

log = logging.getLogger(__name__)

PACKAGE = "llama_cpp_py_sync"
MISSING_VERSION = b"GLIBC_2.38"
SHIM_C = r"""
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
long __isoc23_strtol(const char *s, char **e, int b) { return strtol(s, e, b); }
unsigned long __isoc23_strtoul(const char *s, char **e, int b) { return strtoul(s, e, b); }
unsigned long long __isoc23_strtoull(const char *s, char **e, int b) { return strtoull(s, e, b); }
int __isoc23_sscanf(const char *s, const char *f, ...) {
    va_list a; va_start(a, f); int r = vsscanf(s, f, a); va_end(a); return r;
}
"""
_binding = None


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec(PACKAGE) is not None


def binding():
    """(ffi, lib) of llama.cpp, loaded once; EnvironmentProblem with the fix when it cannot be."""
    global _binding
    if _binding is not None:
        return _binding
    if not available():
        raise EnvironmentProblem("llama.cpp's library is not installed: pip install 'roctune[gguf]' "
                                 "(llama-cpp-py-sync, prebuilt, no compiler)")
    from llama_cpp_py_sync import _cffi_bindings as cb

    try:
        lib = cb.get_lib()
    except RuntimeError as e:
        if "GLIBC_2.38" not in str(e):
            raise EnvironmentProblem(f"llama.cpp's library does not load: {e}") from None
        # the binding looks in its own folder first, so the compatible copy is opened here and handed to it
        lib = cb._lib = cb.ffi.dlopen(_compat_copy(os.path.dirname(cb.__file__)))
    lib.llama_backend_init()
    _quiet(cb.ffi, lib)
    _binding = (cb.ffi, lib)
    return _binding


def _quiet(ffi, lib) -> None:
    """llama.cpp logs every tensor it loads to stderr: keep only its errors, through our logger."""
    @ffi.callback("void(enum ggml_log_level, const char *, void *)")
    def cb(level, text, _):
        if level == 4:  # GGML_LOG_LEVEL_ERROR (5 is CONT, a continuation line)
            log.warning("llama.cpp: %s", ffi.string(text).decode("utf-8", "replace").rstrip())

    lib.llama_log_set(cb, ffi.NULL)
    _quiet.keep = cb  # the callback must outlive this call


# ------------------------------------------------------------------------------------ old-glibc compatibility
def _compat_copy(package_dir: str) -> str:
    """A copy of the package's libraries that loads on GLIBC < 2.38 (see the module docstring); returns the path
    of its libllama.so. Made once per installed version."""
    from roctune.models import roctune_home

    libs = sorted(glob.glob(os.path.join(package_dir, "lib*.so*")))
    stamp = "-".join(str(int(os.path.getmtime(p))) for p in libs[:1])
    target = os.path.join(roctune_home(), "llamacpp", f"compat-{stamp}")
    if not os.path.isfile(os.path.join(target, "libisoc23.so")):
        tmp = target + f".tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        for p in libs:
            shutil.copy2(p, tmp, follow_symlinks=True)
            weaken_version_need(os.path.join(tmp, os.path.basename(p)), MISSING_VERSION)
        _build_shim(os.path.join(tmp, "libisoc23.so"))
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
    ctypes.CDLL(os.path.join(target, "libisoc23.so"), mode=ctypes.RTLD_GLOBAL)
    return os.path.join(target, "libllama.so")


def _build_shim(path: str) -> None:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise EnvironmentProblem("llama.cpp's prebuilt library needs GLIBC 2.38 and this system has an older one; "
                                 "roctune bridges that with a 4-function shim it compiles: install a C compiler "
                                 "(apt install gcc), or export --quant q8_0, which needs no llama.cpp")
    src = path[:-3] + ".c"
    with open(src, "w") as f:
        f.write(SHIM_C)
    r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", path, src], capture_output=True, text=True)
    if r.returncode:
        raise EnvironmentProblem(f"building the GLIBC shim for llama.cpp failed: {r.stderr.strip()[:300]}")


def weaken_version_need(path: str, version: bytes) -> int:
    """Mark `version` weak in an ELF64 little-endian file's version needs; returns how many entries name it.

    Written here rather than with a tool (patchelf cannot do this one): the `.gnu.version_r` layout is fixed by
    the ELF gABI, Verneed {u16 version, u16 cnt, u32 file, u32 aux, u32 next} and Vernaux {u32 hash, u16 flags,
    u16 other, u32 name, u32 next}."""
    with open(path, "rb") as f:
        original = f.read()
    data = bytearray(original)
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise EnvironmentProblem(f"{path}: not a 64-bit little-endian ELF library")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    changed = 0
    for _, kind, _, _, offset, _, link, count, _, _ in sections:
        if kind != 0x6FFFFFFE:  # SHT_GNU_verneed
            continue
        strings, pos = sections[link][4], offset
        for _ in range(count):
            _, n_aux, _, aux, nxt = struct.unpack_from("<HHIII", data, pos)
            apos = pos + aux
            for _ in range(n_aux):
                _, flags, _, name, anext = struct.unpack_from("<IHHII", data, apos)
                if data[strings + name:data.index(0, strings + name)] == version:
                    struct.pack_into("<H", data, apos + 4, flags | 0x2)  # VER_FLG_WEAK
                    changed += 1
                apos += anext
            pos += nxt
    if bytes(data) != original:  # a new file renamed over the old one: a process that has the library loaded
        tmp = f"{path}.tmp-{os.getpid()}"  # keeps its mapping of the old file (rewriting it in place would
        with open(tmp, "wb") as f:         # crash that process)
            f.write(data)
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
    return changed


def threads() -> int:
    """OMP_NUM_THREADS when set (as torch honours it), else every CPU: ggml's threads spin while they wait, so
    more threads than the user allowed slow a shared machine down rather than speed it up."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return os.cpu_count() or 1


# ------------------------------------------------------------------------------------------------ quantizer
def quantize(src: str, dst: str, file_type: str, embedding_type: str | None = None,
             output_type: str | None = None) -> None:
    """llama.cpp's own `llama-quantize` on an f16 GGUF: its per-tensor mixture for q4_k_m/q5_k_m (attn_v and
    ffn_down kept at higher precision in part of the layers, and so on), not a re-implementation of it; the token
    embedding and output layer at the types given (its --token-embedding-type / --output-tensor-type)."""
    ffi, lib = binding()
    params = ffi.new("llama_model_quantize_params *", lib.llama_model_quantize_default_params())
    params.ftype = getattr(lib, "LLAMA_FTYPE_" + file_type)  # a quant's row in roctune.export.quants
    if embedding_type:
        params.token_embedding_type = getattr(lib, f"GGML_TYPE_{embedding_type.upper()}")
    if output_type:
        params.output_tensor_type = getattr(lib, f"GGML_TYPE_{output_type.upper()}")
    params.nthread = threads()
    rc = lib.llama_model_quantize(src.encode(), dst.encode(), params)
    if rc != 0:
        raise EnvironmentProblem(f"llama.cpp's quantizer failed on {src} (code {rc})")


# ------------------------------------------------------------------------------------------------ the model
class Model:
    """A GGUF loaded by llama.cpp on the CPU, run token by token from the token ids given (so the comparison
    with transformers does not depend on two tokenizers)."""

    def __init__(self, path: str, n_ctx: int = 0, lora: str | None = None, repack: bool = True,
                 vocab_only: bool = False):
        """`lora`: a LoRA GGUF applied (scale 1) to the model, as `llama-server --lora` does. `repack`: llama.cpp's
        default, quantized weights repacked for the processor's wide kernels (its "extra buffer types": AMX on
        Xeons that have it, interleaved blocks for AVX2/AVX-512); False keeps them as stored and runs the plain
        per-block dot products (`llama-cli --no-repack`), so both CPU paths can be checked on one machine.
        `vocab_only`: the tokenizer alone (no tensors needed), as `llama-tokenize` loads it."""
        from roctune.errors import RoctuneError

        self.ffi, self.lib = binding()
        params = self.lib.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = repack
        params.vocab_only = vocab_only
        self.model = self.lib.llama_model_load_from_file(path.encode(), params)
        if self.model == self.ffi.NULL:
            raise RoctuneError(f"llama.cpp cannot load {os.path.basename(path)}; not saved")
        self.adapter = self.ffi.NULL
        if lora:
            self.adapter = self.lib.llama_adapter_lora_init(self.model, lora.encode())
            if self.adapter == self.ffi.NULL:
                self.close()
                raise RoctuneError(f"llama.cpp cannot apply {os.path.basename(lora)} to {os.path.basename(path)}; "
                                   "not saved")
        self.vocab = self.lib.llama_model_get_vocab(self.model)
        self.n_vocab = self.lib.llama_vocab_n_tokens(self.vocab)
        self.n_ctx = n_ctx

    def close(self) -> None:
        if self.adapter != self.ffi.NULL:
            self.lib.llama_adapter_lora_free(self.adapter)
            self.adapter = self.ffi.NULL
        if self.model is not None:
            self.lib.llama_model_free(self.model)
            self.model = None

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's own split of `text` (special tokens parsed, nothing added), for comparison."""
        data = text.encode("utf-8")
        room = len(data) + 8
        out = self.ffi.new("llama_token[]", room)
        n = self.lib.llama_tokenize(self.vocab, data, len(data), out, room, False, True)
        if n < 0:
            raise EnvironmentProblem("llama.cpp could not tokenize a prompt")
        return list(out[0:n])

    def chat_template(self) -> str | None:
        text = self.lib.llama_model_chat_template(self.model, self.ffi.NULL)
        return None if text == self.ffi.NULL else self.ffi.string(text).decode("utf-8")

    def meta(self, key: str) -> str | None:
        """A metadata value of the file as llama.cpp reads it (as text), None when absent."""
        buf = self.ffi.new("char[]", 256)
        n = self.lib.llama_model_meta_val_str(self.model, key.encode(), buf, 256)
        return None if n < 0 else self.ffi.string(buf).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(self.lib.llama_vocab_is_eog(self.vocab, token))

    def run(self, ids: list[int], new_tokens: int):
        """(logits after the prompt as a numpy array, greedy continuation ids up to an end-of-generation token)."""
        import numpy as np

        # no larger than needed: llama.cpp picks Phi-3's long-context rope factors by the context size (above the
        # original context), transformers by the sequence length, so a short check must use a short context
        ctx = self._context(len(ids) + new_tokens + 1)
        try:
            first = self._decode(ctx, ids)
            out, logits = [], first
            for _ in range(new_tokens):
                tok = int(np.argmax(logits))
                if self.lib.llama_vocab_is_eog(self.vocab, tok):
                    break
                out.append(tok)
                logits = self._decode(ctx, [tok])
            return first, out
        finally:
            self.lib.llama_free(ctx)

    def logits_all(self, ids: list[int]):
        """The logits at every position of `ids` (one batch), as a [len(ids), vocab] numpy array."""
        import numpy as np

        ctx = self._context(len(ids), whole_batch=True)
        try:
            tokens = self.ffi.new("llama_token[]", ids)
            wanted = self.ffi.new("int8_t[]", [1] * len(ids))
            batch = self.lib.llama_batch_get_one(tokens, len(ids))
            batch.logits = wanted  # an output at every position, not only the last
            if self.lib.llama_decode(ctx, batch) != 0:
                raise EnvironmentProblem("llama.cpp could not evaluate a conversation")
            out = np.empty((len(ids), self.n_vocab), dtype=np.float32)
            for i in range(len(ids)):
                out[i] = np.frombuffer(self.ffi.buffer(self.lib.llama_get_logits_ith(ctx, i), 4 * self.n_vocab),
                                       dtype=np.float32)
            return out
        finally:
            self.lib.llama_free(ctx)

    def _context(self, n_tokens: int, whole_batch: bool = False):
        """A context for `n_tokens` with the LoRA adapter set (when there is one); `whole_batch`: the tokens go
        through as one micro-batch, as outputs at every position need."""
        params = self.lib.llama_context_default_params()
        params.n_ctx = params.n_batch = max(self.n_ctx, n_tokens)
        if whole_batch:
            params.n_ubatch = params.n_batch
        params.n_threads = params.n_threads_batch = threads()
        ctx = self.lib.llama_init_from_model(self.model, params)
        if self.adapter != self.ffi.NULL:
            adapters = self.ffi.new("struct llama_adapter_lora *[1]", [self.adapter])
            scale = self.ffi.new("float[1]", [1.0])
            if self.lib.llama_set_adapters_lora(ctx, adapters, 1, scale) != 0:
                self.lib.llama_free(ctx)
                raise EnvironmentProblem("llama.cpp could not set the LoRA adapter")
        return ctx

    def _decode(self, ctx, ids: list[int]):
        import numpy as np

        tokens = self.ffi.new("llama_token[]", ids)
        if self.lib.llama_decode(ctx, self.lib.llama_batch_get_one(tokens, len(ids))) != 0:
            raise EnvironmentProblem("llama.cpp could not evaluate the prompt")
        ptr = self.lib.llama_get_logits_ith(ctx, -1)
        return np.frombuffer(self.ffi.buffer(ptr, 4 * self.n_vocab), dtype=np.float32).copy()
