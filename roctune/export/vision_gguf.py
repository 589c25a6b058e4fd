"""--format gguf of a vision-language run: the language model as one GGUF and the vision tower with its projector
as llama.cpp's mmproj GGUF, each checked after writing, with a DEPLOY.md for `llama-server --mmproj`. A format
unit (export/__init__.py) like merged_gguf.py, whose writer and checks it reuses for the language model.

Steps: `check`, before weights load (the family's mmproj row, its vision config and image processor, the language
model's GGUF layout and tokenizer); `write`: the adapter merged with `roctune merge` (its own logits check, on a
prompt with a picture too) into a scratch folder, the language model split off into a plain causal-LM folder and
written by gguf_file.py, the mmproj written by mmproj.py from the merged folder, so LoRA on the vision tower and
projector is in it; `verify`: the language model's GGUF as for text (verify.py, on the run's text conversations),
the mmproj read back by GGUF's reader (every tensor, its shape and values), and both files together on
conversations with a picture (mmproj_check.py: llama.cpp itself when its multimodal library is installed)."""
from __future__ import annotations

import os
import shutil

from roctune import rundir
from roctune.errors import ConfigError
from roctune.export import merged_gguf
from roctune.export.job import Job

check_options = merged_gguf.check_options
check_run = merged_gguf.check_run


def is_vision_run(run: rundir.Run) -> bool:
    """Whether the run (or model folder) is a vision-language model's, from config.json files only."""
    from roctune.generate import is_vision_model
    from roctune.models import resolve_model

    try:
        return is_vision_model(run.path if run.whole_model else resolve_model(run.base_model))
    except Exception:  # noqa: BLE001 - a run whose base cannot be resolved is reported by the format's own checks
        return False


def _mmproj_file(job: Job) -> str:
    return f"mmproj-{job.name}-f16.gguf"


def check(job: Job, log) -> None:
    """The mmproj row of the family and the language model's GGUF layout and tokenizer, before any weights load."""
    from roctune.export import gguf_file, mmproj

    job.vision = mmproj.check(job.base)
    job.tokenizer.roctune_content_parts = True  # its template takes content parts, as in training (data/render.py)
    job.pre = _check_text(job.base, job.tokenizer)
    merged_gguf._check_checker(job)
    job.file = f"{job.name}-{job.quant}.gguf"
    job.plan = gguf_file.tensor_plan(job.base, job.quant, job.embedding_type, job.output_type)


def _check_text(model_dir: str, tok) -> str:
    """The language model's GGUF layout and tokenizer (gguf_file.check_model's checks, on the vision model's text
    config); returns llama.cpp's pre-tokenizer name."""
    from roctune.export import gguf_file, gguf_specs, mmproj

    text = mmproj.text_config(mmproj.read_json(os.path.join(model_dir, "config.json")))
    found = gguf_specs.spec_for(text)
    if found is None:
        raise ConfigError(f"{model_dir}: its language model ({text.get('model_type')}) has no GGUF layout in roctune; "
                          "use `roctune merge` and llama.cpp's convert_hf_to_gguf.py")
    why = gguf_specs.unsupported(text, found[1])
    if why:
        raise ConfigError(f"{model_dir}: its language model with {why} is not supported by roctune export")
    return gguf_file.pre_tokenizer(tok, model_dir)


def _merged(job: Job, tmp: str) -> str:
    return job.base if job.run.whole_model else os.path.join(tmp, ".merged")


def write(job: Job, tmp: str, log) -> dict:
    """Merge (unless the run is a whole model), split the language model off, write both GGUFs, the Modelfile and
    DEPLOY.md into `tmp`."""
    from roctune.export import deploy, mmproj
    from roctune.export.job import merge

    report = {"mmproj": _mmproj_file(job), "quant": job.quant, "projector": job.vision.projector,
              **({"tensor_plan": job.plan} if job.plan else {})}
    merged = _merged(job, tmp)
    if not job.run.whole_model:
        report["merge_max_logit_diff"] = merge(job.run, merged, log)
    text_dir = mmproj.split_text(merged, os.path.join(tmp, ".text"))
    report.update(merged_gguf._write(job, text_dir, tmp, log))
    facts = mmproj.write(merged, os.path.join(tmp, report["mmproj"]), job.name, log)
    report["mmproj_bytes"], report["mmproj_tensors"] = facts["bytes"], facts["tensors"]
    log(f"wrote {report['mmproj']}: {facts['tensors']} vision tower and projector tensors ({job.vision.projector})")
    text, report["modelfile_template"] = deploy.best_modelfile(job.file, job.tokenizer, log)
    rundir.atomic_write_text(os.path.join(tmp, "Modelfile"), text)
    rundir.atomic_write_text(os.path.join(tmp, "DEPLOY.md"), deploy_md(job.output, job.file, report["mmproj"],
                                                                       job.name))
    return report


