"""One export, as every format unit sees it: the run (rundir.Run), where it goes, the options, and what was found
before any weights load (the base model's folder, the tokenizer with the run's chat template, the model family
and llama.cpp's pre-tokenizer). `prepare` finds them; the pieces every format writes the same way (the Ollama
name, the merge into a scratch folder) are here too."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from roctune import rundir
from roctune.errors import ConfigError


@dataclass
class Job:
    run: rundir.Run
    output: str
    quant: str
    embedding_type: str
    output_type: str
    verify: bool
    name: str  # the model's name for Ollama and the file
    base: str  # the base model's folder (the run's own folder when it saved a whole model)
    tokenizer: object
    token_rows: str | None  # why a LoRA GGUF cannot hold the adapter's trained token rows; None when it can
    family: object = None  # roctune.families row, and
    pre: str = ""  # llama.cpp's pre-tokenizer name ("default": SentencePiece): set by `inspect`
    file: str = ""  # the GGUF's name, set by the format
    plan: dict = field(default_factory=dict)  # a llama.cpp quant's tensor types (gguf_file.tensor_plan)
    vision: object = None  # a vision-language run's mmproj layout (mmproj.check; vision_gguf.py sets it)

    def inspect(self) -> None:
        """The model's family and llama.cpp's pre-tokenizer: a model the GGUF writer does not support is refused
        here, before any weights load."""
        from roctune.export import gguf_file

        self.family, _, self.pre = gguf_file.check_model(self.base, self.tokenizer, (self.base,))


def prepare(run: rundir.Run, output: str, quant: str, name: str | None, verify: bool, embedding_type: str,
            output_type: str) -> Job:
    """What the formats need of the run before a model loads: its base, its tokenizer and chat template (the
    GGUF's: the run's), and whether the adapter's trained token rows fit a LoRA GGUF (the format inspects the model
    with `Job.inspect` when it is ready to)."""
    from roctune.export.lora_gguf import token_rows_refusal
    from roctune.models import load_tokenizer, resolve_model

    base = run.path if run.whole_model else resolve_model(run.base_model)
    tok = load_tokenizer(run.tokenizer_source(base), template=run.template)
    rows = None if run.whole_model else token_rows_refusal(run.adapter, tok, run.path)
    name = ollama_name(name or os.path.basename(os.path.abspath(run.path)))
    return Job(run, output, quant, embedding_type, output_type, verify, name, base, tok, rows)


def ollama_name(text: str) -> str:
    """A model name Ollama accepts: lowercase letters, digits, '.', '_' and '-'."""
    cleaned = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    if not cleaned:
        raise ConfigError(f"--name {text!r}: give a name with letters or digits")
    return cleaned


def merge(run: rundir.Run, merged: str, log) -> float:
    """The run merged into its base in `merged` (fp32, roctune.merge's own logits check); its largest difference."""
    from roctune.merge import merge as merge_run

    return merge_run(run, merged, dtype="fp32", log=log)["max_logit_diff"]
