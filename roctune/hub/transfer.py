"""HTTP for the hub clients, with limits on everything: a connection and a whole answer get ROCTUNE_HUB_TIMEOUT
seconds, a file transfer that brings less than STALL_BYTES in ROCTUNE_HUB_STALL seconds has stalled (a hub that
drips one byte at a time never times out a socket), an answer is at most answers.MAX_ANSWER_BYTES, and a file is
never read past the size its hub listed. A file arrives in <folder>/PARTIAL/<name>.part, is checked against the
hub's size and hash, and only then moved to its name; a dropped connection is resumed with a Range request, and
so is a part left by a pull that stopped (Ctrl-C, SIGTERM, a stall).

Own code on the standard library's urllib rather than huggingface_hub's snapshot_download or modelscope's: both
turn the hub's answers into paths before anything checks them (a commit id became a cache file name outside the
model folder), neither limits a dripping transfer, and their worker threads keep a pull going after Ctrl-C. Here
the transfer runs in the calling thread, so Ctrl-C and SIGTERM (roctune.interrupts) stop it at once; a caller in
another thread (the web UI) stops it with a `cancel` event, checked at every chunk."""
from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass

from roctune import interrupts
from roctune.errors import ConfigError, ModelError
from roctune.hub.answers import MAX_ANSWER_BYTES, RemoteFile, refused
from roctune.hub.store import PARTIAL

STALL_BYTES = 64 << 10  # a transfer must bring this much (or finish its file) in every stall window
CHUNK = 1 << 20  # the most one read takes from the socket
# (variable, default seconds, what it limits)
LIMITS = (("ROCTUNE_HUB_TIMEOUT", 30.0, "a connection to the hub and each whole answer from it"),
          ("ROCTUNE_HUB_STALL", 60.0, "a file transfer that brings less than 64 KiB"))


@dataclass(frozen=True)
class Limits:
    timeout: float
    stall: float


def limits() -> Limits:
    """The limits from the environment (checked: a positive number of seconds up to a day)."""
    values = []
    for name, default, _ in LIMITS:
        text = os.environ.get(name, "").strip()
        try:
            value = float(text) if text else default
        except ValueError:
            value = math.nan
        if not 0 < value <= 86400:
            raise ConfigError(f"{name}={text}: not a number of seconds between 0 and 86400; unset it for the "
                              f"default ({default:g} s)")
        values.append(value)
    return Limits(*values)


class Status(Exception):
    """An HTTP error status from the hub, for its source to say what it means (gated, no such model, ...)."""

    def __init__(self, code: int, headers, url: str):
        super().__init__(f"HTTP {code}")
        self.code, self.headers, self.url = code, headers, url


class Stopped(ModelError):
    """The download was stopped from another thread (the web UI's page went away)."""


def unreachable(where: str, reason: str, hint: str) -> ModelError:
    return ModelError(f"{where}: the model hub cannot be reached ({reason}); {hint}", exit_code=1)


def _opener():
    """urllib with http and https only (no file:, ftp: or data: a redirect could point at), the environment's
    proxies, and certifi's certificates besides the system's where certifi is installed."""
    import ssl
    import urllib.request

    context = ssl.create_default_context()
    try:
        import certifi

        context.load_verify_locations(certifi.where())
    except (ImportError, OSError):
        pass
    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(), urllib.request.HTTPHandler(),
                    urllib.request.HTTPSHandler(context=context), urllib.request.HTTPRedirectHandler(),
                    urllib.request.HTTPDefaultErrorHandler(), urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener


