"""`roctune models pull` against a local server that speaks the Hugging Face hub's HTTP layout (the repo info with
its file list, sizes and hashes, the tree API, and /resolve/ with Content-Length and Range), with
HF_ENDPOINT=http://127.0.0.1:PORT; and ModelScope's (its file list and ?FilePath= downloads,
MODELSCOPE_ENDPOINT=http://127.0.0.1:PORT), which needs no modelscope package. The pulls run as the CLI, in a
subprocess: huggingface_hub reads HF_HUB_OFFLINE (which conftest sets) once, at import."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote

import pytest

from conftest import REPO, build_tiny_llama

REPO_ID = "tiny-org/tiny-llama"
SHA = "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = "model.safetensors"


class Hub:
    """A model repository served the way huggingface.co serves one (and ModelScope, below); `drop_once` cuts the
    first download of the weights near its end (the connection closes), `fail_weights` answers 500 for them;
    `requests` records (method, file, Range header).

    A hostile hub's knobs (tests/test_hub_hostile.py): `sha` is the commit its answers name; `answer` replaces the
    repository's answer (repo info, tree and ModelScope's file list) with these bytes; `listed` edits the file list
    it gives (a list of [name, size] pairs, the hub's own files by default); `drip` sends the named file's first
    `drip_after` bytes at once and then one byte every `drip` seconds (`drip_answer`: the repo answer the same way)."""

    def __init__(self, folder: str):
        self.files = {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))
                      if os.path.isfile(os.path.join(folder, n))}
        self.files["pytorch_model.bin"] = b"a pickle roctune must never fetch"
        self.drop_once = False
        self.fail_weights = False
        self.sha = SHA
        self.answer: bytes | None = None
        self.listed = None  # a function: [[name, size], ...] -> the same, edited
        self.drip: dict[str, float] = {}
        self.drip_after = 0
        self.drip_answer = 0.0
        self.requests: list[tuple[str, str, str | None]] = []
        self.sent: dict[str, int] = {}  # bytes of each file sent so far (a dripped one included)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub.serve(self, body=False)

            def do_GET(self):
                hub.serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def __enter__(self) -> "Hub":
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def entries(self) -> list[list]:
        """The file list this hub gives: [name, size] pairs."""
        pairs = [[n, len(d)] for n, d in self.files.items()]
        return self.listed(pairs) if self.listed else pairs

    def digest(self, name: str, kind: str) -> str:
        data = self.files.get(name, b"")
        if kind == "sha256":
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id

    def repo_answer(self, kind: str) -> bytes:
        """The repository's file list in the layout `kind` asks for (hf-info, hf-tree, modelscope)."""
        if self.answer is not None:
            return self.answer
        rows = self.entries()
        if kind == "modelscope":
            files = [{"Path": n, "Name": n.rsplit("/", 1)[-1], "Type": "blob", "Size": s,
                      "Sha256": self.digest(n, "sha256")} for n, s in rows]
            return json.dumps({"Code": 200, "Data": {"Files": files}, "Success": True}).encode()
        if kind == "hf-tree":
            return json.dumps([{"type": "file", "path": n, "size": s, "oid": self.digest(n, "git")}
                               for n, s in rows]).encode()
        siblings = [{"rfilename": n, "size": s, "blobId": self.digest(n, "git")} for n, s in rows]
        for row in siblings:
            if row["rfilename"].endswith(".safetensors"):
                row["lfs"] = {"sha256": self.digest(row["rfilename"], "sha256"), "size": row["size"],
                              "pointerSize": 134}
        return json.dumps({"id": REPO_ID, "sha": self.sha, "private": False, "siblings": siblings}).encode()

    def serve(self, h, body: bool) -> None:
        path, _, query = h.path.partition("?")
        path = unquote(path)
        api, resolve = f"/api/models/{REPO_ID}/", f"/{REPO_ID}/resolve/"
        modelscope = f"/api/v1/models/{REPO_ID}/repo"  # ModelScope's layout: the file list, then ?FilePath=NAME
        if path == modelscope + "/files":
            return self.send_answer(h, self.repo_answer("modelscope"), body)
        name = parse_qs(query).get("FilePath", [""])[0]
        if path == modelscope and name in self.files:
            self.requests.append((h.command, name, h.headers.get("Range")))
            return self.send_file(h, name, body)
        if path.startswith(api + "revision/"):
            return self.send_answer(h, self.repo_answer("hf-info"), body)
        if path.startswith(api + "tree/"):
            return self.send_answer(h, self.repo_answer("hf-tree"), body)
        if path.startswith(resolve) and path.split("/")[-1] in self.files:
            name = path.split("/")[-1]
            self.requests.append((h.command, name, h.headers.get("Range")))
            return self.send_file(h, name, body)
        self.send(h, 404, b'{"error": "Repository not found"}', body, {"X-Error-Code": "RepoNotFound"})

    def send_answer(self, h, data: bytes, body: bool) -> None:
        if self.drip_answer and body:
            return self.send_slowly(h, 200, data, {}, 0, self.drip_answer, "answer")
        self.send(h, 200, data, body)

    def send_file(self, h, name: str, body: bool) -> None:
        data = self.files[name]
        headers = {"X-Repo-Commit": self.sha, "ETag": f'"{hashlib.sha256(data).hexdigest()}"', "Accept-Ranges": "bytes"}
        if name == WEIGHTS and body and self.fail_weights:
            return self.send(h, 500, b"server error", body)
        start = int(h.headers["Range"].split("=")[1].split("-")[0]) if body and h.headers.get("Range") else 0
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if name in self.drip and body:
            return self.send_slowly(h, 206 if start else 200, data[start:], headers, self.drip_after, self.drip[name],
                                    name)
        if name == WEIGHTS and body and self.drop_once and not start:
            self.drop_once = False
            h.send_response(200)
            for k, v in {**headers, "Content-Length": str(len(data))}.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data[:len(data) - 1000])  # past huggingface_hub's first 10 MiB chunk: it keeps that
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send(h, 206 if start else 200, data[start:], body, headers)

    def send_slowly(self, h, status: int, data: bytes, headers: dict, quick: int, every: float, name: str) -> None:
        """`quick` bytes at once, then one byte each `every` seconds, until the client hangs up or the test ends."""
        h.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(data))}.items():
            h.send_header(k, v)
        h.end_headers()
        h.close_connection = True
        try:
            h.wfile.write(data[:quick])
            h.wfile.flush()
            self.sent[name] = self.sent.get(name, 0) + quick
            for i in range(quick, len(data) - 1):  # never the last byte: the transfer never ends by itself
                time.sleep(every)
                h.wfile.write(data[i:i + 1])
                h.wfile.flush()
                self.sent[name] += 1
        except OSError:  # the client hung up
            pass

    @staticmethod
    def send(h, status: int, data: bytes, body: bool, headers: dict | None = None) -> None:
        h.send_response(status)
        for k, v in {**(headers or {}), "Content-Length": str(len(data))}.items():
            h.send_header(k, v)
        h.end_headers()
        if body:
            h.wfile.write(data)


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory, default_model_dir) -> str:
    return build_tiny_llama(str(tmp_path_factory.mktemp("hub-repo")), default_model_dir, heads=4, kv_heads=2)


