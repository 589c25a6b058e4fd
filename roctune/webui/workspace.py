"""The workspace root: the one folder the web UI reads and writes in.

The page has no login of its own and every handler can be called over Gradio's HTTP API, so a path typed into
the page (data, run and adapter directories, merge and scrub outputs, a local model) is resolved, symlinks and
`..` included, and refused unless it lies inside the root (a base model may also come from $ROCTUNE_HOME/models,
where roctune keeps models; the page only reads those) (`roctune webui --root DIR`, default: the folder the
server was started in). Handlers then use the resolved path, never the text they were given. What a path
leads to is checked too: the files a LLaMA-Factory `dataset_info.json` names, and the base model an adapter's
run.yaml names. A hub id (org/name) is looked up only in the hub cache, never as a folder beside the server.

The page never runs a model's own Python code unless the server was started with `--trust-remote-code`, and
uploads are data files only (no `.py`) and saved settings are `settings/NAME.yaml` only, so nothing the page
writes can become importable code (and the page's training runs with `python -P` outside the workspace anyway).
"""
from __future__ import annotations

import os
import re
import shutil

from roctune.errors import ConfigError
from roctune.webui.i18n import t


UPLOAD_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet", ".pq")
SETTINGS_FOLDER, SETTINGS_SUFFIX = "settings", ".yaml"  # where "Save settings" writes: settings/NAME.yaml
# a settings name: letters, digits, _ and - (no dots, no slashes): it can only ever name settings/NAME.yaml
SETTINGS_NAME = re.compile(r"[^\W][\w-]*")