def verify(job: Job, tmp: str, log) -> dict:
    """Both files checked (unless --no-verify); the scratch folders removed after. Returns the report's entries."""
    report = {}
    if job.verify:
        _verify(job, tmp, report, log)
    else:
        log("fidelity check skipped (--no-verify)")
    shutil.rmtree(os.path.join(tmp, ".text"))
    if not job.run.whole_model:
        shutil.rmtree(_merged(job, tmp))
    return report


def _verify(job: Job, tmp: str, report: dict, log) -> None:
    from roctune.data.parts import has_images
    from roctune.export import mmproj, mmproj_check, mtmd, quants
    from roctune.export import verify as check

    merged, lay, mmproj_name = _merged(job, tmp), job.vision, _mmproj_file(job)
    conversations = check.check_conversations(job.run)
    text_only = [c for c in conversations if not has_images(c)] or None
    report["check"] = check.verify(os.path.join(tmp, ".text"), tmp, job.file, job.quant,
                                   text_only or check.check_conversations(""), log, tokenizer=job.tokenizer,
                                   hint=quants.next_options(job.quant, job.plan))
    log(check.summary(report["check"]))
    path = os.path.join(tmp, mmproj_name)
    report["mmproj_read_back"] = mmproj.read_back(path, merged)
    images = mmproj_check.check_conversations(conversations)
    refs = mmproj_check.references(merged, lay, images)
    if mtmd.available():
        figures = mmproj_check.by_llama_cpp(os.path.join(tmp, job.file), path, refs, lay.placeholder)
    else:
        figures = mmproj_check.by_transformers(merged, path, refs, lay, images)
    report["mmproj_check"] = figures
    mmproj_check.judge(figures, check.kl_limit(job.quant), mmproj_name)
    log(mmproj_check.summary(figures))


def done(job: Job, report: dict, log) -> None:
    log(f"exported {job.file} ({report['bytes'] / 2**20:.1f} MiB) and {report['mmproj']} "
        f"({report['mmproj_bytes'] / 2**20:.1f} MiB), Modelfile and DEPLOY.md to {job.output} "
        f"in {report['seconds']:.0f} s")


def deploy_md(output: str, gguf_name: str, mmproj_name: str, name: str) -> str:
    out = os.path.abspath(output)
    return "\n".join([
        f"# Deploying {name} (a vision-language model)\n",
        "Written by `roctune export`: the language model and its vision projector (mmproj, the vision tower with "
        "any LoRA trained on it merged in) were read back and compared with the merged model (roctune_export.json)."
        "\n", "## llama.cpp\n",
        f"```\nllama-server -m {out}/{gguf_name} --mmproj {out}/{mmproj_name} --jinja --port 8080\n```",
        "An OpenAI-compatible API on http://localhost:8080/v1 that takes `image_url` content parts. One question "
        "in the terminal:\n",
        f"```\nllama-mtmd-cli -m {out}/{gguf_name} --mmproj {out}/{mmproj_name} --image photo.png -p \"What is "
        "in this picture?\"\n```\n",
        "## Ollama\n", "The Modelfile holds the language model and its chat TEMPLATE: text only. Whether Ollama runs "
        "an mmproj you import depends on its version; llama.cpp above runs both files.\n",
        "## vLLM\n", "vLLM serves the merged folder (`roctune merge`), or an adapter trained on the language model "
        "only: vLLM applies LoRA to the language model, not to the vision tower or projector "
        "(`roctune serve --engine vllm` says so for a run that trained them).\n"])