@pytest.fixture
def hub(tiny_repo):
    with Hub(tiny_repo) as served:
        yield served


def roctune(home: str, *args: str, endpoint: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "ROCTUNE_HUB"}
    environment = {**environment, "PYTHONPATH": os.pathsep.join(filter(None, (REPO, os.environ.get("PYTHONPATH")))), "ROCTUNE_HOME": home, "HF_ENDPOINT": endpoint,
                   "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HOME": os.path.join(home, "hf"),
                   "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, "-m", "roctune", *args], env=environment, capture_output=True, text=True,
                          timeout=300)


def test_pull_lands_resumes_a_dropped_connection_and_loads(hub, tiny_repo, tmp_path, monkeypatch):
    hub.drop_once = True
    home = str(tmp_path / "home")
    r = roctune(home, "models", "pull", REPO_ID, endpoint=hub.url)
    assert r.returncode == 0, r.stderr
    folder = os.path.join(home, "models", "tiny-org--tiny-llama")
    assert folder in r.stdout
    with open(os.path.join(folder, WEIGHTS), "rb") as f:
        assert f.read() == hub.files[WEIGHTS]  # byte-equal after the dropped connection
    ranges = [rng for method, name, rng in hub.requests if method == "GET" and name == WEIGHTS]
    assert len(ranges) == 2 and ranges[0] is None, ranges
    assert ranges[1] == f"bytes={len(hub.files[WEIGHTS]) - 1000}-"  # the second request asked only for the rest
    assert not os.path.exists(os.path.join(folder, "pytorch_model.bin"))  # never a pickle
    assert not any(name == "pytorch_model.bin" for _, name, _ in hub.requests)

    listed = roctune(home, "models", "list", endpoint="http://127.0.0.1:9")
    line = next(ln for ln in listed.stdout.splitlines() if ln.startswith(REPO_ID))
    assert " yes " in line and line.endswith(folder)
    assert any(ln.startswith("Qwen/Qwen2.5-0.5B-Instruct") and " no " in ln for ln in listed.stdout.splitlines())

    monkeypatch.setenv("ROCTUNE_HOME", home)  # the pulled id resolves to its folder with the hub offline
    from roctune.models import load_model, load_tokenizer, resolve_model

    assert resolve_model(REPO_ID) == folder
    import torch

    model, tok = load_model(resolve_model(REPO_ID)), load_tokenizer(REPO_ID)
    reference = load_model(tiny_repo)
    ids = tok("hello there", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)


