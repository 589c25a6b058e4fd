"""Atomic writes: every file and folder of a run is written under a temporary name beside its target and renamed
into place, so an interrupted write never leaves a half-written file where a finished one is expected; what a killed
writer left behind is removed later by name."""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Callable, Iterator

log = logging.getLogger(__name__)


@contextmanager
def atomic_path(path: str, prefix: str = ".tmp-") -> Iterator[str]:
    """A temporary path beside `path`, renamed over `path` (keeping an existing file's mode) only if the block
    succeeds; removed otherwise."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, new_file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def new_file_mode(path: str) -> int:
    """The mode a file written in place of `path` should get: the existing file's own (replacing a file never
    changes who may read it), else what open() would give a new file under the umask. mkstemp's 0600 is right
    for the temporary file, not for what the user finds afterwards."""
    import stat

    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_dir_atomically(target: str, fill: Callable[[str], None]) -> None:
    """Fill a temporary folder beside `target` with `fill(tmp)`, then put it in place of `target`. An existing
    `target` is moved aside first and deleted only after the new one is in place, so a killed write leaves
    either the old or the new folder, and the temporary folder is removed on any error. The temporary names carry
    the target's name and the writer's pid (`.tmp-NAME.PID-xxxx`): what a killed writer left is removed by the
    next write of the same target (remove_stale_temps). A missing parent folder is made (`--output a/b`)."""
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    remove_stale_temps(target)
    mine = f"{os.path.basename(os.path.abspath(target))}.{os.getpid()}-"
    tmp = tempfile.mkdtemp(prefix=".tmp-" + mine, dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes a private 0700 folder; the result gets the usual mode
    old = None
    try:
        fill(tmp)
        if os.path.isdir(target):
            old = tempfile.mkdtemp(prefix=".old-" + mine, dir=parent)
            os.rmdir(old)
            os.rename(target, old)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old:
            shutil.rmtree(old, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_temps(target: str) -> list[str]:
    """Remove the `.tmp-NAME.PID-*` / `.old-NAME.PID-*` folders beside `target` whose writer is no longer running
    (a merge or export killed by SIGKILL or a power cut). Returns what was removed."""
    parent, name = os.path.split(os.path.abspath(target))
    removed = []
    for entry in os.listdir(parent) if os.path.isdir(parent) else []:
        for prefix in (".tmp-", ".old-"):
            rest = entry[len(prefix):] if entry.startswith(prefix + name + ".") else ""
            pid = rest[len(name) + 1:].split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)) and os.path.isdir(os.path.join(parent, entry)):
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
                removed.append(entry)
    if removed:
        log.info("removed %d folder(s) an interrupted write of %s left: %s", len(removed), target, ", ".join(removed))
    return removed


def move_files_into(src_dir: str, out_dir: str, last: str | None = None) -> None:
    """Move every file of a finished folder into `out_dir` (each one a rename); `last` (a file name) goes in after
    all the others, so its presence says the whole set arrived."""
    names = sorted(os.listdir(src_dir), key=lambda name: name == last)
    for name in names:
        os.replace(os.path.join(src_dir, name), os.path.join(out_dir, name))


def remove_leftovers(run_dir: str) -> None:
    """Delete temporary folders an interrupted write left in `run_dir` (only roctune's own `.tmp-`/`.old-` names)."""
    for name in os.listdir(run_dir) if os.path.isdir(run_dir) else []:
        if name.startswith((".tmp-", ".old-")):
            path = os.path.join(run_dir, name)
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.unlink(path)
