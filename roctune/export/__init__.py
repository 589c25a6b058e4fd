"""`roctune export`: a trained run as one GGUF file for llama.cpp and Ollama, with an Ollama Modelfile and a
DEPLOY.md (llama.cpp, Ollama, vLLM, SGLang), checked after writing.

Steps: check everything that can be checked before a model loads (quant type, output folder, architecture,
tokenizer, what a LoRA GGUF cannot carry); merge the adapter with `roctune.merge.merge` (its own logits check)
into a scratch folder; write the GGUF (gguf_file.py, one layout spec per family in gguf_specs.py; K-quants by
llama.cpp's quantizer, llamacpp.py) or, with --format lora-gguf, the adapter alone (lora_gguf.py); write the
Modelfile and DEPLOY.md (deploy.py); run the file in llama.cpp (or read it back) and compare it with the merged
model (verify.py). All of it happens in a temporary folder beside --output that replaces --output only
when every step passed, so a failed check leaves nothing behind. The folder gets a `roctune_export.json`
marker (with the figures of the check): --overwrite replaces only such a folder."""
from __future__ import annotations

import json
import os
import re
import shutil
import time

from roctune import rundir
from roctune.errors import ConfigError

MARKER = "roctune_export.json"
FORMATS = ("gguf", "lora-gguf")


def export(adapter: str, output: str, quant: str = "q8_0", name: str | None = None, fmt: str = "gguf",
           verify: bool = True, overwrite: bool = False, log=print, embedding_type: str = "auto",
           output_type: str = "auto") -> dict:
    """Export the run `adapter` into the folder `output`; returns the report also saved as roctune_export.json.
    `embedding_type`/`output_type`: the token embedding's and output layer's type in a llama.cpp quant
    (gguf_file.TENSOR_TYPES; "auto" by the vocabulary's share of the weights)."""
    from roctune.export import deploy, gguf_file
    from roctune.export import verify as check
    from roctune.merge import check_output
    from roctune.models import gguf_source, load_tokenizer, resolve_model

    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt}: unknown; choose one of {', '.join(FORMATS)}")
    gguf_file.check_quant(quant)
    gguf_file.check_tensor_types(quant if fmt == "gguf" else "f16", embedding_type, output_type)
    rundir.refuse_scorer(rundir.open(adapter), command="export")
    check_output(adapter, output, overwrite, marker=MARKER, writer="roctune export")
    if fmt == "lora-gguf":
        from roctune.export.lora_gguf import check_adapter

        check_adapter(adapter)
    full = rundir.is_full_model_dir(adapter)
    base = adapter if full else resolve_model(rundir.read_run(adapter).get("base_model"))
    tok_src = adapter if os.path.isfile(os.path.join(adapter, "tokenizer_config.json")) else base
    tok = load_tokenizer(tok_src, template=rundir.template_name(adapter))  # the GGUF's template: the run's
    from roctune.export.lora_gguf import token_rows_refusal

    rows = token_rows_refusal(rundir.adapter_settings(adapter), tok, adapter) if rundir.has_adapter(adapter) else None
    if fmt == "lora-gguf" and rows:
        raise ConfigError(rows)
    family, _, pre = gguf_file.check_model(adapter if full else base, tok, (base,))  # before any weights load
    _check_checker(fmt, verify, pre)
    name = ollama_name(name or os.path.basename(os.path.abspath(adapter)))
    gguf_name = f"{name}-lora.gguf" if fmt == "lora-gguf" else f"{name}-{quant}.gguf"
    started, report = time.monotonic(), {"adapter": os.path.abspath(adapter), "format": fmt, "gguf": gguf_name}
    if fmt == "lora-gguf":
        rundir.write_dir_atomically(output, lambda tmp: _fill_lora(adapter, base, tmp, name, tok, family, verify,
                                                                   report, started, log))
        log(f"exported the adapter as {gguf_name} ({report['bytes'] / 2**20:.1f} MiB), Modelfile and DEPLOY.md to "
            f"{output} in {report['seconds']:.0f} s; it needs the base model's GGUF beside it")
        return report
    report["quant"] = quant
    source = None if full else gguf_source(base)
    plan = gguf_file.tensor_plan(adapter if full else base, quant, embedding_type, output_type)
    if plan:
        report["tensor_plan"] = plan
        log(f"token embedding {plan['embedding_type']}, output layer {plan['output_type']} ({plan['reason']})")
    if plan and source:
        _keep_changed(plan, adapter, base, family, log)

    def fill(tmp: str) -> None:
        merged = adapter if full else os.path.join(tmp, ".merged")
        if not full:
            report["merge_max_logit_diff"] = _merge(adapter, merged, log)
        report.update(_write(merged, tmp, gguf_name, quant, name, tok, log, (base,), plan))
        system = rundir.read_run(adapter)["config"].get("system") if rundir.is_run_dir(adapter) else None
        text, report["modelfile_template"] = _modelfile(gguf_name, tok, system, log)
        rundir.atomic_write_text(os.path.join(tmp, "Modelfile"), text)
        rank = None if full else rundir.adapter_settings(adapter).get("r")
        rundir.atomic_write_text(os.path.join(tmp, "DEPLOY.md"), deploy.deploy_md(
            output, gguf_name, name, adapter, rundir.base_model(adapter) or base, rank, full))
        if verify:
            report["check"] = check.verify(merged, tmp, gguf_name, quant, check.check_conversations(adapter), log,
                                           tokenizer=tok, hint=gguf_file.next_options(quant, plan))
            log(check.summary(report["check"]))
        else:
            log("fidelity check skipped (--no-verify)")
        if not full:
            shutil.rmtree(merged)
        report["seconds"] = round(time.monotonic() - started, 1)
        rundir.atomic_write_text(os.path.join(tmp, MARKER), json.dumps(report, indent=1, ensure_ascii=False))

    rundir.write_dir_atomically(output, fill)
    log(f"exported {gguf_name} ({report['bytes'] / 2**20:.1f} MiB), Modelfile and DEPLOY.md to {output} "
        f"in {report['seconds']:.0f} s")
    if source and not rows:  # an adapter with trained token rows has no LoRA GGUF
        log(f"the base model came from {source}: `roctune export --adapter {adapter} --format lora-gguf` puts this "
            "fine-tune onto that same file (llama-server -m FILE --lora ...), keeping its own quantization")
    return report