def test_a_stopped_pull_is_not_a_model_and_the_next_pull_completes_it(hub, tmp_path, monkeypatch):
    hub.fail_weights = True
    home = str(tmp_path / "home")
    r = roctune(home, "models", "pull", REPO_ID, endpoint=hub.url)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    folder = os.path.join(home, "models", "tiny-org--tiny-llama")
    assert not os.path.exists(os.path.join(folder, WEIGHTS))  # no partial weights under the final name
    monkeypatch.setenv("ROCTUNE_HOME", home)
    from roctune.errors import ModelError
    from roctune.models import pulled_dir, resolve_model

    assert pulled_dir(REPO_ID) is None
    with pytest.raises(ModelError):  # the half-pulled folder is not taken for the model
        resolve_model(REPO_ID)
    assert os.path.isfile(os.path.join(folder, "config.json"))  # a file it did get...
    with pytest.raises(ModelError, match="has not finished"):  # ...is no model folder to pass as --model
        resolve_model(folder)
    from roctune.webui import picks
    from roctune.webui.workspace import Workspace

    assert folder not in picks.models(Workspace(str(tmp_path)))  # nor one the web UI offers
    assert "tiny-org/tiny-llama  " not in roctune(home, "models", "list", endpoint=hub.url).stdout.replace(" no ", "")

    offline = roctune(home, "models", "pull", REPO_ID, endpoint="http://127.0.0.1:9")  # the partial folder on disk
    assert offline.returncode != 0 and "cannot be reached" in offline.stderr  # is not handed back as the model
    assert pulled_dir(REPO_ID) is None and os.path.isfile(os.path.join(folder, "config.json"))

    hub.fail_weights = False
    again = roctune(home, "models", "pull", REPO_ID, endpoint=hub.url)
    assert again.returncode == 0, again.stderr
    assert pulled_dir(REPO_ID) == folder
    gets = [name for method, name, _ in hub.requests if method == "GET"]
    assert gets.count("config.json") == 1  # a file the first pull finished is not fetched again
    assert gets.count(WEIGHTS) == 2


