"""The workspace root: the one folder the web UI reads and writes in.

The page has no login of its own and every handler can be called over Gradio's HTTP API, so a path typed into
the page (data, run and adapter directories, merge and scrub outputs, a local model) is resolved, symlinks and
`..` included, and refused unless it lies inside the root (`roctune webui --root DIR`, default: the folder the
server was started in). Handlers then use the resolved path, never the text they were given.
"""
from __future__ import annotations

import os
import shutil

from roctune.errors import ConfigError


class Workspace:
    def __init__(self, root: str | None = None):
        self.root = os.path.realpath(root or os.getcwd())
        if not os.path.isdir(self.root):
            raise ConfigError(f"--root {root}: no such directory")

    def contains(self, real: str) -> bool:
        return os.path.commonpath([self.root, real]) == self.root

    def path(self, text: str, what: str, write: bool = False) -> str:
        """`text` (relative to the root, or absolute) resolved; refused outside the root, and for `write` the root
        itself is refused too (an --overwrite there would replace the whole workspace)."""
        text = (text or "").strip()
        if not text:
            raise ConfigError(f"{what}: no path given")
        real = os.path.realpath(os.path.join(self.root, os.path.expanduser(text)))
        if not self.contains(real):
            raise ConfigError(f"{what} {text}: outside the workspace {self.root}; the web UI reads and writes only "
                              "inside it (start it with roctune webui --root DIR to choose another)")
        if write and real == self.root:
            raise ConfigError(f"{what} {text}: is the workspace {self.root} itself; choose a folder inside it")
        return real

    def data(self, specs: list[str], what: str = "--data") -> list[str]:
        """Dataset paths resolved; `DIR:name` (a LLaMA-Factory data directory) keeps its `:name`."""
        out = []
        for spec in specs:
            directory, sep, names = spec.rpartition(":")
            if sep and directory and not os.path.exists(os.path.join(self.root, spec)):
                out.append(self.path(directory, what) + ":" + names)
            else:
                out.append(self.path(spec, what))
        return out

    def model(self, text: str | None, what: str = "--model") -> str | None:
        """A local model directory is checked like any path; a hub id (org/name, not a folder here) is kept."""
        text = (text or "").strip()
        if not text:
            return None
        local = (os.path.isabs(text) or text.startswith((".", "~"))
                 or os.path.lexists(os.path.join(self.root, text)))
        return self.path(text, what) if local else text

    def take_upload(self, tmp: str) -> str:
        """Copy a file uploaded through the page into <root>/uploads (never over an existing file)."""
        if not tmp or not os.path.isfile(tmp):
            raise ConfigError("the upload did not arrive; try again")
        folder = os.path.join(self.root, "uploads")
        os.makedirs(folder, exist_ok=True)
        stem, ext = os.path.splitext(os.path.basename(tmp))
        dest, n = os.path.join(folder, stem + ext), 1
        while os.path.lexists(dest):
            dest, n = os.path.join(folder, f"{stem}-{n}{ext}"), n + 1
        shutil.copyfile(tmp, dest)
        return dest
