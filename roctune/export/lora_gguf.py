"""A LoRA adapter alone as a GGUF file, for `llama-server -m BASE.gguf --lora ADAPTER.gguf` and Ollama's
`ADAPTER`: one base GGUF then serves many fine-tunes.

The layout is llama.cpp's LoRA GGUF: `general.type` = adapter, `adapter.type` = lora, `adapter.lora.alpha`, the
base's architecture, and for each adapted matrix its base tensor's GGUF name with `.lora_a` (A, [rank, in]) and
`.lora_b` (B, [out, rank]). llama.cpp adds (alpha / rank) * B A to the base matrix, rank being read from each
tensor's shape; PEFT's own scale (alpha / r, alpha / sqrt(r) with rsLoRA, per-module rank and alpha patterns) is
folded into B so that llama.cpp's formula gives exactly PEFT's. Where the base's Q/K rows are permuted for
llama.cpp's rope (gguf_specs), B's rows are permuted the same way (A acts on the input side, which is not).

Written here with `gguf.GGUFWriter` for the reasons gguf_file.py gives; llama.cpp's convert_lora_to_gguf.py was
read for the facts. What llama.cpp cannot load is refused with one line before anything is written: modules
saved whole (`modules_to_save`: a trained embedding or output layer is a full matrix, not a LoRA pair), LoRA on
the embedding or output layer, DoRA.

Trained rows of single tokens (`trainable_token_indices`: the turn markers of a template roctune chose for a base
model, methods.turn_token_rows; without them the answers do not stop, measured on Gemma 3 270M: mean KL 0.525 to
the merged model) are written as exact rank-k pairs (k tokens) when the embedding and output layer are two
matrices: llama.cpp adds a `token_embd` LoRA to the looked-up rows (llama-graph build_inp_embd: B times the rows of
A picked by token id, so A is [n_vocab, k] one-hot and B the k row deltas) and an `output` LoRA the usual way.
With tied embeddings (Gemma, SmolLM2) there is one tensor, and llama.cpp hands its LoRA (found by name) to the
output matmul too, whose shapes do not fit: it aborts (GGML_ASSERT ggml_can_mul_mat, measured with the llama.cpp
of llama-cpp-py-sync b11739); such an adapter is refused (`token_rows_refusal`). A base model with a tied embedding
gets a template without markers by default (data/templates.py PLAIN_TURNS), so only `--template NAME` leads here.
"""
from __future__ import annotations

import math
import os
import re

import numpy as np

from roctune import rundir
from roctune.data.templates import PLAIN_TURNS
from roctune.errors import ConfigError

LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.default)?\.weight$")
TOKEN_KEY = re.compile(r"^(?:base_model\.model\.)?(.+)\.token_adapter\.trainable_tokens_delta(?:\.default)?$")


# ------------------------------------------------------------------------------------------- the format unit
def check_options(quant: str, embedding_type: str, output_type: str) -> None:
    from roctune.export import quants

    quants.check(quant)
    quants.check_tensor_types("f16", embedding_type, output_type)


def check_run(run: rundir.Run) -> dict:
    """The adapter's settings when llama.cpp can load it as a LoRA GGUF; one clear ConfigError otherwise."""
    adapter = run.path
    if not rundir.has_adapter(adapter):
        raise ConfigError(f"--adapter {adapter}: --format lora-gguf needs a LoRA run (adapter_config.json); a "
                          "full or freeze run has no adapter - export it with --format gguf")
    cfg = run.adapter  # the writer computes with its fields: checked with the weights (rundir.check_adapter)
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA" or cfg.get("use_dora"):
        raise ConfigError(f"--adapter {adapter}: --format lora-gguf writes plain LoRA adapters; this one is "
                          f"{'DoRA' if cfg.get('use_dora') else cfg.get('peft_type')} - export with --format gguf")
    if cfg.get("modules_to_save"):
        raise ConfigError(f"--adapter {adapter}: it trains {', '.join(cfg['modules_to_save'])} whole "
                          "(modules_to_save), which a llama.cpp LoRA file cannot carry - export the merged model "
                          "with --format gguf")
    targets = cfg.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else targets
    if any(re.search(r"embed|lm_head|wte|output", t) for t in targets):
        raise ConfigError(f"--adapter {adapter}: LoRA on the embedding or output layer ({', '.join(targets)}) is "
                          "not written as a LoRA GGUF - export the merged model with --format gguf")
    return cfg


def token_rows(cfg: dict) -> list[int]:
    """The token ids whose embedding/output rows the adapter trains (peft's trainable_token_indices)."""
    rows = cfg.get("trainable_token_indices") or []
    lists = rows.values() if isinstance(rows, dict) else [rows]
    return sorted({i for ids in lists if isinstance(ids, list) for i in ids if isinstance(i, int)})