def _keep_changed(plan: dict, adapter: str, base: str, family, log) -> None:
    """A base converted from a GGUF: the matrices LoRA changed stay at q8_0 (requant.py says why)."""
    from roctune.export import gguf_file, requant

    names = requant.changed_matrices(adapter, family, gguf_file.read_config(base)["num_hidden_layers"])
    if names:
        plan["q8_0_tensors"] = names
        log(f"the {len(names)} matrices the adapter changed stay at q8_0: the others are the base GGUF's own "
            "values and re-quantize almost exactly, while 4-6 bit rounding of the changed ones is as large as the "
            "fine-tune's change")


def _fill_lora(adapter: str, base: str, tmp: str, name: str, tok, family, verify: bool, report: dict,
               started: float, log) -> None:
    """--format lora-gguf: the adapter alone; checked by applying it in llama.cpp to an f16 GGUF of the base
    (written for the check, not kept) against the merged model."""
    from roctune.export import deploy, gguf_file, llamacpp
    from roctune.export import verify as check
    from roctune.export.lora_gguf import write_lora_gguf

    from roctune.models import gguf_source

    path = os.path.join(tmp, report["gguf"])
    report.update(write_lora_gguf(adapter, base, path, name, family))
    system = rundir.read_run(adapter)["config"].get("system") if rundir.is_run_dir(adapter) else None
    text, report["modelfile_template"] = _modelfile(report["gguf"], tok, system, log)
    source = gguf_source(base)  # the base was converted from this GGUF file: the adapter goes back onto it
    if source:
        report["base_gguf"] = source
    rundir.atomic_write_text(os.path.join(tmp, "Modelfile"),
                             deploy.adapter_modelfile(text, report["gguf"], base, source))
    rundir.atomic_write_text(os.path.join(tmp, "DEPLOY.md"),
                             deploy.lora_deploy_md(report["gguf"], name, rundir.base_model(adapter) or base, source))
    if verify and llamacpp.available():
        merged, base_gguf = os.path.join(tmp, ".merged"), os.path.join(tmp, ".base-f16.gguf")
        report["merge_max_logit_diff"] = _merge(adapter, merged, log)
        gguf_file.write_gguf(base, base_gguf, "f16", name, tok, log)
        report["check"] = check.verify(merged, tmp, os.path.basename(base_gguf), "f16", check.check_conversations(adapter),
                                       log, lora=path, tokenizer=tok)
        log(check.summary(report["check"]) + " (the adapter applied to an f16 GGUF of the base)")
        shutil.rmtree(merged)
        os.unlink(base_gguf)
    else:
        log("fidelity check skipped: " + ("--no-verify" if not verify else
                                          "a LoRA GGUF is checked in llama.cpp: pip install 'roctune[gguf]'"))
    report["seconds"] = round(time.monotonic() - started, 1)
    rundir.atomic_write_text(os.path.join(tmp, MARKER), json.dumps(report, indent=1, ensure_ascii=False))


