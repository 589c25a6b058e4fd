"""LoRA adapters on the one base model: names, the --adapter NAME=DIR specs, folders confined under
--adapter-root, and `AdapterStack`, which loads and unloads PEFT adapters and runs a forward pass for rows that
each use their own adapter (mixed in one batch through PEFT's `adapter_names`; DoRA adapters, which PEFT
cannot mix, one adapter per batch). Adapter folders are read through `roctune.rundir`."""

import contextlib
import logging
import os
import re
from dataclasses import dataclass

from roctune import rundir
from roctune.errors import ConfigError, RoctuneError
from roctune.serve.errors import ApiError, bad_field, model_not_found
from roctune.serve.schemas import check_text

log = logging.getLogger(__name__)

ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
BASE_ROW = "__base__"  # PEFT's name for "no adapter" in a mixed batch


# ------------------------------------------------------------------------------------------ names, paths
def check_adapter_name(name) -> str:
    if not isinstance(name, str) or not ADAPTER_NAME.match(name) or name == BASE_ROW:
        raise bad_field("name", f"adapter name {name!r}: use 1-64 letters, digits, '-' or '_' (starting with a "
                        "letter or digit)")
    return name


def adapter_dir_under(root: str, relative) -> str:
    """The real path of adapter folder `relative` inside `root`. Rejects absolute paths, `..` and anything whose
    real path (symlinks resolved) leaves the root; raises ApiError(400/404)."""
    if not isinstance(relative, str) or not relative.strip():
        raise bad_field("path", "field 'path' must be a non-empty string: a folder relative to --adapter-root")
    if "\x00" in relative:
        raise bad_field("path", "field 'path' contains a NUL byte")
    check_text(relative, "path")
    parts = re.split(r"[\\/]+", relative)
    if os.path.isabs(relative) or relative.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:", relative):
        raise bad_field("path", f"path {relative!r} is absolute; give a folder relative to --adapter-root")
    if ".." in parts:
        raise bad_field("path", f"path {relative!r} contains '..'; give a folder inside --adapter-root")
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, relative))
    if real != real_root and not real.startswith(real_root + os.sep):
        raise bad_field("path", f"path {relative!r} leads outside --adapter-root (through a symlink)")
    if not rundir.has_adapter(real):
        raise ApiError(404, f"path {relative!r}: no {rundir.ADAPTER_CONFIG} under --adapter-root", code="not_found",
                       type="not_found_error", param="path")
    return real


def base_model_id(model: str | None) -> str:
    """The name the base model is served under (both engines): the bundled model's name, a folder's name, or
    the hub id as given."""
    from roctune.models import DEFAULT_MODEL

    if model is None:
        return DEFAULT_MODEL
    return os.path.basename(os.path.normpath(model)) if os.path.isdir(os.path.expanduser(model)) else model


def parse_adapter_specs(specs: list[str]) -> list[tuple[str, str]]:
    """[(name, absolute folder)] from --adapter NAME=DIR flags; raises ConfigError naming the bad one."""
    out = []
    for spec in specs or []:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--adapter {spec!r}: expected NAME=DIR (e.g. --adapter support=runs/support)")
        try:
            check_adapter_name(name)
        except ApiError as e:
            raise ConfigError(f"--adapter {spec!r}: {e.message}") from None
        if not os.path.isdir(path):
            raise ConfigError(f"--adapter {spec!r}: no such directory {path}")
        if not rundir.has_adapter(path):
            raise ConfigError(f"--adapter {spec!r}: {path} has no {rundir.ADAPTER_CONFIG}; is training finished?")
        rundir.refuse_scorer(rundir.open(path, f"--adapter {spec!r}"))  # a reward model writes no answers
        if name in [n for n, _ in out]:
            raise ConfigError(f"--adapter {spec!r}: the name {name!r} is given twice")
        out.append((name, os.path.abspath(path)))
    return out


def adapters_base(model: str | None, adapters: list[tuple[str, str]]) -> tuple[str | None, str | None]:
    """(base model, chat template name) for serving `adapters`: the base is --model when given, else the one the
    adapters' run.yaml names (as every other command reads it); the template is the one they were trained with.
    Adapters of different bases, or of different templates, cannot share one model: ConfigError in one line."""
    bases = {spec: rundir.base_model(path) for spec, path in adapters}
    templates = {spec: rundir.template_name(path) for spec, path in adapters}
    # with --model, an adapter of another base is refused by its own check when it loads
    for what, found in ([("base models", bases)] if model is None else []) + [("chat templates", templates)]:
        if len(set(found.values())) > 1:
            shown = ", ".join(f"{name}={value or 'its own'}" for name, value in found.items())
            raise ConfigError(f"--adapter: these adapters were trained with different {what} ({shown}); "
                              "serve each group with its own `roctune serve`")
    if model is None and bases:
        model = next(iter(bases.values()))
    return model, next(iter(templates.values()), None)


