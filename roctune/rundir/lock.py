"""Claiming an output folder for one run: its lock file (flock, beside the folder), and for --overwrite of an
existing run the staging folder the new run is built in and swapped in only once complete."""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager, suppress
from typing import Iterator

from roctune.errors import ConfigError
from roctune.rundir.layout import foreign_entries, is_run_dir
from roctune.rundir.output import check_new_output, clear_unsaved_run, is_unsaved_ended_run
from roctune.rundir.run_yaml import read_run, write_run

STAGING_PREFIX = ".tmp-overwrite-"


def _sibling(path: str, prefix: str, suffix: str = "") -> str:
    path = os.path.abspath(path)
    return os.path.join(os.path.dirname(path), f"{prefix}{os.path.basename(path)}{suffix}")


def lock_path(output: str) -> str:
    """The lock file of a run folder: beside it (`.NAME.roctune-lock`), so a run folder holds only run files."""
    return _sibling(output, ".", ".roctune-lock")


@contextmanager
def locked(output: str) -> Iterator[None]:
    """Hold the run folder's lock for the block; another process holding it is refused with its pid.

    flock, not a pid file: the kernel releases the lock when its holder dies in any way, so a stale lock file
    (a killed run) is simply taken over. The file is removed on release; a process that opened it just before is
    told by the inode check that it locked a removed file, and tries again."""
    import fcntl

    path = lock_path(output)
    while True:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"--output {output}: cannot write in {os.path.dirname(path)} ({e.strerror}); choose "
                              "another --output") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise ConfigError(f"--output {output}: another roctune process (pid {holder}) is writing this run; "
                              "wait for it to finish, or choose another --output") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        with suppress(FileNotFoundError):  # removed by hand meanwhile: nothing left to release
            os.unlink(path)
        os.close(fd)


def staging_path(output: str) -> str:
    """Where `--overwrite` builds the new run: a hidden folder beside the old one."""
    return _sibling(output, STAGING_PREFIX)


def replaces_run(output: str, resume: bool, overwrite: bool) -> bool:
    """True when this run is built beside an existing run that it replaces when complete (--overwrite)."""
    return overwrite and not resume and is_run_dir(output)


def _exchange(a: str, b: str) -> None:
    """Swap two folders in one step (Linux renameat2 RENAME_EXCHANGE): at every moment one complete run is at
    each name. Where the file system cannot (EINVAL), two renames, with a window of a few microseconds."""
    import ctypes
    import errno

    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    fn = getattr(libc, "renameat2", None)
    if fn is not None and fn(at_fdcwd, a.encode(), at_fdcwd, b.encode(), rename_exchange) == 0:
        return
    if fn is not None and ctypes.get_errno() not in (errno.EINVAL, errno.ENOSYS):
        raise OSError(ctypes.get_errno(), f"cannot swap {a} and {b}")
    aside = _sibling(b, ".old-")
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def remove_staging(output: str) -> None:
    """Remove the staging folder an interrupted --overwrite left beside `output` (it holds only run files)."""
    path = staging_path(output)
    if os.path.isdir(path) and not foreign_entries(path):
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def claim(output: str, resume: bool, overwrite: bool) -> Iterator[str]:
    """Own `output` for one run: its lock is held, the checks of check_new_output are made again under it (another
    run may have finished into it meanwhile), and the block gets the folder to write into. For --overwrite of an
    existing run that is a staging folder beside it, swapped in only when the block completes: a run interrupted
    at any moment (Ctrl-C, SIGTERM, a full disk, an exception) leaves the old run as it was; the staging folder is
    removed (after SIGKILL, at the next start)."""
    with locked(output):
        check_new_output(output, resume, overwrite)
        if not resume and is_unsaved_ended_run(output):
            clear_unsaved_run(output)
        remove_staging(output)
        if not replaces_run(output, resume, overwrite):
            yield output
            return
        staging = staging_path(output)
        try:
            yield staging
            _point_run_yaml_at(staging, output)
            _exchange(staging, output)
        finally:
            remove_staging(output)  # the new run when interrupted, the old one after the swap


def _point_run_yaml_at(staging: str, output: str) -> None:
    """run.yaml of the staged run names the folder it will live in."""
    if is_run_dir(staging):
        doc = read_run(staging)
        doc["config"]["output"] = output
        write_run(staging, doc)