def test_unreachable_hub_is_one_line_with_the_mirror_and_nothing_counts_as_downloaded(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = str(tmp_path / "home")
    r = roctune(home, "models", "pull", "Qwen/Qwen2.5-0.5B-Instruct", endpoint=f"http://127.0.0.1:{port}")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "cannot be reached" in lines[0] and "HF_ENDPOINT=https://hf-mirror.com" in lines[0]
    assert "ROCTUNE_HUB=modelscope" in lines[0] and "--model /path" in lines[0]
    assert not os.path.exists(os.path.join(home, "models", "Qwen--Qwen2.5-0.5B-Instruct"))  # nothing left behind


def test_unknown_repository_and_bad_id_are_one_line(hub, tmp_path):
    home = str(tmp_path / "home")
    r = roctune(home, "models", "pull", "tiny-org/no-such-model", endpoint=hub.url)
    assert r.returncode != 0 and "no such model" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    bad = roctune(home, "models", "pull", "../evil", endpoint=hub.url)
    assert bad.returncode != 0 and "not a hub id" in bad.stderr
    assert not os.path.exists(os.path.join(home, "models"))  # neither pull wrote anything


def without_modelscope(tmp_path) -> str:
    """A PYTHONPATH on which the modelscope package, installed or not, cannot be imported."""
    hide = tmp_path / "hide" / "modelscope"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    return os.pathsep.join((str(tmp_path / "hide"), REPO))


def test_modelscope_pull_lands_resumes_and_counts_as_the_same_model(hub, tmp_path):
    """roctune's own ModelScope client: no modelscope package needed."""
    hub.drop_once = True
    home = str(tmp_path / "home")
    r = roctune(home, "models", "pull", f"modelscope:{REPO_ID}", endpoint="http://127.0.0.1:9",
                MODELSCOPE_ENDPOINT=hub.url, PYTHONPATH=without_modelscope(tmp_path))
    assert r.returncode == 0, r.stderr
    folder = os.path.join(home, "models", "tiny-org--tiny-llama")
    with open(os.path.join(folder, WEIGHTS), "rb") as f:
        assert f.read() == hub.files[WEIGHTS]
    ranges = [rng for method, name, rng in hub.requests if method == "GET" and name == WEIGHTS]
    assert ranges[0] is None and any(rng and rng.startswith("bytes=") and not rng.startswith("bytes=0-")
                                     for rng in ranges[1:]), ranges
    assert not any(name == "pytorch_model.bin" for _, name, _ in hub.requests)
    with open(os.path.join(folder, "roctune_pulled.json"), encoding="utf-8") as f:
        assert json.load(f)["hub"] == "modelscope"
    again = roctune(home, "models", "pull", REPO_ID, endpoint="http://127.0.0.1:9")  # no network needed now
    assert again.returncode == 0 and "already downloaded" in again.stdout


def test_modelscope_unreachable_is_one_line(tmp_path):
    r = roctune(str(tmp_path), "models", "pull", REPO_ID, endpoint="http://127.0.0.1:9", ROCTUNE_HUB="modelscope",
                MODELSCOPE_ENDPOINT="http://127.0.0.1:9")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "http://127.0.0.1:9: the model hub cannot be reached" in r.stderr and "--model /path" in r.stderr


def test_pull_reports_byte_progress_to_a_callback(hub, tmp_path):
    """The library's progress hook (for the web UI): bytes done and known, ending at the bytes of the files pulled."""
    code = ("import json; from roctune.hub import pull; seen = []; "
            f"pull({REPO_ID!r}, progress=lambda done, total: seen.append((done, total))); print(json.dumps(seen))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": REPO, "ROCTUNE_HOME": str(tmp_path), "HF_ENDPOINT": hub.url,
                            "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    pulled = sum(len(d) for n, d in hub.files.items() if n != "pytorch_model.bin")
    assert seen[-1] == [pulled, pulled] and all(a <= b for (a, _), (b, _) in zip(seen, seen[1:]))


def test_the_catalog_lists_only_supported_families_with_the_tutorials_models_first():
    from roctune.catalog import CATALOG
    from roctune.families import FAMILIES

    known = {f.name for f in FAMILIES}
    assert all(m.family in known for m in CATALOG), [m.id for m in CATALOG if m.family not in known]
    assert [m.id for m in CATALOG[:4]] == [f"Qwen/Qwen2.5-{s}-Instruct" for s in ("0.5B", "1.5B", "3B", "7B")]
    assert len({m.id.lower() for m in CATALOG}) == len(CATALOG)