class Workspace:
    def __init__(self, root: str | None = None, trust_remote_code: bool = False):
        self.root = os.path.realpath(root or os.getcwd())
        if not os.path.isdir(self.root):
            raise ConfigError(f"--root {root}: no such directory")
        self.trust_remote_code = trust_remote_code  # only `roctune webui --trust-remote-code` sets it

    def check_trust(self, asked: bool) -> bool:
        if asked and not self.trust_remote_code:
            raise ConfigError("trust_remote_code: the page runs no model code of its own unless the server was "
                              "started with `roctune webui --trust-remote-code`; untick it, or restart the server so")
        return bool(asked)

    def contains(self, real: str) -> bool:
        return os.path.commonpath([self.root, real]) == self.root

    def path(self, text: str, what: str, write: bool = False) -> str:
        """`text` (relative to the root, or absolute) resolved; refused outside the root, and for `write` the root
        itself is refused too (an --overwrite there would replace the whole workspace)."""
        text = (text or "").strip()
        if not text:
            raise ConfigError(f"{what}: no path given")
        if "\0" in text:  # no file name holds one; os.path would raise ValueError
            raise ConfigError(f"{what} {text!r}: a path cannot contain a NUL character")
        real = os.path.realpath(os.path.join(self.root, os.path.expanduser(text)))
        if not self.contains(real):
            raise ConfigError(t("{what} {path}: outside the workspace {root}; the web UI reads and writes only "
                                "inside it (start it with roctune webui --root DIR to choose another)", what=what,
                                path=text, root=self.root))
        if write and real == self.root:
            raise ConfigError(f"{what} {text}: is the workspace {self.root} itself; choose a folder inside it")
        return real

    def settings_file(self, name: str, write: bool = False) -> str:
        """A settings file of the page: NAME or NAME.yaml is <root>/settings/NAME.yaml (the folder is made when
        saving). Any other name is refused, so "Save settings" never writes a .py file or leaves that folder. For
        loading, a workspace path (with a slash, e.g. ./train.yaml) is read too."""
        text = (name or "").strip()
        stem = text[:-len(SETTINGS_SUFFIX)] if text.endswith(SETTINGS_SUFFIX) else text
        if not SETTINGS_NAME.fullmatch(stem):
            if not write and "/" in text:
                return self.path(text, "--config")
            raise ConfigError(t("settings file {name}: a settings name is letters, digits, _ and - (saved as "
                                "{folder}/NAME{suffix} in the workspace); choose another name", name=repr(text),
                                folder=SETTINGS_FOLDER, suffix=SETTINGS_SUFFIX))
        real = self.path(os.path.join(SETTINGS_FOLDER, stem + SETTINGS_SUFFIX), "settings file", write=write)
        folder = os.path.dirname(real)
        if write and not os.path.isdir(folder):
            if os.path.lexists(folder):
                raise ConfigError(f"settings file: {folder} is not a folder; move it away so the page can keep "
                                  "its settings there")
            os.makedirs(folder)
            real = self.path(os.path.join(SETTINGS_FOLDER, stem + SETTINGS_SUFFIX), "settings file", write=True)
        return real

    def data(self, specs: list[str], what: str = "--data") -> list[str]:
        """Dataset paths resolved; `DIR:name` (a LLaMA-Factory data directory) keeps its `:name`."""
        out = []
        for spec in specs:
            directory, sep, names = spec.rpartition(":")
            if sep and directory and not os.path.exists(os.path.join(self.root, spec)):
                resolved = self.path(directory, what) + ":" + names
                base = self.path(directory, what)
            else:
                resolved = base = self.path(spec, what)
            if os.path.isdir(base):
                self._check_sources(base, resolved, spec, what)
            out.append(resolved)
        return out

    def _check_sources(self, base: str, resolved: str, spec: str, what: str) -> None:
        """The folder's dataset_info.json (a symlink out of the root is not read at all: its keys would be echoed)
        and every file it names must lie inside the root too."""
        from roctune.data.sources import resolve_sources

        info = os.path.join(base, "dataset_info.json")
        if os.path.lexists(info) and not self.contains(os.path.realpath(info)):
            raise ConfigError(f"{what} {spec}: its dataset_info.json leads to {os.path.realpath(info)}, outside the "
                              f"workspace {self.root}; the web UI reads only inside it (copy the file into the folder)")

        for src in resolve_sources(resolved):
            if not self.contains(os.path.realpath(src.path)):
                raise ConfigError(f"{what} {spec}: dataset_info.json names {src.path}, outside the workspace "
                                  f"{self.root}; the web UI reads only inside it (move the file into the workspace)")

    def model(self, text: str | None, what: str = "--model") -> str | None:
        """A local model directory is checked like any path; a hub id (org/name, not a folder here) is kept."""
        text = (text or "").strip()
        if not text:
            return None
        from roctune.models import DEFAULT_MODEL

        if text == DEFAULT_MODEL:
            return None  # the bundled model as the page lists it: as when --model is left out
        local = (os.path.isabs(text) or text.startswith((".", "~"))
                 or os.path.lexists(os.path.join(self.root, text)))
        if local and self.in_model_store(text):
            return os.path.realpath(os.path.expanduser(text))
        if local:
            return self.path(text, what)
        if os.path.lexists(text):  # resolve_model would take this folder beside the server for the hub id
            if not self.contains(os.path.realpath(text)):
                raise ConfigError(f"{what} {text}: is a folder in the server's working folder {os.getcwd()}, "
                                  f"outside the workspace {self.root}; give a model folder inside the workspace")
            return self.path(os.path.realpath(text), what)
        return text

    def in_model_store(self, text: str) -> bool:
        """A folder in $ROCTUNE_HOME/models, where roctune keeps models (read, never written, by the page)."""
        from roctune.models import roctune_home

        store = os.path.realpath(os.path.join(roctune_home(), "models"))
        real = os.path.realpath(os.path.expanduser(text))
        return os.path.isabs(os.path.expanduser(text)) and os.path.commonpath([store, real]) == store

    def adapter(self, text: str, what: str = "--adapter") -> str:
        """An adapter or run directory inside the root whose base model (from its run.yaml or adapter config) is
        the bundled model, a hub id, a model in the hub cache or a folder inside the root."""
        real = self.path(text, what)
        from roctune.errors import RoctuneError
        from roctune.rundir.run_yaml import read_run

        try:
            base = read_run(real).get("base_model") if os.path.isdir(real) else None
        except RoctuneError:
            return real  # not a run: the command says so in its own words
        if isinstance(base, str) and base and not self._known_model(base):
            self.model(base, f"{what} {text}: its base model")
        return real

    def _known_model(self, base: str) -> bool:
        """The bundled model and the hub cache are where roctune itself keeps models: not user paths."""
        if not os.path.isabs(base):
            return False
        from huggingface_hub import constants

        from roctune.models import DEFAULT_MODEL, roctune_home

        real = os.path.realpath(base)
        stores = [os.path.realpath(p) for p in (constants.HF_HUB_CACHE,
                                                os.path.join(roctune_home(), "models", DEFAULT_MODEL))]
        return any(os.path.commonpath([s, real]) == s for s in stores)

    def take_upload(self, tmp: str) -> str:
        """Copy a data file uploaded through the page into <root>/uploads (never over an existing file)."""
        if not tmp or not os.path.isfile(tmp):
            raise ConfigError(t("the upload did not arrive; try again"))
        if not tmp.lower().endswith(UPLOAD_SUFFIXES):
            raise ConfigError(f"upload {os.path.basename(tmp)}: the page takes data files only "
                              f"({', '.join(UPLOAD_SUFFIXES)}); copy other files into the workspace yourself")
        folder = os.path.join(self.root, "uploads")
        os.makedirs(folder, exist_ok=True)
        stem, ext = os.path.splitext(os.path.basename(tmp))
        dest, n = os.path.join(folder, stem + ext), 1
        while os.path.lexists(dest):
            dest, n = os.path.join(folder, f"{stem}-{n}{ext}"), n + 1
        shutil.copyfile(tmp, dest)
        return dest