def token_rows_refusal(cfg: dict, tokenizer, adapter: str) -> str | None:
    """Why a LoRA GGUF cannot hold this adapter's trained token rows (one line), else None: rows of tied
    embeddings (peft's plain list of ids; untied ones name both layers)."""
    ids = token_rows(cfg)
    if not ids or isinstance(cfg.get("trainable_token_indices"), dict):
        return None
    names = ", ".join(tokenizer.convert_ids_to_tokens(ids))
    return (f"--adapter {adapter}: it trains the rows of {names} in the embedding that this model shares with its "
            "output layer (the markers of roctune's chat template, which a base model may never have learned); "
            "llama.cpp applies an embedding LoRA to a shared output layer with the wrong shapes and aborts, and "
            "without those rows the answers would not stop - export the merged model with --format gguf, or train "
            f"again with --template {PLAIN_TURNS} (plain-text turns ending with EOS: no marker rows)")


def scales(cfg: dict, modules: list[str]) -> dict[str, float]:
    """PEFT's scale of each adapted module (alpha / r, or alpha / sqrt(r) with rsLoRA; patterns by suffix)."""
    out = {}
    for m in modules:
        r = _pattern(cfg.get("rank_pattern") or {}, m, cfg.get("r", 8))
        alpha = _pattern(cfg.get("alpha_pattern") or {}, m, cfg.get("lora_alpha", 8))
        out[m] = alpha / (math.sqrt(r) if cfg.get("use_rslora") else r)
    return out


def _pattern(patterns: dict, module: str, default):
    for key, value in patterns.items():
        if re.search(rf"(^|\.){re.escape(key)}$", module) or re.fullmatch(key, module):
            return value
    return default