def _check_checker(fmt: str, verify: bool, pre: str) -> None:
    """A SentencePiece vocabulary ("default" pre-tokenizer) can only be checked by llama.cpp itself: transformers'
    GGUF reader rebuilds the tokenizer without the space llama.cpp (and Llama 2's, Mistral's tokenizers) put
    before text that follows a special token, so its read-back would refuse a right file."""
    from roctune.errors import EnvironmentProblem
    from roctune.export import llamacpp

    if fmt == "gguf" and verify and pre == "default" and not llamacpp.available():
        raise EnvironmentProblem("this model's SentencePiece vocabulary is checked in llama.cpp itself: pip install "
                                 "'roctune[gguf]' (prebuilt, no compiler), or export with --no-verify")


def ollama_name(text: str) -> str:
    """A model name Ollama accepts: lowercase letters, digits, '.', '_' and '-'."""
    cleaned = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    if not cleaned:
        raise ConfigError(f"--name {text!r}: give a name with letters or digits")
    return cleaned


def _modelfile(gguf_name: str, tok, system: str | None, log) -> tuple[str, bool]:
    """The Modelfile, best effort: a chat template Ollama's TEMPLATE cannot express leaves it without one (the
    GGUF is still good), and one line says what to do."""
    from jinja2 import TemplateError

    from roctune.export import deploy

    try:
        return deploy.modelfile(gguf_name, tok, system)[0], True
    except (ConfigError, TemplateError) as e:
        why = str(e) if isinstance(e, ConfigError) else f"the chat template refuses a probe conversation ({e})"
        log(f"Modelfile without TEMPLATE: {why}; Ollama will guess the template from the GGUF - check `ollama show "
            "--template`, or serve it with `llama-server --jinja`, which runs the template inside the GGUF")
        return deploy.bare_modelfile(gguf_name, tok, system), False


def _merge(adapter: str, merged: str, log) -> float:
    from roctune.merge import merge

    return merge(adapter, merged, dtype="fp32", log=log)["max_logit_diff"]


def _write(model_dir: str, tmp: str, gguf_name: str, quant: str, name: str, tok, log, search=(),
           plan: dict | None = None) -> dict:
    from roctune.export import gguf_file

    path = os.path.join(tmp, gguf_name)
    t = time.monotonic()
    if quant in gguf_file.KQUANTS:
        f16 = os.path.join(tmp, ".f16.gguf")
        facts = gguf_file.write_gguf(model_dir, f16, "f16", name, tok, log, search)
        keep = (plan or {}).get("q8_0_tensors")
        gguf_file.kquantize(f16, path + ".k" if keep else path, quant, plan)
        if keep:
            from roctune.export.requant import keep_at_q8_0

            keep_at_q8_0(path + ".k", f16, path, keep)
            os.unlink(path + ".k")
        os.unlink(f16)
        facts["bytes"] = os.path.getsize(path)
        facts["vocab_tensor_types"] = gguf_file.vocab_tensor_types(path)
    else:
        facts = gguf_file.write_gguf(model_dir, path, quant, name, tok, log, search)
    facts["write_seconds"] = round(time.monotonic() - t, 1)
    log(f"wrote {gguf_name}: {facts['bytes'] / 2**20:.1f} MiB in {facts['write_seconds']:.0f} s")
    return facts
