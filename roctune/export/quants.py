"""The quant types of an exported GGUF, one row each: who writes it, its file type, and how far the GGUF may drift
from the merged model before export refuses it. The writers (gguf_file.py, llamacpp.py), the check after writing
(verify.py), `roctune export`'s --quant and the web UI's quant list all read this table; nothing else lists them.

Two writers: roctune itself (gguf_file.py, with the `gguf` package's encoder: one GGML type for every matrix,
`tensor_type`) and llama.cpp's own quantizer (from an f16 GGUF written here; its per-tensor mixture for the
K-quants), through llama-cpp-py-sync (prebuilt) or llama-cpp-python, whichever is installed.

The KL limits (mean KL divergence in nats per position, against the fp32 merged model). The reference: llama.cpp's
published LLaMA-3-8B figures (tools/perplexity README, from its PR 6936): q8_0 about 0.001, q6_K about 0.005,
q4_K_M about 0.03 mean KLD, with the top token the same at about 99%, 98% and 94% of positions. Small models lose
more to the same quant: the bundled SmolLM2-135M after make demo's identity fine-tune measured f16 0.00001, q8_0
0.011, q6_k 0.025, q4_k_m 0.10-0.11 in llama.cpp on the CPU (README, "How close is the GGUF"). Of q8_0's 0.011,
0.0033 is the weights' rounding (the same file read back by transformers); the rest is llama.cpp's CPU kernels
rounding the activations to 8 bits before each q8_0 product: the runtime's, not the file's. The limits leave 4-5x
room over those figures for other kernels and models, and still refuse a broken file (a Q/K permutation left out, a
lost tensor: KL of several nats). Gemma 3 270M after a 12-step identity fine-tune measured q8_0 0.045: the
runtime's part again, as its original Q4_K_M file with the LoRA GGUF (the very weights the merged model was made
from) measured 0.056 (scripts/lora_on_original.py); q8_0's limit is 0.1. The 2-6 bit K-quants get 0.5: it catches
a broken file, not small drift."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.errors import ConfigError, EnvironmentProblem

ROCTUNE = "roctune"  # written here, one type for every matrix (gguf_file.py)
LLAMA_CPP = "llama.cpp"  # llama.cpp's quantizer, from an f16 GGUF written here (llamacpp.py)


@dataclass(frozen=True)
class Quant:
    name: str  # --quant NAME
    writer: str  # ROCTUNE or LLAMA_CPP
    file_type: str  # the file's type: gguf.LlamaFileType's and llama.cpp's LLAMA_FTYPE_ name (MOSTLY_Q8_0)
    kl_limit: float  # the largest mean KL divergence from the merged model the check accepts
    tensor_type: str | None = None  # the GGML type roctune writes every matrix in (gguf.GGMLQuantizationType)


def _kquant(name: str) -> Quant:
    return Quant(name, LLAMA_CPP, "MOSTLY_" + name.upper(), 0.5)


ROWS = (
    Quant("f16", ROCTUNE, "MOSTLY_F16", 0.01, "F16"),
    Quant("bf16", ROCTUNE, "MOSTLY_BF16", 0.05, "BF16"),
    Quant("q8_0", ROCTUNE, "MOSTLY_Q8_0", 0.1, "Q8_0"),
    *map(_kquant, ("q4_k_m", "q4_k_s", "q5_k_m", "q5_k_s", "q6_k", "q3_k_m", "q2_k", "q4_0", "q5_0")),
)
QUANTS = {q.name: q for q in ROWS}
NAMES = tuple(QUANTS)
DEFAULT = "q8_0"  # --quant's default: written by roctune, no quantizer needed, close to the merged model
FINEST_KQUANT = "q6_k"  # what to try when a coarser K-quant drifts too far
# Types llama.cpp's quantizer can give the token embedding and the output layer apart from the rest of a K-quant
# (llama_model_quantize_params.token_embedding_type / output_tensor_type, llama-quantize's --token-embedding-type
# and --output-tensor-type); "auto" picks by the vocabulary's share of the weights (gguf_file.tensor_plan).
TENSOR_TYPES = ("auto", DEFAULT, FINEST_KQUANT, "f16", "default")


def written_by(writer: str) -> tuple[str, ...]:
    return tuple(q.name for q in ROWS if q.writer == writer)


def help_text() -> str:
    """--quant's help, from the rows."""
    return (f"{', '.join(written_by(ROCTUNE))} (written by roctune; default {DEFAULT}); "
            f"{', '.join(written_by(LLAMA_CPP)[:3])}, ... (llama.cpp's quantizer: pip install 'roctune[gguf]')")


def quantizer_problem() -> str | None:
    """Why llama.cpp's quantizer cannot run here (neither binding installed), else None."""
    import importlib.util

    from roctune.export import llamacpp

    if not llamacpp.available() and importlib.util.find_spec("llama_cpp") is None:
        return ("K-quants need llama.cpp's quantizer: pip install 'roctune[gguf]' (llama-cpp-py-sync, prebuilt, no "
                f"compiler), or export --quant f16 and run llama.cpp's `llama-quantize` on it; {DEFAULT} needs "
                "neither")
    return None


def check(quant: str) -> Quant:
    """The row of --quant; an empty or unknown type (any value: the web UI passes what a request sent), or one of
    llama.cpp's quantizer without it installed: one line."""
    row = QUANTS.get(quant) if isinstance(quant, str) else None
    if row is None:
        empty = quant is None or (isinstance(quant, str) and not quant.strip())  # `--quant "$Q"`, Q unset
        what = "--quant is empty" if empty else f"--quant {quant}: unknown"
        raise ConfigError(f"{what}; choose one of {', '.join(written_by(ROCTUNE))} (written by "
                          f"roctune) or {', '.join(written_by(LLAMA_CPP))} (llama.cpp's quantizer: pip install "
                          "'roctune[gguf]')", key="choice", field="quant", choices=", ".join(NAMES),
                          got=repr(quant))  # the web UI says it in its language at the quant box
    if row.writer == LLAMA_CPP and quantizer_problem():
        raise EnvironmentProblem(quantizer_problem())
    return row


def check_tensor_types(quant: str, embedding_type: str, output_type: str) -> None:
    """--embedding-type/--output-type: a known type, and only for a quant made by llama.cpp's quantizer."""
    for flag, value in (("--embedding-type", embedding_type), ("--output-type", output_type)):
        if value not in TENSOR_TYPES:
            raise ConfigError(f"{flag} {value}: unknown; choose one of {', '.join(TENSOR_TYPES)}")
        if value not in ("auto", "default") and QUANTS[quant].writer != LLAMA_CPP:
            raise ConfigError(f"{flag} {value}: only for a quant made by llama.cpp's quantizer "
                              f"({', '.join(written_by(LLAMA_CPP))}); --quant {quant} is written by roctune with one "
                              "type for every matrix")


def next_options(quant: str, plan: dict) -> str:
    """What to try when a quant fails the fidelity check, most specific first."""
    tries = []
    if QUANTS[quant].writer == LLAMA_CPP:
        if plan.get("embedding_type") not in (DEFAULT, "f16"):
            tries.append(f"--quant {quant} --embedding-type {DEFAULT} --output-type {DEFAULT}")
        if quant != FINEST_KQUANT:
            tries.append(f"--quant {FINEST_KQUANT}")
        tries.append(f"--quant {DEFAULT}")
    tries.append("--format lora-gguf, applied by llama.cpp to the original base GGUF (an upstream quant)")
    return "try " + ", or ".join(tries)