class Client:
    """Requests to one hub: `headers` go with every request, `auth` only to the hub itself (never after a redirect
    to another server); `hint` ends every "cannot be reached" line."""

    def __init__(self, endpoint: str, hint: str, auth: dict | None = None, cancel=None):
        self.endpoint, self.hint, self.auth, self.cancel = endpoint, hint, auth or {}, cancel
        self.limits = limits()
        self.opener = _opener()

    def open(self, url: str, headers: dict, timeout: float, limit: str = "ROCTUNE_HUB_TIMEOUT"):
        import http.client
        import urllib.error
        import urllib.request

        request = urllib.request.Request(url, headers={"User-Agent": "roctune", **headers})
        for key, value in self.auth.items():
            request.add_unredirected_header(key, value)
        try:
            return self.opener.open(request, timeout=timeout)
        except urllib.error.HTTPError as e:
            e.close()
            raise Status(e.code, e.headers, url) from None
        except TimeoutError:
            raise unreachable(self.endpoint, f"no answer in {timeout:g} s ({limit})", self.hint) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
            reason = getattr(e, "reason", None) or e
            raise unreachable(self.endpoint, f"{type(reason).__name__}: {str(reason)[:120]}", self.hint) from None

    def check(self) -> None:
        interrupts.check()  # a stop signal whose KeyboardInterrupt a library swallowed
        if self.cancel is not None and self.cancel.is_set():
            raise Stopped("the download was stopped; run it again to resume it")

    def answer(self, url: str) -> bytes:
        """The whole body of a JSON answer: at most MAX_ANSWER_BYTES, within ROCTUNE_HUB_TIMEOUT."""
        import http.client

        timeout = self.limits.timeout
        deadline = time.monotonic() + timeout
        data = bytearray()
        try:
            with self.open(url, {}, timeout) as response:
                while chunk := response.read1(CHUNK):
                    data += chunk
                    self.check()
                    if len(data) > MAX_ANSWER_BYTES:
                        raise refused(url, f"is larger than {MAX_ANSWER_BYTES >> 20} MiB")
                    if time.monotonic() > deadline:
                        raise TimeoutError
        except (OSError, http.client.HTTPException) as e:  # a timeout, a reset, a malformed chunk
            what = (f"did not end within {timeout:g} s (ROCTUNE_HUB_TIMEOUT)" if isinstance(e, TimeoutError) else
                    f"was cut off ({type(e).__name__})")
            raise unreachable(self.endpoint, f"its answer {what}", self.hint) from None
        return bytes(data)

    def file(self, url: str, remote: RemoteFile, folder: str, progress) -> None:
        """`remote` into folder/<name>: resumed from its part, checked against the listed size and hash, moved in
        last. `progress(n)` gets every n bytes that arrive (negative when a hub restarts a file from its start)."""
        part = os.path.join(folder, PARTIAL, remote.name + ".part")
        os.makedirs(os.path.dirname(part), exist_ok=True)
        digest = Digest(remote)
        with open(part, "ab+") as out:
            if out.tell() > remote.size:
                out.truncate(0)
            out.seek(0)
            while block := out.read(CHUNK):
                digest.update(block)
            progress(out.tell())
            watch, fruitless = Stall(self.limits.stall, remote.name, self), 0
            while out.tell() < remote.size:
                before = out.tell()
                self._attempt(url, remote, out, digest, watch, progress)
                fruitless = 0 if out.tell() > before else fruitless + 1
                if fruitless >= 3:
                    raise unreachable(self.endpoint, f"the transfer of {remote.name} broke off 3 times without a "
                                                     "byte", self.hint)
        if not digest.matches():
            os.remove(part)
            raise refused(url, f"has bytes that do not match the hash the file list gives for {remote.name}",
                          "removed them, the pull stopped")
        target = os.path.join(folder, remote.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(part, target)

    def _attempt(self, url: str, remote: RemoteFile, out, digest: "Digest", watch: "Stall", progress) -> None:
        """One request for the rest of `remote`; returns when it ends (complete, or the connection dropped)."""
        import http.client

        have = out.tell()
        try:
            with self.open(url, {"Range": f"bytes={have}-"} if have else {}, self.limits.stall,
                           "ROCTUNE_HUB_STALL") as response:
                if have and response.status == 200:  # the hub ignores Range: start the file again
                    progress(-have)
                    out.truncate(0)
                    out.seek(0)
                    digest.reset()
                    have = 0
                self._check_range(url, remote, response, have)
                while have < remote.size:
                    chunk = response.read1(min(CHUNK, remote.size - have))
                    if not chunk:
                        return  # the connection dropped: the next attempt resumes
                    out.write(chunk)
                    digest.update(chunk)
                    have += len(chunk)
                    progress(len(chunk))
                    self.check()
                    watch.add(len(chunk), remote.size - have)
        except TimeoutError:
            raise watch.stalled() from None
        except (OSError, http.client.HTTPException):
            return  # reset by the peer, an incomplete read: resumed by the next attempt (Stall ends a loop of them)
        finally:
            out.flush()

    def _check_range(self, url: str, remote: RemoteFile, response, have: int) -> None:
        """The answer carries the bytes asked for: from `have` (a 206's Content-Range), up to the listed size."""
        if response.status not in (200, 206):
            raise unreachable(self.endpoint, f"HTTP {response.status} for {remote.name}", self.hint)
        start = 0
        if response.status == 206:
            text = response.headers.get("Content-Range", "")
            try:
                start = int(text.split()[1].split("-")[0])
            except (IndexError, ValueError):
                start = -1
        length = response.headers.get("Content-Length")
        if start != have or length is not None and (not length.isdigit() or int(length) != remote.size - have):
            raise refused(url, f"sends {remote.name} from byte {start}, {length} bytes long, where the file list "
                               f"says {remote.size} bytes and {have} are here", "the pull stopped")


class Stall:
    """Each window of `seconds` must bring STALL_BYTES, or the rest of the file; else the transfer has stalled."""

    def __init__(self, seconds: float, name: str, client: Client):
        self.seconds, self.name, self.client = seconds, name, client
        self.since, self.got = time.monotonic(), 0

    def add(self, n: int, remaining: int) -> None:
        self.got += n
        if self.got >= STALL_BYTES or remaining == 0:
            self.since, self.got = time.monotonic(), 0
        elif time.monotonic() - self.since > self.seconds:
            raise self.stalled()

    def stalled(self) -> ModelError:
        return ModelError(f"{self.client.endpoint}: the transfer of {self.name} stalled (less than "
                          f"{STALL_BYTES >> 10} KiB in {self.seconds:g} s, ROCTUNE_HUB_STALL); run the pull again to "
                          f"resume it, or {self.client.hint}", exit_code=1)


class Digest:
    """The hash a hub lists for a file: SHA-256 of the content, or git's blob id (SHA-1 of a header and the
    content); a file listed without one is checked by its size only."""

    def __init__(self, remote: RemoteFile):
        self.remote = remote
        self.reset()

    def reset(self) -> None:
        r = self.remote
        self.hash = hashlib.sha256() if r.sha256 else hashlib.sha1(b"blob %d\0" % r.size) if r.git_blob else None

    def update(self, data: bytes) -> None:
        if self.hash is not None:
            self.hash.update(data)

    def matches(self) -> bool:
        return self.hash is None or self.hash.hexdigest() == (self.remote.sha256 or self.remote.git_blob)
