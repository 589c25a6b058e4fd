"""llama.cpp's multimodal library (libmtmd, shipped with llama-cpp-py-sync beside libllama) in this process: it loads
an mmproj beside a language-model GGUF, cuts and encodes images the way `llama-server --mmproj` does, and evaluates a
prompt with images, so the export check runs the two files in the program that will serve them.

Why not the binding's own `MultimodalContext`: it wants its `Llama` object rather than roctune's llamacpp.Model,
and it refuses a prompt whose image llama.cpp cuts into several tiles (SmolVLM's: a grid of tiles plus the whole
image, each its own chunk), which is exactly the case to check. The C API used is small: mtmd_init_from_file,
mtmd_tokenize, mtmd_encode_chunk, mtmd_helper_eval_chunk_single.
"""
from __future__ import annotations

import os

import numpy as np

from roctune.errors import EnvironmentProblem, RoctuneError

_lib = None


def available() -> bool:
    """Whether llama.cpp's multimodal library is installed (it comes with the `gguf` extra)."""
    from roctune.export import llamacpp

    if not llamacpp.available():
        return False
    import importlib.util

    spec = importlib.util.find_spec(llamacpp.PACKAGE)
    folder = os.path.dirname(spec.origin) if spec and spec.origin else ""
    return os.path.isfile(os.path.join(folder, "libmtmd.so")) or os.path.isfile(os.path.join(folder, "mtmd.dll"))


def lib():
    """libmtmd, loaded once after libllama (from the same compatible copy when the system's GLIBC needed one)."""
    global _lib
    if _lib is not None:
        return _lib
    from roctune.export import llamacpp

    ffi, _ = llamacpp.binding()
    from llama_cpp_py_sync import _cffi_bindings as cb

    try:
        _lib = cb.get_mtmd_lib()
    except RuntimeError as e:
        if "GLIBC_2.38" not in str(e):
            raise EnvironmentProblem(f"llama.cpp's multimodal library does not load: {e}") from None
        folder = os.path.dirname(llamacpp._compat_copy(os.path.dirname(cb.__file__)))
        _lib = cb._mtmd_lib = ffi.dlopen(os.path.join(folder, "libmtmd.so"))
    _quiet(ffi, _lib)
    return _lib


def _quiet(ffi, mt) -> None:
    """libmtmd logs every tile it cuts and encodes to stderr: keep only its errors, through roctune's logger."""
    import logging

    log = logging.getLogger(__name__)

    @ffi.callback("void(enum ggml_log_level, const char *, void *)")
    def cb(level, text, _):
        if level == 4:  # GGML_LOG_LEVEL_ERROR
            log.warning("llama.cpp mtmd: %s", ffi.string(text).decode("utf-8", "replace").rstrip())

    mt.mtmd_log_set(cb, ffi.NULL)
    mt.mtmd_helper_log_set(cb, ffi.NULL)
    _quiet.keep = cb  # the callback must outlive this call


def marker() -> str:
    from roctune.export import llamacpp

    ffi, _ = llamacpp.binding()
    return ffi.string(lib().mtmd_default_marker()).decode("utf-8")


