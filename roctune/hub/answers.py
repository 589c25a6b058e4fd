"""The border with a model hub: every answer a hub gives is checked here, once, into a typed Listing before
anything is written. A hub's answer is treated as hostile: the commit id must be 40 hex digits (huggingface_hub
makes it a cache path), a file name relative without `..`, absolute parts, backslashes or control characters
(it becomes a path in the model folder), a size a whole number up to MAX_FILE_BYTES, a hash hex of its length, and
the JSON of the shape the hub documents. A refusal is one ModelError naming what the hub said.

Which files are fetched is decided here too (`wanted`): exactly the files a model folder is loaded from, at its top
level, never a pickle, and the model's own code (*.py) only with --trust-remote-code."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from roctune.errors import ModelError

MAX_ANSWER_BYTES = 32 << 20  # a repository's file list: Qwen2.5-72B's (with blobs) is about 10 kB
MAX_FILE_BYTES = 1 << 40  # 1 TiB: the largest safetensors shard published is far below; 10^15 bytes is no file
COMMIT = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
# What a model folder is loaded from (transformers' file names; roctune.models loads nothing else), at its top
# level: config, safetensors weights (one file or numbered shards and their index), tokenizer (JSON, SentencePiece,
# BPE vocabulary and merges, tiktoken ranks), chat template, and the processor files of a vision model.
LOADED_FILES = frozenset({
    "config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "tokenizer.model",
    "vocab.json", "merges.txt", "vocab.txt", "chat_template.jinja", "chat_template.json",
    "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json"})
LOADED_PATTERN = re.compile(r"model-\d{5}-of-\d{5}\.safetensors|[\w.-]+\.tiktoken")
CODE_PATTERN = re.compile(r"[A-Za-z_][\w.-]*\.py")  # a repository's own code: only with --trust-remote-code


@dataclass(frozen=True)
class RemoteFile:
    name: str  # relative, "/"-separated, checked by `file_name`
    size: int
    sha256: str | None = None  # the content's SHA-256 (LFS files; every ModelScope file)
    git_blob: str | None = None  # git's blob id (SHA-1 of "blob <size>\0" + content), for a small Hugging Face file


@dataclass(frozen=True)
class Listing:
    revision: str  # what the files are fetched at: a 40-hex commit (Hugging Face), or the branch (ModelScope)
    files: tuple[RemoteFile, ...]


def refused(where: str, what: str, outcome: str = "nothing was downloaded") -> ModelError:
    return ModelError(f"{where}: the hub's answer {what}; {outcome} (a broken or hostile server, or a proxy in "
                      "between: try again later, or another hub: HF_ENDPOINT=https://hf-mirror.com, "
                      "ROCTUNE_HUB=modelscope or unset)", exit_code=1)


def parse(data: bytes, where: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deeply
        text = data[:60].decode("utf-8", "replace").replace("\n", " ")
        raise refused(where, f"is not JSON (it begins {text!r})") from None


def field(doc: dict, key: str, kind: type, where: str, what: str = "the file list"):
    value = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise refused(where, f"has no {key} {'list' if kind is list else kind.__name__} in {what}")
    return value


def file_name(name: Any, where: str) -> str:
    """A file name from a hub: relative, "/"-separated, without empty, `.` or `..` parts, backslashes, a drive or
    control characters; it becomes a path inside the model folder."""
    bad = (not isinstance(name, str) or not name or len(name) > 1000 or name.startswith("/") or "\\" in name
           or any(ord(c) < 32 or ord(c) == 127 for c in name) or re.match(r"[A-Za-z]:", name)
           or any(part in ("", ".", "..") for part in name.split("/")))
    if bad:
        raise refused(where, f"names a file {name!r} that is not a plain relative name (a path out of the model "
                             "folder)")
    return name


def size(value: Any, name: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_FILE_BYTES:
        raise refused(where, f"gives {name} the size {value!r}, not a whole number of bytes up to "
                             f"{MAX_FILE_BYTES >> 30} GiB")
    return value


def digest(value: Any, pattern: re.Pattern, name: str, where: str) -> str | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str) or not pattern.fullmatch(value.lower()):
        raise refused(where, f"gives {name} the hash {str(value)[:80]!r}, not hex of the right length")
    return value.lower()


def huggingface(data: bytes, where: str) -> Listing:
    """A Hugging Face repo info answer (GET /api/models/ORG/NAME/revision/main?blobs=true)."""
    doc = parse(data, where)
    if not isinstance(doc, dict):
        raise refused(where, "is not a JSON object")
    sha = doc.get("sha")
    if not isinstance(sha, str) or not COMMIT.fullmatch(sha):
        raise refused(where, f"gives the commit id (sha) {str(sha)[:80]!r}, not 40 hex digits")
    files = []
    for row in field(doc, "siblings", list, where, "the repository info"):
        name = file_name(row.get("rfilename") if isinstance(row, dict) else None, where)
        lfs = row.get("lfs") or {}
        if not isinstance(lfs, dict):
            raise refused(where, f"gives {name} an lfs entry that is not an object")
        files.append(RemoteFile(name, size(row.get("size"), name, where),
                                digest(lfs.get("sha256"), SHA256, name, where),
                                None if lfs else digest(row.get("blobId"), COMMIT, name, where)))
    return Listing(sha, tuple(files))


def modelscope(data: bytes, where: str, revision: str) -> Listing:
    """A ModelScope file list (GET /api/v1/models/ORG/NAME/repo/files): {"Code", "Data": {"Files": [...]}}."""
    doc = parse(data, where)
    if not isinstance(doc, dict):
        raise refused(where, "is not a JSON object")
    if doc.get("Success") is False or doc.get("Code") not in (None, 200):
        raise refused(where, f"is an error (Code {str(doc.get('Code'))[:20]}: {str(doc.get('Message'))[:120]})")
    files = []
    for row in field(field(doc, "Data", dict, where), "Files", list, where):
        if not isinstance(row, dict):
            raise refused(where, "lists a file that is not an object")
        if row.get("Type") == "tree":  # a folder
            continue
        name = file_name(row.get("Path"), where)
        files.append(RemoteFile(name, size(row.get("Size"), name, where),
                                digest(row.get("Sha256"), SHA256, name, where)))
    return Listing(revision, tuple(files))


def wanted(listing: Listing, trust_remote_code: bool, where: str) -> list[RemoteFile]:
    """The files of `listing` a model folder is loaded from (LOADED_FILES and LOADED_PATTERN at the top level;
    *.py as well with trust_remote_code). Refused when they are not a transformers model with safetensors weights."""
    def loaded(name: str) -> bool:
        return "/" not in name and (name in LOADED_FILES or bool(LOADED_PATTERN.fullmatch(name))
                                    or trust_remote_code and bool(CODE_PATTERN.fullmatch(name)))

    files = sorted((f for f in listing.files if loaded(f.name)), key=lambda f: f.name)
    names = {f.name for f in files}
    if len(names) != len(files):
        raise refused(where, "lists a file twice")
    if "config.json" not in names:
        raise ModelError(f"{where}: the repository has no config.json; it is not a transformers model (a GGUF-only "
                         "or adapter repository?): choose another id (roctune models list)")
    if not any(n.endswith(".safetensors") for n in names):
        raise ModelError(f"{where}: the repository has no safetensors weights (roctune never loads pickle files); "
                         "choose a repository with model.safetensors")
    return files
