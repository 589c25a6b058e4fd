"""The hubs a model is pulled from, one row each: where it is (its endpoint variable), how to ask it for a
repository's file list and for one file, which answer checker reads the list (roctune.hub.answers), what its HTTP
errors mean, and the way out when it cannot be reached."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable
from urllib.parse import quote

from roctune.catalog import catalog_entry
from roctune.errors import ModelError
from roctune.hub import answers
from roctune.hub.store import MODELSCOPE_PREFIX
from roctune.hub.transfer import Client, Status, unreachable

MIRROR_HINT = ("use a mirror (HF_ENDPOINT=https://hf-mirror.com), ModelScope (ROCTUNE_HUB=modelscope), or a model "
               "folder on disk (--model /path)")
# Where ModelScope is the hub that cannot be reached, the way out is Hugging Face or its mirror.
MODELSCOPE_HINT = ("use Hugging Face or its mirror (unset ROCTUNE_HUB; HF_ENDPOINT=https://hf-mirror.com), or a model "
                   "folder on disk (--model /path)")
UNREACHABLE_STATUS = (403, 407, 408, 429)  # and every 5xx: the hub (or a proxy) is there but not serving


@dataclass(frozen=True)
class Source:
    name: str
    endpoint: Callable[[], str]
    hint: str
    repo: Callable[[str, str], str]  # (model id as given, id without prefix) -> the repository on this hub
    auth: Callable[[], dict]  # headers for the hub itself (a token), never sent after a redirect
    listing: Callable[[Client, str], answers.Listing]  # (client, repository) -> its checked file list
    file_url: Callable[[str, str, str, str], str]  # (endpoint, repository, revision, file name)
    missing: Callable[[Status], bool]  # whether an error status says "no such repository"

    def client(self, cancel=None) -> Client:
        return Client(self.endpoint(), self.hint, self.auth(), cancel)

    def error(self, e: Status, model_id: str, endpoint: str) -> ModelError:
        """What an HTTP error status from this hub means, as one line with the fix."""
        if e.headers.get("X-Error-Code") == "GatedRepo":
            return ModelError(f"{model_id}: the model is gated on the hub: accept its licence on its page and log in "
                              "(`hf auth login`), or use ModelScope (ROCTUNE_HUB=modelscope)")
        if self.missing(e):
            return ModelError(f"{model_id}: no such model on {endpoint}; check the id (roctune models list)")
        if e.code >= 500 or e.code in UNREACHABLE_STATUS:
            return unreachable(endpoint, f"HTTP {e.code}", self.hint)
        return ModelError(f"{model_id}: {endpoint} refused the download (HTTP {e.code}); check the id and your "
                          "token, or " + self.hint, exit_code=1)


def _hf_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _hf_token() -> dict:
    """The user's Hugging Face token (HF_TOKEN or `hf auth login`), read by huggingface_hub where installed."""
    try:
        from huggingface_hub import get_token

        token = get_token()
    except ImportError:
        token = os.environ.get("HF_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def _hf_listing(client: Client, repo: str) -> answers.Listing:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise ModelError(f"{repo}: not downloaded, and downloads are switched off (HF_HUB_OFFLINE=1); unset it, or "
                         "use a model folder on disk (--model /path)")
    url = f"{client.endpoint}/api/models/{quote(repo)}/revision/main?blobs=true"
    return answers.huggingface(client.answer(url), url)


def _hf_missing(e: Status) -> bool:
    code = e.headers.get("X-Error-Code")
    return code in ("RepoNotFound", "RevisionNotFound") or e.code == 401 and \
        e.headers.get("X-Error-Message") != "Invalid credentials in Authorization header"


def _modelscope_repo(model_id: str, repo_id: str) -> str:
    """The catalog's ModelScope id (Meta's and Google's models are republished by LLM-Research) unless the id was
    given with its `modelscope:` prefix."""
    entry = None if model_id.strip().lower().startswith(MODELSCOPE_PREFIX) else catalog_entry(repo_id)
    return entry.modelscope if entry and entry.modelscope else repo_id


def _modelscope_listing(client: Client, repo: str) -> answers.Listing:
    url = f"{client.endpoint}/api/v1/models/{quote(repo)}/repo/files?Revision=master&Recursive=False"
    return answers.modelscope(client.answer(url), url, "master")


SOURCES = {
    "huggingface": Source(
        "huggingface", _hf_endpoint, MIRROR_HINT, lambda model_id, repo_id: repo_id, _hf_token, _hf_listing,
        lambda endpoint, repo, revision, name: f"{endpoint}/{quote(repo)}/resolve/{revision}/{quote(name)}",
        _hf_missing),
    "modelscope": Source(
        "modelscope", lambda: (os.environ.get("MODELSCOPE_ENDPOINT") or "https://www.modelscope.cn").rstrip("/"),
        MODELSCOPE_HINT, _modelscope_repo, dict, _modelscope_listing,
        lambda endpoint, repo, revision, name:
            f"{endpoint}/api/v1/models/{quote(repo)}/repo?Revision={quote(revision)}&FilePath={quote(name)}",
        lambda e: e.code == 404),
}
