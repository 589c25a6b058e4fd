"""--format gguf: the run merged into its base model (roctune.merge, with its own logits check) and written as one
GGUF in the --quant type (roctune.export.quants: written by gguf_file.py, or by llama.cpp's quantizer from an f16
GGUF written there), with an Ollama Modelfile and a DEPLOY.md, then run in llama.cpp (or read back) and compared
with the merged model (verify.py). A format unit: `check` before anything loads, `write`, `verify`, `done`."""
from __future__ import annotations

import os
import shutil
import time

from roctune.export import quants
from roctune.export.job import Job

def check_options(quant: str, embedding_type: str, output_type: str) -> None:
    quants.check(quant)
    quants.check_tensor_types(quant, embedding_type, output_type)


def check_run(run) -> None:
    """Any run: a whole model is written as it is, an adapter merged first."""


def check(job: Job, log) -> None:
    """What can be checked before the merge: a SentencePiece vocabulary needs llama.cpp to check it; the types of
    the vocabulary matrices in a llama.cpp quant, and the matrices the adapter changed, kept at q8_0 when the base
    came from a GGUF."""
    from roctune.export import gguf_file
    from roctune.models import gguf_source

    job.inspect()
    _check_checker(job)
    job.file = f"{job.name}-{job.quant}.gguf"
    job.plan = gguf_file.tensor_plan(job.base, job.quant, job.embedding_type, job.output_type)
    if job.plan:
        log(f"token embedding {job.plan['embedding_type']}, output layer {job.plan['output_type']} "
            f"({job.plan['reason']})")
    if job.plan and not job.run.whole_model and gguf_source(job.base):
        _keep_changed(job, log)


def _check_checker(job: Job) -> None:
    """A SentencePiece vocabulary ("default" pre-tokenizer) can only be checked by llama.cpp itself: transformers'
    GGUF reader rebuilds the tokenizer without the space llama.cpp (and Llama 2's, Mistral's tokenizers) put
    before text that follows a special token, so its read-back would refuse a right file."""
    from roctune.errors import EnvironmentProblem
    from roctune.export import llamacpp

    if job.verify and job.pre == "default" and not llamacpp.available():
        raise EnvironmentProblem("this model's SentencePiece vocabulary is checked in llama.cpp itself: pip install "
                                 "'roctune[gguf]' (prebuilt, no compiler), or export with --no-verify")


def _keep_changed(job: Job, log) -> None:
    """A base converted from a GGUF: the matrices LoRA changed stay at q8_0 (requant.py says why)."""
    from roctune.export import gguf_file, requant

    names = requant.changed_matrices(job.run.path, job.family, gguf_file.read_config(job.base)["num_hidden_layers"])
    if names:
        job.plan["q8_0_tensors"] = names
        log(f"the {len(names)} matrices the adapter changed stay at q8_0: the others are the base GGUF's own "
            "values and re-quantize almost exactly, while 4-6 bit rounding of the changed ones is as large as the "
            "fine-tune's change")


def _merged(job: Job, tmp: str) -> str:
    return job.base if job.run.whole_model else os.path.join(tmp, ".merged")


def write(job: Job, tmp: str, log) -> dict:
    """Merge (unless the run is a whole model), write the GGUF, the Modelfile and DEPLOY.md into `tmp`."""
    from roctune import rundir
    from roctune.export import deploy
    from roctune.export.job import merge

    report = {"quant": job.quant, **({"tensor_plan": job.plan} if job.plan else {})}
    if not job.run.whole_model:
        report["merge_max_logit_diff"] = merge(job.run, _merged(job, tmp), log)
    report.update(_write(job, _merged(job, tmp), tmp, log))
    text, report["modelfile_template"] = deploy.best_modelfile(job.file, job.tokenizer, log)
    rundir.atomic_write_text(os.path.join(tmp, "Modelfile"), text)
    rank = None if job.run.whole_model else job.run.adapter.get("r")
    rundir.atomic_write_text(os.path.join(tmp, "DEPLOY.md"), deploy.deploy_md(
        job.output, job.file, job.name, job.run.path, job.run.base_model or job.base, rank, job.run.whole_model))
    return report


def _write(job: Job, model_dir: str, tmp: str, log) -> dict:
    """The GGUF in `tmp`: written here in the quant's type, or an f16 one quantized by llama.cpp."""
    from roctune.export import gguf_file

    path, quant, search = os.path.join(tmp, job.file), job.quant, (job.base,)
    t = time.monotonic()
    if quants.QUANTS[quant].writer == quants.LLAMA_CPP:
        f16 = os.path.join(tmp, ".f16.gguf")
        facts = gguf_file.write_gguf(model_dir, f16, "f16", job.name, job.tokenizer, log, search)
        keep = job.plan.get("q8_0_tensors")
        gguf_file.kquantize(f16, path + ".k" if keep else path, quant, job.plan)
        if keep:
            from roctune.export.requant import keep_at_q8_0

            keep_at_q8_0(path + ".k", f16, path, keep)
            os.unlink(path + ".k")
        os.unlink(f16)
        facts["bytes"] = os.path.getsize(path)
        facts["vocab_tensor_types"] = gguf_file.vocab_tensor_types(path)
    else:
        facts = gguf_file.write_gguf(model_dir, path, quant, job.name, job.tokenizer, log, search)
    facts["write_seconds"] = round(time.monotonic() - t, 1)
    log(f"wrote {job.file}: {facts['bytes'] / 2**20:.1f} MiB in {facts['write_seconds']:.0f} s")
    return facts


def verify(job: Job, tmp: str, log) -> dict:
    """The GGUF run in llama.cpp (or read back) against the merged model; the scratch merge removed after. Returns
    the report's entries."""
    from roctune.export import verify as check

    report = {}
    if job.verify:
        report["check"] = check.verify(_merged(job, tmp), tmp, job.file, job.quant,
                                       check.check_conversations(job.run), log, tokenizer=job.tokenizer,
                                       hint=quants.next_options(job.quant, job.plan))
        log(check.summary(report["check"]))
    else:
        log("fidelity check skipped (--no-verify)")
    if not job.run.whole_model:
        shutil.rmtree(_merged(job, tmp))
    return report


def done(job: Job, report: dict, log) -> None:
    from roctune.models import gguf_source

    log(f"exported {job.file} ({report['bytes'] / 2**20:.1f} MiB), Modelfile and DEPLOY.md to {job.output} "
        f"in {report['seconds']:.0f} s")
    source = None if job.run.whole_model else gguf_source(job.base)
    if source and not job.token_rows:  # an adapter with trained token rows has no LoRA GGUF
        log(f"the base model came from {source}: `roctune export --adapter {job.run.path} --format lora-gguf` puts "
            "this fine-tune onto that same file (llama-server -m FILE --lora ...), keeping its own quantization")
