"""The matrices a LoRA fine-tune changed, kept at q8_0 inside a llama.cpp K-quant of a model that came from a GGUF.

Why (issue 41, Gemma 3 270M from its Q4_K_M file, LoRA on q/k/v/o for 12 steps): the quantizer re-rounds every
matrix of the merged model. The ones the adapter did not touch are the original file's own values, already on the
same grid, and come back almost exactly (relative error 0.01-0.04%; the untrained base re-quantized to q4_k_m is KL
0.004 from itself). The ones LoRA changed moved by 1.4-1.7% of their norm, and their fresh 4-5 bit rounding
(Q4_K, Q5_0) is as large: 1.1-1.9%. The quantized matrices then sit no nearer to the fine-tune than to the base, and
the file lost what training taught (mean KL 2.5 to the merged model, the same top token at 61% of positions; the
divergence sits where the fine-tune differs from the base: the answer's end, <end_of_turn>). At q8_0 their rounding
is a tenth of the change. Here they are few (q/k/v/o: 11% of the parameters), so the file grows little.

How: llama.cpp's quantizer makes the file (its per-tensor mixture and fallbacks); this module then copies that file
with the changed matrices taken from the f16 GGUF and written at q8_0 (gguf's own q8_0 encoder; f16 where a row does
not split into 32-value blocks). llama.cpp's per-tensor override (`tensor_types`) is a C++ vector, out of reach of
the C API the bindings use, hence the copy.
"""
from __future__ import annotations

import os

from roctune.errors import ConfigError
from roctune.export.lora_gguf import LORA_KEY


def changed_matrices(adapter: str, family, n_layers: int) -> list[str]:
    """GGUF names of the matrices the adapter's LoRA pairs change (e.g. blk.3.attn_q.weight), from the adapter
    file's keys (no weights read)."""
    from safetensors import safe_open

    from roctune import rundir
    from roctune.export.gguf_file import tensor_name_map

    names = tensor_name_map(family, n_layers)
    with safe_open(os.path.join(adapter, rundir.ADAPTER_WEIGHTS), framework="np") as st:
        modules = sorted({m[1] for k in st.keys() if (m := LORA_KEY.match(k))})
    found = [names.get_name(m + ".weight", try_suffixes=(".weight",)) for m in modules]
    return sorted(n for n in found if n)


def keep_at_q8_0(quantized: str, f16: str, dst: str, names: list[str]) -> int:
    """Write `dst`: the llama.cpp quant `quantized` (metadata and tensors as they are) with the tensors `names`
    taken from the f16 GGUF `f16` at q8_0 instead. Returns how many were replaced."""
    import gguf
    import numpy as np

    T = gguf.GGMLQuantizationType
    reader, wanted = gguf.GGUFReader(quantized), set(names)
    source = {t.name: t for t in gguf.GGUFReader(f16).tensors if t.name in wanted}
    if set(source) != wanted:
        raise ConfigError(f"{f16}: no tensor {sorted(wanted - set(source))[0]} to keep at q8_0")
    w = gguf.GGUFWriter(dst, reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        w.add_key_value(field.name, field.contents(), kind,
                        sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        if t.name not in wanted:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
            continue
        values = np.asarray(source[t.name].data, dtype=np.float32)
        if values.shape[-1] % gguf.GGML_QUANT_SIZES[T.Q8_0][0]:
            w.add_tensor(t.name, values.astype(np.float16), raw_dtype=T.F16)
        else:
            w.add_tensor(t.name, gguf.quants.quantize(values, T.Q8_0), raw_dtype=T.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return len(wanted)