def write_lora_gguf(run: rundir.Run, base_dir: str, path: str, name: str, family) -> dict:
    """Write the adapter of `run` (trained on the model in `base_dir`) to `path`."""
    import gguf
    from safetensors.numpy import load_file

    from roctune.export.gguf_file import _permute, read_config, tensor_name_map

    adapter, cfg, base = run.path, check_run(run), read_config(base_dir)
    tensors = load_file(os.path.join(adapter, rundir.ADAPTER_WEIGHTS))
    rows = {m[1]: tensors.pop(k) for k in list(tensors) if (m := TOKEN_KEY.match(k))}
    pairs = _pairs(tensors, adapter)
    alpha = float(cfg.get("lora_alpha", 8))
    names = tensor_name_map(family, base["num_hidden_layers"])
    w = gguf.GGUFWriter(path, family.gguf_arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_name(name)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    heads = base["num_attention_heads"]
    for module, scale in scales(cfg, sorted(pairs)).items():
        a, b = pairs[module]
        new = names.get_name(module + ".weight", try_suffixes=(".weight",))
        if new is None:
            raise ConfigError(f"{adapter}: adapted module {module} has no GGUF name for {family.gguf_arch}")
        b = b * (scale * a.shape[0] / alpha)  # llama.cpp applies alpha / rank
        if family.gguf_permute_qk and module.endswith(("q_proj", "k_proj")):
            b = _permute(b, heads if module.endswith("q_proj") else base.get("num_key_value_heads") or heads)
        w.add_tensor(new + ".lora_a", np.ascontiguousarray(a, dtype=np.float32))
        w.add_tensor(new + ".lora_b", np.ascontiguousarray(b, dtype=np.float32))
    for new, a, b in _row_pairs(rows, token_rows(cfg), base_dir, names, alpha, adapter):
        w.add_tensor(new + ".lora_a", a)
        w.add_tensor(new + ".lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"architecture": family.gguf_arch, "family": family.name, "lora_modules": len(pairs), "alpha": alpha,
            "token_rows": len(token_rows(cfg)) if rows else 0, "bytes": os.path.getsize(path)}


def _base_rows(base_dir: str, key: str, ids: list[int]):
    """The rows `ids` of the base model's tensor `key` (from its safetensors, nothing else loaded)."""
    from safetensors import safe_open

    for f in sorted(n for n in os.listdir(base_dir) if n.endswith(".safetensors")):
        with safe_open(os.path.join(base_dir, f), framework="np") as st:
            if key in st.keys():
                return np.stack([st.get_slice(key)[i] for i in ids]).astype(np.float32)
    raise ConfigError(f"{base_dir}: no {key} in the base model's weights; export the merged model with --format gguf")


def _row_pairs(rows: dict, ids: list[int], base_dir: str, names, alpha: float, adapter: str):
    """(GGUF name, A, B) per layer with trained token rows (untied embedding and output layer): the row deltas
    (trained rows minus the base's) as an exact rank-k pair, scaled so that llama.cpp's alpha / k gives 1. The
    embedding in llama.cpp's flipped layout for its get_rows (A [n_vocab, k] one-hot, B [n_embd, k]); the output
    layer as usual (A [k, n_embd] the deltas, B [n_vocab, k] one-hot)."""
    k = len(ids)
    for module, trained in sorted(rows.items()):
        new = names.get_name(module + ".weight", try_suffixes=(".weight",))
        if new not in ("token_embd.weight", "output.weight") or trained.shape[0] != k:
            raise ConfigError(f"{adapter}: trained token rows of {module} cannot be written as a LoRA GGUF; export "
                              "the merged model with --format gguf")
        delta = trained.astype(np.float32) - _base_rows(base_dir, module + ".weight", ids)
        one_hot = np.zeros((_n_vocab(base_dir), k), dtype=np.float32)
        one_hot[ids, np.arange(k)] = k / alpha
        if new == "token_embd.weight":
            yield new, one_hot, np.ascontiguousarray(delta.T)
        else:
            yield new, np.ascontiguousarray(delta), one_hot


def _n_vocab(base_dir: str) -> int:
    from roctune.export.gguf_file import read_config

    return int(read_config(base_dir)["vocab_size"])


def _pairs(tensors: dict, adapter: str) -> dict[str, tuple]:
    """{module path: (A, B)} from PEFT's adapter file."""
    pairs: dict[str, dict] = {}
    for key, value in tensors.items():
        m = LORA_KEY.match(key)
        if m is None:
            raise ConfigError(f"{adapter}: adapter tensor {key} is not a LoRA A/B matrix; export with --format gguf")
        pairs.setdefault(m[1], {})[m[2]] = value.astype(np.float32)
    broken = [k for k, v in pairs.items() if set(v) != {"A", "B"}]
    if broken or not pairs:
        raise ConfigError(f"{adapter}: adapter_model.safetensors has no complete LoRA pairs ({broken[:1]})")
    return {k: (v["A"], v["B"]) for k, v in pairs.items()}


# ------------------------------------------------------------------------------------ written and checked
def check(job, log) -> None:
    """Trained rows of a tied embedding cannot go into a LoRA GGUF (token_rows_refusal)."""
    if job.token_rows:
        raise ConfigError(job.token_rows)
    job.inspect()
    job.file = f"{job.name}-lora.gguf"


def write(job, tmp: str, log) -> dict:
    """The LoRA GGUF, a Modelfile with ADAPTER (FROM the base's own GGUF when the base came from one) and DEPLOY.md."""
    from roctune.export import deploy
    from roctune.models import gguf_source

    report = write_lora_gguf(job.run, job.base, os.path.join(tmp, job.file), job.name, job.family)
    text, report["modelfile_template"] = deploy.best_modelfile(job.file, job.tokenizer, log)
    source = gguf_source(job.base)  # the base was converted from this GGUF file: the adapter goes back onto it
    if source:
        report["base_gguf"] = source
    rundir.atomic_write_text(os.path.join(tmp, "Modelfile"), deploy.adapter_modelfile(text, job.file, job.base, source))
    rundir.atomic_write_text(os.path.join(tmp, "DEPLOY.md"), deploy.lora_deploy_md(
        job.file, job.name, job.run.base_model or job.base, source))
    return report


def verify(job, tmp: str, log) -> dict:
    """The adapter applied by llama.cpp to an f16 GGUF of the base (written for the check, not kept) against the
    merged model; skipped, said in one line, without llama.cpp. Returns the report's entries."""
    import shutil

    from roctune.export import gguf_file, llamacpp
    from roctune.export import verify as check
    from roctune.merge import merge

    if not (job.verify and llamacpp.available()):
        log("fidelity check skipped: " + ("--no-verify" if not job.verify else
                                          "a LoRA GGUF is checked in llama.cpp: pip install 'roctune[gguf]'"))
        return {}
    merged, base_gguf = os.path.join(tmp, ".merged"), os.path.join(tmp, ".base-f16.gguf")
    merge_diff = merge(job.run, merged, dtype="fp32", log=log)["max_logit_diff"]
    gguf_file.write_gguf(job.base, base_gguf, "f16", job.name, job.tokenizer, log)
    report = check.verify(merged, tmp, os.path.basename(base_gguf), "f16", check.check_conversations(job.run), log,
                          lora=os.path.join(tmp, job.file), tokenizer=job.tokenizer)
    log(check.summary(report) + " (the adapter applied to an f16 GGUF of the base)")
    shutil.rmtree(merged)
    os.unlink(base_gguf)
    return {"merge_max_logit_diff": merge_diff, "check": report}


def done(job, report: dict, log) -> None:
    log(f"exported the adapter as {job.file} ({report['bytes'] / 2**20:.1f} MiB), Modelfile and DEPLOY.md to "
        f"{job.output} in {report['seconds']:.0f} s; it needs the base model's GGUF beside it")