class Vision:
    """An mmproj loaded beside a llamacpp.Model, on the CPU."""

    def __init__(self, model, mmproj: str):
        from roctune.export import llamacpp

        self.model, self.ffi, self.mt = model, model.ffi, lib()
        params = self.mt.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.warmup = False
        params.n_threads = llamacpp.threads()
        self.ctx = self.mt.mtmd_init_from_file(mmproj.encode(), model.model, params)
        if self.ctx == self.ffi.NULL:
            raise RoctuneError(f"llama.cpp cannot load {os.path.basename(mmproj)} beside the language model; "
                               "not saved")

    def close(self) -> None:
        if self.ctx != self.ffi.NULL:
            self.mt.mtmd_free(self.ctx)
            self.ctx = self.ffi.NULL

    def run(self, text: str, images: list) -> dict:
        """Evaluate `text` (llama.cpp's marker where each image goes) with `images` (RGB PIL images, given as raw
        pixels so no decoder differs): the layout llama.cpp made (text ids, and for each image tile its number of
        tokens), each tile's embeddings, and the logits at every position of the last text chunk."""
        bitmaps = [self._bitmap(img) for img in images]
        chunks = self.mt.mtmd_input_chunks_init()
        try:
            encoded = text.encode("utf-8")
            buf = self.ffi.new("char[]", encoded)
            inp = self.ffi.new("mtmd_input_text *")
            inp.text, inp.text_len, inp.add_special, inp.parse_special = buf, len(encoded), False, True
            array = self.ffi.new("const mtmd_bitmap *[]", bitmaps)
            if self.mt.mtmd_tokenize(self.ctx, chunks, inp, array, len(bitmaps)) != 0:
                raise RoctuneError("llama.cpp could not place the images in the prompt; not saved")
            items = [self.mt.mtmd_input_chunks_get(chunks, i) for i in range(self.mt.mtmd_input_chunks_size(chunks))]
            layout, embeddings = self._layout(items)
            return {"layout": layout, "embeddings": embeddings, "logits": self._evaluate(items, layout)}
        finally:
            self.mt.mtmd_input_chunks_free(chunks)
            for b in bitmaps:
                self.mt.mtmd_bitmap_free(b)

    def _bitmap(self, img):
        rgb = np.asarray(img.convert("RGB"), dtype=np.uint8)
        data = self.ffi.new("unsigned char[]", rgb.tobytes())
        return self.mt.mtmd_bitmap_init(rgb.shape[1], rgb.shape[0], data)

    def _layout(self, items: list) -> tuple[list, list]:
        layout, embeddings = [], []
        n_embd = self.model.lib.llama_model_n_embd_inp(self.model.model)
        for chunk in items:
            if self.mt.mtmd_input_chunk_get_type(chunk) == 0:  # text
                n = self.ffi.new("size_t *")
                ids = self.mt.mtmd_input_chunk_get_tokens_text(chunk, n)
                layout.append(("text", [int(ids[i]) for i in range(n[0])]))
                continue
            k = int(self.mt.mtmd_input_chunk_get_n_tokens(chunk))
            if self.mt.mtmd_encode_chunk(self.ctx, chunk) != 0:
                raise RoctuneError("llama.cpp could not encode an image with the mmproj; not saved")
            out = self.mt.mtmd_get_output_embd(self.ctx)
            embeddings.append(np.frombuffer(self.ffi.buffer(out, 4 * k * n_embd), dtype=np.float32)
                              .reshape(k, n_embd).copy())
            layout.append(("image", k))
        return layout, embeddings

    def _evaluate(self, items: list, layout: list):
        """Every chunk but the last through llama.cpp's helper (images encoded and decoded in place), then the last
        text chunk as one batch with logits at each of its positions."""
        if not layout or layout[-1][0] != "text":
            raise RoctuneError("the check prompt must end with text after its images")
        lib, ffi = self.model.lib, self.ffi
        tail = layout[-1][1]
        total = sum(len(x) if kind == "text" else x for kind, x in layout)
        ctx = self.model._context(total, whole_batch=True)
        try:
            pos = ffi.new("llama_pos *")
            n_past = 0
            for chunk in items[:-1]:
                if self.mt.mtmd_helper_eval_chunk_single(self.ctx, ctx, chunk, n_past, 0, total, False, pos) != 0:
                    raise RoctuneError("llama.cpp could not evaluate the image prompt; not saved")
                n_past = pos[0]
            batch = lib.llama_batch_init(len(tail), 0, 1)
            try:
                for i, tok in enumerate(tail):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, n_past + i, 1
                    batch.seq_id[i][0], batch.logits[i] = 0, 1
                batch.n_tokens = len(tail)
                if lib.llama_decode(ctx, batch) != 0:
                    raise RoctuneError("llama.cpp could not evaluate the image prompt; not saved")
            finally:
                lib.llama_batch_free(batch)
            n_vocab = self.model.n_vocab
            return np.stack([np.frombuffer(ffi.buffer(lib.llama_get_logits_ith(ctx, i), 4 * n_vocab),
                                           dtype=np.float32).copy() for i in range(len(tail))])
        finally:
            lib.llama_free(ctx)
