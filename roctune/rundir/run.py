"""A run, read once: `open(path) -> Run` reads a run directory (or a plain PEFT adapter folder, or a model folder
such as a freeze/full run) and hands every consumer (merge, export, eval, generate, chat, serve, train --adapter)
the same checked value: its base model, its method's and stage's rows (roctune.method_rows, roctune.stages), the
chat template and tool format it trained with, its --rope-scaling and its adapter's settings. What a consumer may
do with a run it asks the rows (`Run.stage.produces`, `Run.method.quantized`), never the names.

Everything in the folder is checked here, where it enters: a damaged run.yaml, a base model that is not one name,
a method or stage this roctune does not know, and (when a command first asks for it, as it loads the weights) an
adapter PEFT could not load: one error naming the file and field."""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

from roctune import method_rows, stages
from roctune.errors import ConfigError, RoctuneError
from roctune.method_rows import Method
from roctune.rundir.adapter import check_adapter
from roctune.rundir.layout import ADAPTER_CONFIG, MODEL_CONFIG, RUN_FILE, has_adapter, is_full_model_dir, is_run_dir
from roctune.rundir.run_yaml import method_name, read_run
from roctune.stages import Stage

TOKENIZER_CONFIG = "tokenizer_config.json"


@dataclass(frozen=True)
class Run:
    path: str
    doc: dict  # run.yaml ({"base_model", "config": {}} for a plain adapter folder, {"config": {}} for a model folder)
    method: Method
    stage: Stage
    whole_model: bool  # it holds a whole model (freeze/full, or any model folder), not an adapter
    what: str  # how errors name it (--adapter PATH)

    @cached_property
    def adapter(self) -> dict | None:
        """adapter_config.json, checked with its weights (rundir.check_adapter) when first asked; None for a run that
        saved a whole model."""
        return None if self.whole_model else check_adapter(self.path, self.what)

    def checked(self) -> "Run":
        """The run, its adapter checked with its weights (once): before a command loads it."""
        _ = self.adapter
        return self

    @property
    def config(self) -> dict:
        """The settings the run trained with (run.yaml's config; empty for a folder that does not say)."""
        return self.doc["config"]

    @property
    def base_model(self) -> str | None:
        """The base model the run trained on, as recorded (None when the folder does not say)."""
        return self.doc.get("base_model")

    @property
    def is_run(self) -> bool:
        """A folder roctune's training wrote (it holds run.yaml)."""
        return is_run_dir(self.path)

    @property
    def template(self) -> str | None:
        """The chat template the run trained with, by name, when roctune chose one (None: the model's own): every
        later command renders with it, so the model is asked as it was taught."""
        chosen = self.doc.get("template")
        return chosen.get("name") if isinstance(chosen, dict) else None

    @property
    def tool_format(self) -> str | None:
        """The tool-call format its template wrote calls in (roctune.data.answer_format); None when not recorded."""
        value = self.doc.get("tool_format")
        return value if isinstance(value, str) else None

    @property
    def rope_scaling(self) -> str:
        """Its --rope-scaling ("" for none): every consumer loads the base with the same positions."""
        return str(self.config.get("rope_scaling") or "")

    def setting(self, name: str, default=None):
        """A training setting as the run recorded it (e.g. max_length), else `default`."""
        value = self.config.get(name)
        return default if value is None else value

    def count(self, name: str, default: int) -> int:
        """A setting that is a positive whole number (max_length, image_max_pixels), else `default`: a run.yaml
        edited by hand to anything else is one error naming the file and field, not a traceback where it is used."""
        value = self.setting(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{os.path.join(self.path, RUN_FILE)}: config.{name} is {str(value)[:40]!r}, not a "
                              f"positive whole number; restore it (e.g. {default}) or train again")
        return value

    def tokenizer_source(self, base: str) -> str:
        """Where its tokenizer is: saved in the run, else the base model's."""
        return self.path if os.path.isfile(os.path.join(self.path, TOKENIZER_CONFIG)) else base


def _row(table: dict, value, doc_path: str, key: str):
    if not isinstance(value, str) or value not in table:
        raise RoctuneError(f"{doc_path}: config.{key} is {str(value)[:60]!r}, not one of {', '.join(table)}; this "
                           "run was written by another roctune or edited: restore it or train again")
    return table[value]


def open_run(path: str, what: str | None = None) -> Run:
    """The run in folder `path`, read and checked once. `what` names it in errors (default: --adapter PATH)."""
    what = what or f"--adapter {path}"
    if not os.path.isdir(path):
        raise ConfigError(f"{what}: no such directory")
    if is_run_dir(path) or has_adapter(path):
        doc = read_run(path)
    elif os.path.isfile(os.path.join(path, MODEL_CONFIG)):
        doc = {"config": {}}  # a model folder: loaded as the model itself
    else:
        raise RoctuneError(f"{path}: not a roctune run or PEFT adapter directory (no {RUN_FILE} or {ADAPTER_CONFIG})")
    where = os.path.join(path, RUN_FILE)
    method = _row(method_rows.METHODS, method_name(doc, path), where, "method")
    stage = _row(stages.STAGES, doc["config"].get("stage") or stages.DEFAULT, where, "stage")
    return Run(path, doc, method, stage, is_full_model_dir(path), what)


def refuse_scorer(run: Run, command: str | None = None) -> Run:
    """`run` when it produces a language model. A run that produces a scorer (its stage row: a reward model) has a
    score head and writes no text: chat, generate, serve, merge, export and train --adapter refuse it in one line
    naming the run and what to use it for."""
    if run.stage.produces != stages.SCORER:
        return run
    writes = f"; roctune {command} writes models that generate text" if command else ""
    raise ConfigError(f"{run.what}: {run.stage.produces} (--stage {run.stage.name}) scores "
                      f"answers and does not write them{writes}; use the run itself: roctune eval --adapter "
                      f"{run.path}, or --reward-model {run.path} to score GRPO's completions")