# -------------------------------------------------------------------------------------------- the stack
@dataclass
class Adapter:
    path: str
    mixable: bool


class AdapterStack:
    """The base model and the adapters loaded on it. Not thread-safe: the engine's worker owns it."""

    def __init__(self, base, base_id: str, base_path: str, rope_scaling: str = ""):
        self.base = base
        self.base_id = base_id
        self.base_path = base_path
        self.rope_scaling = rope_scaling  # the base's --rope-scaling: an adapter must have trained with the same
        self.peft = None  # the PeftModel wrapping self.base once an adapter is loaded
        self.loaded: dict[str, Adapter] = {}

    def load(self, name: str, path: str) -> None:
        """Load the LoRA adapter in folder `path` as model `name`. Raises ApiError."""
        check_adapter_name(name)
        if name == self.base_id or name in self.loaded:
            raise ApiError(409, f"a model named {name!r} is already loaded; unload it first or pick another name",
                           code="conflict", param="name")
        try:
            acfg = rundir.check_adapter(path, f"adapter {name}")
            rundir.refuse_scorer(rundir.open(path, f"adapter {name}"))  # a reward model writes no answers
        except RoctuneError as e:
            raise bad_field("path", str(e)) from None
        self._check_base(path)
        from peft import PeftModel

        try:
            if self.peft is None:
                self.peft = PeftModel.from_pretrained(self.base, path, adapter_name=name)
            else:
                self.peft.load_adapter(path, adapter_name=name)
        except Exception as e:
            raise bad_field("path", f"{path}: cannot load the adapter on {self.base_id} "
                            f"({type(e).__name__}: {str(e).splitlines()[0][:300]})") from None
        self.peft.eval()
        self.loaded[name] = Adapter(path, mixable=not acfg.get("use_dora"))
        log.info("loaded adapter %s from %s", name, path)

    def _check_base(self, path: str) -> None:
        """Refuse a roctune run trained on another base model (when its base can be resolved here)."""
        from roctune.models import resolve_model

        if not rundir.is_run_dir(path):
            return
        if rundir.rope_scaling(path) != self.rope_scaling:
            raise bad_field("path", f"{path}: trained with --rope-scaling {rundir.rope_scaling(path) or 'none'} but "
                            f"this server's base runs with {self.rope_scaling or 'none'}; serve it from a server "
                            "started with it (roctune serve --adapter)")
        try:
            trained_on = rundir.read_run(path).get("base_model")
            trained_path = resolve_model(trained_on)
        except Exception:  # unresolvable here (hub id offline): PEFT still checks the shapes
            return
        if os.path.realpath(trained_path) != os.path.realpath(self.base_path):
            raise bad_field("path", f"{path}: trained on {trained_on!r} but this server runs {self.base_id!r}; "
                            "serve it with --model set to its base")

    def unload(self, name: str) -> None:
        if name not in self.loaded:
            raise model_not_found(f"no adapter named {name!r} is loaded", param="name")
        if len(self.loaded) == 1:  # PEFT cannot run without an adapter: take the LoRA layers out
            self.base = self.peft.unload()
            self.base.eval()
            self.peft = None
        else:
            self.peft.delete_adapter(name)
        del self.loaded[name]
        log.info("unloaded adapter %s", name)

    def mixable(self, adapters: list) -> bool:
        return all(a is None or self.loaded[a].mixable for a in adapters)

    def compatible(self, adapters: list) -> bool:
        """Whether rows using `adapters` (None: the base) can share a batch."""
        return self.mixable(adapters) or len(set(adapters)) == 1

    def forward(self, adapters: list, **inputs):
        """The last position's logits (float) of one forward pass for rows that use `adapters`. A prompt with images
        runs alone with its adapter set, not named per row: LoRA on a vision tower sees one row per image tile, and
        PEFT's per-row adapter names count rows."""
        model, extra, ctx = self.base, {}, contextlib.nullcontext()
        if self.peft is not None:
            model = self.peft
            if self.mixable(adapters) and "pixel_values" not in inputs:
                extra = {"adapter_names": [a or BASE_ROW for a in adapters]}
            elif adapters[0] is None:  # compatible() keeps a batch with an unmixable adapter to that adapter only
                ctx = self.peft.disable_adapter()
            else:
                self.peft.set_adapter(adapters[0])
        with ctx:
            out = model(use_cache=True, logits_to_keep=1, **inputs, **extra)
        return out.logits[:, -1, :].float()
