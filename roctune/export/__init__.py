"""`roctune export`: a trained run as a GGUF file for llama.cpp and Ollama, with an Ollama Modelfile and a
DEPLOY.md (llama.cpp, Ollama, vLLM, SGLang), checked after writing.

A format is a unit: one file (merged_gguf.py: the run merged and written in a quant type of quants.py; lora_gguf.py:
the adapter alone; vision_gguf.py: a vision-language run's language model and llama.cpp's mmproj, what --format
gguf writes for such a run) and one row in FORMATS. Each has `check_options` (its flags, before the run is read),
`check_run` and `check` (everything that can be checked before a model loads), `write` (the file, its Modelfile
and DEPLOY.md), `verify` (the file run in llama.cpp, or read back, against the merged model) and `done` (the last
line). `export()` only dispatches: the run read once (rundir.open), the output folder checked, the job prepared
(job.py: base, tokenizer, family), then the format's steps in a temporary folder beside --output that replaces it
only when every step passed, so a failed check leaves nothing behind. The folder gets a `roctune_export.json`
marker (with the figures of the check): --overwrite replaces only such a folder."""
from __future__ import annotations

import importlib
import json
import os
import time
from dataclasses import dataclass

from roctune import rundir
from roctune.errors import ConfigError
from roctune.export.quants import DEFAULT

MARKER = "roctune_export.json"


@dataclass(frozen=True)
class Format:
    name: str  # --format NAME
    module: str  # its unit
    help: str
    quant: bool = False  # --quant chooses its type (else it is refused: the file is written in f32)
    vision: str = ""  # its unit for a vision-language run ("": the format cannot carry one)

    def load(self):
        return importlib.import_module(self.module)

    def for_run(self, run: rundir.Run):
        """The unit that writes `run`: a vision-language run's (its language model and the mmproj) where the format
        has one, else the format's own; one line where the format cannot carry a vision model."""
        from roctune.export.vision_gguf import is_vision_run

        if not is_vision_run(run):
            return self.load()
        if not self.vision:
            raise ConfigError(f"--format {self.name}: a vision-language model exports as --format gguf (its language "
                              "model and the mmproj); a LoRA GGUF cannot carry LoRA on the vision tower (llama.cpp "
                              "14867)")
        return importlib.import_module(self.vision)


ROWS = (Format("gguf", "roctune.export.merged_gguf", "the merged model", quant=True,
               vision="roctune.export.vision_gguf"),
        Format("lora-gguf", "roctune.export.lora_gguf", "the adapter alone, for llama-server --lora and Ollama's "
                                                         "ADAPTER, beside a GGUF of the base model"))
FORMATS = {f.name: f for f in ROWS}


def unit(fmt: str):
    """The module of --format `fmt`; one line naming the choices otherwise."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt}: unknown; choose one of {', '.join(FORMATS)}")
    return FORMATS[fmt].load()


def export(adapter: "str | rundir.Run", output: str, quant: str = DEFAULT, name: str | None = None,
           fmt: str = "gguf", verify: bool = True, overwrite: bool = False, log=print, embedding_type: str = "auto",
           output_type: str = "auto") -> dict:
    """Export the run `adapter` (a rundir.Run or its folder) into the folder `output`; returns the report also saved
    as roctune_export.json. `embedding_type`/`output_type`: the token embedding's and output layer's type in a
    llama.cpp quant (quants.TENSOR_TYPES; "auto" by the vocabulary's share of the weights)."""
    from roctune.export import job as jobs
    from roctune.merge import check_output

    unit(fmt).check_options(quant, embedding_type, output_type)
    run = rundir.refuse_scorer(rundir.open(adapter) if isinstance(adapter, str) else adapter, command="export")
    check_output(run.path, output, overwrite, marker=MARKER, writer="roctune export")
    code = FORMATS[fmt].for_run(run)
    code.check_run(run)
    job = jobs.prepare(run, output, quant, name, verify, embedding_type, output_type)
    code.check(job, log)
    started, report = time.monotonic(), {"adapter": os.path.abspath(run.path), "format": fmt, "gguf": job.file}

    def fill(tmp: str) -> None:
        report.update(code.write(job, tmp, log))
        report.update(code.verify(job, tmp, log))
        report["seconds"] = round(time.monotonic() - started, 1)
        rundir.atomic_write_text(os.path.join(tmp, MARKER), json.dumps(report, indent=1, ensure_ascii=False))

    rundir.write_dir_atomically(output, fill)
    code.done(job, report, log)
    return report
