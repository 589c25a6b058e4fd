"""`roctune serve`: an OpenAI-compatible HTTP server for a base model and any number of LoRA adapters.

One copy of the base weights is loaded; every adapter is a PEFT adapter on top of it, and a request's `model`
field picks the base or an adapter. A single worker thread owns the model: requests wait in a queue, the
worker takes those waiting (up to --max-batch, after a few milliseconds for more to arrive), and decodes them
together in one left-padded batch with a KV cache, token by token. LoRA adapters are mixed in one batch with
PEFT's per-row `adapter_names`; adapters that PEFT cannot mix (DoRA) are batched by adapter. Each row has its
own sampling settings, seed, stop strings and token limit, and rows leave the batch as soon as they finish.
Prompts are rendered by `roctune.data.render.render_prompt`, the same function training uses.

Endpoints: GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions (the prompt is one
user turn rendered with the chat template, as training renders prompt/completion records; `"raw": true`
sends it as it is), and admin endpoints under /admin/adapters (key required) to list, load and unload adapters
from folders under --adapter-root. Errors have OpenAI's shape: {"error": {"message", "type", "code"}}.
"""

import hmac
import json
import logging
import os
import queue
import random
import re
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from roctune.errors import ConfigError, ModelError, RoctuneError

log = logging.getLogger("roctune.serve")

ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
BASE_ROW = "__base__"  # PEFT's name for "no adapter" in a mixed batch
MAX_STOP = 4
DEFAULT_MAX_TOKENS = 256


class ApiError(Exception):
    """An error answered in OpenAI's shape with an HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}


# ------------------------------------------------------------------------------------------------- paths
def adapter_dir_under(root: str, relative) -> str:
    """The real path of adapter folder `relative` inside `root`. Rejects absolute paths, `..` and anything whose
    real path (symlinks resolved) leaves the root; raises ApiError(400/404)."""
    if not isinstance(relative, str) or not relative.strip():
        raise ApiError(400, "field 'path' must be a non-empty string: a folder relative to --adapter-root",
                       param="path")
    if "\x00" in relative:
        raise ApiError(400, "field 'path' contains a NUL byte", param="path")
    parts = re.split(r"[\\/]+", relative)
    if os.path.isabs(relative) or relative.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:", relative):
        raise ApiError(400, f"path {relative!r} is absolute; give a folder relative to --adapter-root",
                       param="path")
    if ".." in parts:
        raise ApiError(400, f"path {relative!r} contains '..'; give a folder inside --adapter-root", param="path")
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, relative))
    if real != real_root and not real.startswith(real_root + os.sep):
        raise ApiError(400, f"path {relative!r} leads outside --adapter-root (through a symlink)", param="path")
    if not os.path.isfile(os.path.join(real, "adapter_config.json")):
        raise ApiError(404, f"path {relative!r}: no adapter_config.json under --adapter-root", code="not_found",
                       type="not_found_error", param="path")
    return real


def check_adapter_name(name) -> str:
    if not isinstance(name, str) or not ADAPTER_NAME.match(name) or name == BASE_ROW:
        raise ApiError(400, f"adapter name {name!r}: use 1-64 letters, digits, '-' or '_' (starting with a "
                       "letter or digit)", param="name")
    return name


# ------------------------------------------------------------------------------------------------ engine
@dataclass
class GenRequest:
    """One completion to produce. `emit` is called from the worker thread with ("text", delta),
    ("end", finish_reason, completion_tokens) or ("error", ApiError); it must be thread-safe."""

    prompt_ids: list[int]
    adapter: str | None
    max_tokens: int
    emit: Callable[[tuple], None]
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    cancelled: bool = False


@dataclass
class _Adapter:
    path: str
    mixable: bool


@dataclass
class _Control:
    fn: Callable[[], object]
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None
    error: BaseException | None = None


class _Row:
    """Decoding state of one request inside a batch: generated ids, text sent so far, stop handling."""

    def __init__(self, req: GenRequest, engine: "Engine"):
        import torch

        self.req = req
        self.engine = engine
        self.ids: list[int] = []
        self.sent = 0  # characters of the decoded text already emitted
        self.finished = False
        self.gen = None
        if req.temperature > 0:
            self.gen = torch.Generator(device=engine.device)
            self.gen.manual_seed(req.seed if req.seed is not None else random.getrandbits(63))

    def _emit(self, ev: tuple) -> None:
        try:
            self.req.emit(ev)
        except Exception:  # a closed event loop: the client is gone
            self.req.cancelled = True

    def _send(self, text: str, upto: int) -> None:
        if upto > self.sent:
            self._emit(("text", text[self.sent:upto]))
            self.sent = upto

    def finish(self, reason: str, n_tokens: int) -> None:
        self.finished = True
        self._emit(("end", reason, n_tokens))

    def push(self, token: int) -> bool:
        """Take the next token; emit what can be sent; True when the row is finished."""
        eng = self.engine
        if token in eng.eos_ids:
            text = eng.decode(self.ids)
            self._send(text, len(text))
            self.finish("stop", len(self.ids) + 1)
            return True
        self.ids.append(token)
        text = eng.decode(self.ids)
        stops = self.req.stop
        if stops:
            hits = [i for i in (text.find(s, max(0, self.sent - len(s) + 1)) for s in stops) if i >= 0]
            if hits:
                self._send(text, min(hits))
                self.finish("stop", len(self.ids))
                return True
        if len(self.ids) >= self.req.max_tokens:
            self._send(text, len(text))
            self.finish("length", len(self.ids))
            return True
        safe = len(text)
        while safe > self.sent and text[safe - 1] == "\ufffd":  # an incomplete UTF-8 sequence: wait for more
            safe -= 1
        for s in stops:  # hold back a tail that may grow into a stop string
            for k in range(min(len(s) - 1, safe - self.sent), 0, -1):
                if text[safe - k:safe] == s[:k]:
                    safe -= k
                    break
        self._send(text, safe)
        return False


@dataclass
class _Batch:
    """The rows being decoded together: their KV cache, attention mask, last positions and next logits."""

    rows: list
    cache: object
    mask: object
    last_pos: object
    logits: object
    joinable: bool


class Engine:
    """The model, its adapters and the batching worker. Thread-safe: `submit` from any thread; adapter
    changes run on the worker between batches."""

    def __init__(self, model: str | None = None, device: str = "auto", dtype: str = "auto", max_batch: int = 8,
                 batch_wait_ms: float = 5.0, trust_remote_code: bool = False, max_queue: int = 1024):
        from roctune.hardware import choose_attention, choose_device, choose_dtype
        from roctune.models import DEFAULT_MODEL, load_model, load_tokenizer, resolve_model

        if max_batch < 1:
            raise ConfigError(f"--max-batch must be >= 1 (got {max_batch})")
        self.base_path = resolve_model(model)
        self.base_id = DEFAULT_MODEL if model is None else (
            os.path.basename(os.path.normpath(model)) if os.path.isdir(os.path.expanduser(model)) else model)
        self.device = choose_device(device).value
        self.dtype = choose_dtype(dtype, self.device).value
        attn = choose_attention("auto", self.device, self.dtype).value
        if attn == "flash_attention_2":
            attn = "sdpa"  # left-padded batches with a KV cache: sdpa is the safe kernel everywhere
        self.tokenizer = load_tokenizer(self.base_path, trust_remote_code)
        self.base = load_model(self.base_path, self.dtype, self.device, attn, trust_remote_code)
        self.base.eval()
        self.peft = None  # the PeftModel wrapping self.base once an adapter is loaded
        self.adapters: dict[str, _Adapter] = {}
        self.max_batch = max_batch
        self.batch_wait = batch_wait_ms / 1000.0
        self.max_queue = max_queue
        cfg = self.base.config
        self.context = int(getattr(cfg, "max_position_embeddings", 0) or 0) or None
        eos = getattr(self.base.generation_config, "eos_token_id", None)
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_ids = set(eos)
        import inspect

        # transformers renamed the forward argument past_key_values to cache; use whichever this model takes
        params = inspect.signature(type(self.base).forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (eos or [0])[0]
        self._tok_lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._controls: deque[_Control] = deque()
        self._thread: threading.Thread | None = None
        self.stats = {"batches": 0, "rows": 0, "max_rows": 0}

    # ---- tokenizer (shared by request threads and the worker)
    def encode_chat(self, messages: list[dict]) -> list[int]:
        from roctune.data.render import render_prompt

        with self._tok_lock:
            text = render_prompt(self.tokenizer, messages)
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_raw(self, text: str) -> list[int]:
        with self._tok_lock:
            return self.tokenizer(text, add_special_tokens=True)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        with self._tok_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ---- adapters
    def model_ids(self) -> list[str]:
        return [self.base_id] + list(self.adapters)

    def has_model(self, name: str) -> bool:
        return name == self.base_id or name in self.adapters

    def load_adapter(self, name: str, path: str) -> None:
        """Load adapter `path` as `name` (on the worker when it runs). Raises ApiError."""
        self._on_worker(lambda: self._load_adapter(name, path))

    def unload_adapter(self, name: str) -> None:
        self._on_worker(lambda: self._unload_adapter(name))

    def _load_adapter(self, name: str, path: str) -> None:
        check_adapter_name(name)
        if name == self.base_id or name in self.adapters:
            raise ApiError(409, f"a model named {name!r} is already loaded; unload it first or pick another name",
                           code="conflict", param="name")
        cfg_path = os.path.join(path, "adapter_config.json")
        try:
            with open(cfg_path, encoding="utf-8") as f:
                acfg = json.load(f)
        except (OSError, ValueError) as e:
            raise ApiError(400, f"{cfg_path}: not readable as JSON ({e})", param="path") from None
        if str(acfg.get("peft_type", "")).upper() != "LORA":
            raise ApiError(400, f"{path}: peft_type {acfg.get('peft_type')!r} is not served; only LoRA adapters",
                           param="path")
        self._check_base(path)
        from peft import PeftModel

        try:
            if self.peft is None:
                self.peft = PeftModel.from_pretrained(self.base, path, adapter_name=name)
            else:
                self.peft.load_adapter(path, adapter_name=name)
        except Exception as e:
            raise ApiError(400, f"{path}: cannot load the adapter on {self.base_id} "
                           f"({type(e).__name__}: {str(e).splitlines()[0][:300]})", param="path") from None
        self.peft.eval()
        self.adapters[name] = _Adapter(path, mixable=not acfg.get("use_dora"))

    def _check_base(self, path: str) -> None:
        from roctune import rundir
        from roctune.models import resolve_model

        if not rundir.is_run_dir(path):
            return
        try:
            trained_on = rundir.read_run(path).get("base_model")
            trained_path = resolve_model(trained_on)
        except Exception:  # unresolvable here (hub id offline): PEFT still checks the shapes
            return
        if os.path.realpath(trained_path) != os.path.realpath(self.base_path):
            raise ApiError(400, f"{path}: trained on {trained_on!r} but this server runs {self.base_id!r}; "
                           "serve it with --model set to its base", param="path")

    def _unload_adapter(self, name: str) -> None:
        if name not in self.adapters:
            raise ApiError(404, f"no adapter named {name!r} is loaded", type="not_found_error",
                           code="model_not_found", param="name")
        if len(self.adapters) == 1:  # PEFT cannot run without an adapter: take the LoRA layers out
            self.base = self.peft.unload()
            self.base.eval()
            self.peft = None
        else:
            self.peft.delete_adapter(name)
        del self.adapters[name]

    def _on_worker(self, fn: Callable[[], object]):
        if self._thread is None or not self._thread.is_alive():
            return fn()
        ctl = _Control(fn)
        self._queue.put(ctl)
        ctl.done.wait()
        if ctl.error is not None:
            raise ctl.error
        return ctl.result

    # ---- worker
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="roctune-serve-worker", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    def submit(self, req: GenRequest) -> None:
        if self._queue.qsize() >= self.max_queue:
            raise ApiError(503, "the server is busy (request queue full); retry later", type="server_error",
                           code="overloaded")
        self._queue.put(req)

    def _take(self, item, pending: deque) -> bool:
        """File one queue item; False for the stop sentinel."""
        if item is None:
            return False
        if isinstance(item, _Control):
            self._controls.append(item)  # run once no batch is decoding
        else:
            pending.append(item)
        return True

    def _loop(self) -> None:
        pending: deque[GenRequest] = deque()
        state: _Batch | None = None
        running = True
        while running:
            if state is None and self._controls:
                ctl = self._controls.popleft()
                try:
                    ctl.result = ctl.fn()
                except BaseException as e:  # handed back to the caller's thread
                    ctl.error = e
                ctl.done.set()
                continue
            if state is None and not pending:
                running = self._take(self._queue.get(), pending)
                continue
            while True:  # file whatever is waiting, without blocking
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                running = self._take(item, pending) and running
            if state is None:
                deadline = time.monotonic() + self.batch_wait  # a few ms for more requests to arrive
                while running and len(pending) < self.max_batch and time.monotonic() < deadline:
                    try:
                        item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        break
                    running = self._take(item, pending) and running
            batch: list[GenRequest] = []
            try:
                if state is None:
                    batch = self._select(pending, [], self.max_batch)
                    state = self._prefill(batch) if batch else None
                elif pending and len(state.rows) < self.max_batch and state.joinable and not self._controls:
                    # continuous batching: new requests join the running batch between two tokens
                    batch = self._select(pending, [r.req.adapter for r in state.rows],
                                         self.max_batch - len(state.rows))
                    if batch:
                        state = self._join(state, self._prefill(batch))
                if state is not None:
                    state = self._step(state)
            except Exception as e:  # never leave a client waiting
                log.exception("generation failed")
                err = ApiError(500, f"generation failed: {type(e).__name__}: {e}", type="server_error",
                               code="internal_error")
                for req in [row.req for row in (state.rows if state is not None else [])] + batch:
                    if not req.cancelled:
                        req.cancelled = True
                        try:
                            req.emit(("error", err))
                        except Exception:
                            pass
                state = None

    def _select(self, pending: deque, running: list, room: int) -> list[GenRequest]:
        """Up to `room` waiting requests, oldest first, that can share a batch with rows using adapters
        `running`: any mix of mixable adapters, else only the same adapter."""
        for r in list(pending):
            if r.cancelled:
                pending.remove(r)
            elif r.adapter is not None and r.adapter not in self.adapters:
                pending.remove(r)
                r.cancelled = True
                r.emit(("error", ApiError(404, f"model {r.adapter!r} was unloaded", type="not_found_error",
                                          code="model_not_found")))
        chosen: list[GenRequest] = []
        for r in list(pending):
            if len(chosen) >= room:
                break
            if self._compatible(running + [c.adapter for c in chosen] + [r.adapter]):
                chosen.append(r)
                pending.remove(r)
        return chosen

    def _mixable(self, adapters: list) -> bool:
        return all(a is None or self.adapters[a].mixable for a in adapters)

    def _compatible(self, adapters: list) -> bool:
        return self._mixable(adapters) or len(set(adapters)) == 1

    def _forward(self, adapters: list, **inputs):
        """One forward pass for rows that use `adapters` (None: the base model)."""
        import contextlib

        model, extra, ctx = self.base, {}, contextlib.nullcontext()
        if self.peft is not None:
            model = self.peft
            if self._mixable(adapters):
                extra = {"adapter_names": [a or BASE_ROW for a in adapters]}
            elif adapters[0] is None:  # _select keeps a batch with an unmixable adapter to that adapter only
                ctx = self.peft.disable_adapter()
            else:
                self.peft.set_adapter(adapters[0])
        with ctx:
            out = model(use_cache=True, logits_to_keep=1, **inputs, **extra)
        return out.logits[:, -1, :].float()

    def _prefill(self, batch: list[GenRequest]) -> "_Batch":
        """Run the prompts of `batch` (left-padded) and return a decoding state with the first logits."""
        import torch
        from transformers import DynamicCache

        dev = self.device
        n = len(batch)
        width = max(len(r.prompt_ids) for r in batch)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(batch):
            k = len(r.prompt_ids)
            ids[i, width - k:] = torch.tensor(r.prompt_ids, dtype=torch.long)
            mask[i, width - k:] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.base.config)
        with torch.inference_mode():
            logits = self._forward([r.adapter for r in batch], input_ids=ids, attention_mask=mask,
                                   position_ids=pos, **{self._cache_arg: cache})
        self.stats["batches"] += 1
        self.stats["rows"] += n
        joinable = all(type(layer).__name__ == "DynamicLayer" and hasattr(layer, "keys") for layer in
                       getattr(cache, "layers", [None]))
        return _Batch([_Row(r, self) for r in batch], cache, mask, pos[:, -1:], logits, joinable)

    def _join(self, a: "_Batch", b: "_Batch") -> "_Batch":
        """One batch from two: the shorter cache is padded on the left (masked), then rows are stacked."""
        import torch

        if not b.joinable:
            raise RuntimeError("this model's cache cannot be merged")
        width = max(a.mask.shape[1], b.mask.shape[1])

        def pad(t, dim: int):
            missing = width - t.shape[dim]
            if missing == 0:
                return t
            shape = list(t.shape)
            shape[dim] = missing
            return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)

        for la, lb in zip(a.cache.layers, b.cache.layers):
            la.keys = torch.cat([pad(la.keys, 2), pad(lb.keys, 2)], dim=0)
            la.values = torch.cat([pad(la.values, 2), pad(lb.values, 2)], dim=0)
        a.mask = torch.cat([pad(a.mask, 1), pad(b.mask, 1)], dim=0)
        a.last_pos = torch.cat([a.last_pos, b.last_pos], dim=0)
        a.logits = torch.cat([a.logits, b.logits], dim=0)
        a.rows += b.rows
        return a

    def _step(self, st: "_Batch") -> "_Batch | None":
        """Pick each row's next token from the last logits, retire finished rows, and run the next forward
        pass. Returns None when no row is left."""
        import torch

        self.stats["max_rows"] = max(self.stats["max_rows"], len(st.rows))
        nxt = self._pick(st.logits, st.rows)
        keep = [j for j, row in enumerate(st.rows) if not row.push(int(nxt[j])) and not row.req.cancelled]
        for j, row in enumerate(st.rows):
            if j not in keep and not row.finished:  # cancelled by its client
                row.finished = True
        if not keep:
            return None
        if len(keep) < len(st.rows):
            sel = torch.tensor(keep, device=self.device)
            st.cache.batch_select_indices(sel)
            st.mask, st.last_pos, nxt = st.mask[sel], st.last_pos[sel], nxt[sel]
            st.rows = [st.rows[j] for j in keep]
            lead = int((st.mask.cumsum(1) == 0).sum(1).min())  # columns now padding for every row
            if lead >= 16 and st.joinable:
                st.mask = st.mask[:, lead:]
                for layer in st.cache.layers:
                    layer.keys, layer.values = layer.keys[:, :, lead:], layer.values[:, :, lead:]
        st.last_pos = st.last_pos + 1
        st.mask = torch.cat([st.mask, torch.ones((len(st.rows), 1), dtype=st.mask.dtype, device=self.device)], 1)
        with torch.inference_mode():
            st.logits = self._forward([r.req.adapter for r in st.rows], input_ids=nxt[:, None],
                                      attention_mask=st.mask, position_ids=st.last_pos,
                                      **{self._cache_arg: st.cache})
        return st

    @staticmethod
    def _pick(logits, rows: list[_Row]):
        import torch

        out = logits.argmax(dim=-1)
        for j, row in enumerate(rows):
            req = row.req
            if req.temperature <= 0:
                continue
            probs = torch.softmax(logits[j] / req.temperature, dim=-1)
            if req.top_p < 1.0:
                sorted_p, order = torch.sort(probs, descending=True)
                drop = sorted_p.cumsum(-1) - sorted_p > req.top_p  # keep the smallest set reaching top_p
                sorted_p[drop] = 0.0
                probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
            out[j] = torch.multinomial(probs, 1, generator=row.gen)[0]
        return out


# ------------------------------------------------------------------------------------------ request parsing
def _number(body: dict, key: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v > hi or v < lo or (lo_open and v == lo):
        raise ApiError(400, f"field '{key}' must be a number in {'(' if lo_open else '['}{lo}, {hi}] (got {v!r})",
                       param=key)
    return float(v)


def _integer(body: dict, key: str):
    v = body.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
        raise ApiError(400, f"field '{key}' must be an integer (got {v!r})", param=key)
    return v


def _content_text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"field '{where}[{k}]': only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                               "are supported", param=where)
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError(400, f"field '{where}' must be a string or a list of text parts", param=where)


def parse_messages(value) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "field 'messages' must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise ApiError(400, f"field 'messages[{i}]' must be an object with 'role' and 'content'",
                           param="messages")
        role = {"developer": "system"}.get(m.get("role"), m.get("role"))
        if role not in ("system", "user", "assistant"):
            raise ApiError(400, f"field 'messages[{i}].role' is {m.get('role')!r}; expected system, developer, "
                           "user or assistant", param="messages")
        out.append({"role": role, "content": _content_text(m.get("content"), f"messages[{i}].content")})
    if out[-1]["role"] == "assistant":
        raise ApiError(400, "the last message is an assistant turn; end with a user message", param="messages")
    return out


@dataclass
class Settings:
    api_key: str | None = None
    adapter_root: str | None = None
    max_tokens_limit: int = 1024
    max_body_bytes: int = 1 << 20


def _sampling(body: dict, engine: Engine, settings: Settings, n_prompt: int) -> dict:
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise ApiError(400, f"field 'n' must be 1 (got {n!r}); send separate requests for more answers", param="n")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, key)
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(400, f"field '{key}' must be >= 1 (got {max_tokens})", param=key)
    if max_tokens is not None and max_tokens > settings.max_tokens_limit:
        raise ApiError(422, f"field '{key}' is {max_tokens}, over this server's limit of "
                       f"{settings.max_tokens_limit} (--max-tokens-limit)", param=key, code="max_tokens_too_large")
    room = (engine.context - n_prompt) if engine.context else None
    if room is not None and room < 1:
        raise ApiError(400, f"the prompt is {n_prompt} tokens; {engine.base_id} holds {engine.context}",
                       code="context_length_exceeded", param="messages")
    if max_tokens is None:
        max_tokens = min(DEFAULT_MAX_TOKENS, settings.max_tokens_limit, room or DEFAULT_MAX_TOKENS)
    elif room is not None and max_tokens > room:
        raise ApiError(400, f"the prompt ({n_prompt} tokens) plus {key} ({max_tokens}) exceeds the model's "
                       f"context of {engine.context} tokens", code="context_length_exceeded", param=key)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if (not isinstance(stop, list) or len(stop) > MAX_STOP
            or not all(isinstance(s, str) and s for s in stop)):
        raise ApiError(400, f"field 'stop' must be a non-empty string or a list of up to {MAX_STOP} of them",
                       param="stop")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, "field 'stream' must be true or false", param="stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError(400, "field 'stream_options' must be an object", param="stream_options")
    return {"max_tokens": max_tokens, "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
            "top_p": _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True), "stop": stop,
            "seed": _integer(body, "seed"), "stream": bool(stream),
            "include_usage": bool(opts.get("include_usage"))}


# ------------------------------------------------------------------------------------------------ the app
def create_app(engine: Engine, settings: Settings):
    """The FastAPI application serving `engine`."""
    import asyncio

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    app = FastAPI(title="roctune serve", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        msg = (f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405)
               else str(exc.detail))
        return JSONResponse(ApiError(exc.status_code, msg, type=kind).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(request, exc):
        log.exception("request failed")
        return JSONResponse(ApiError(500, f"internal error: {type(exc).__name__}", type="server_error").body(),
                            status_code=500)

    def authorize(request: Request, admin: bool = False) -> None:
        if not settings.api_key:
            if admin:
                raise ApiError(403, "admin endpoints are off: start the server with --api-key (or ROCTUNE_API_KEY)",
                               type="permission_error", code="admin_disabled")
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if not header:
            raise ApiError(401, "missing API key: send 'Authorization: Bearer KEY'", type="authentication_error",
                           code="missing_api_key")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), settings.api_key.encode()):
            raise ApiError(401, "invalid API key", type="authentication_error", code="invalid_api_key")

    async def read_json(request: Request) -> dict:
        limit = settings.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise ApiError(400, "invalid Content-Length header")
            if int(length) > limit:
                raise ApiError(413, f"request body is {length} bytes; this server takes at most {limit} "
                               "(--max-body-bytes)", code="request_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body is over {limit} bytes (--max-body-bytes)",
                               code="request_too_large")
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks))
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the body is not valid JSON ({e})", code="invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object", code="invalid_json")
        return body

    def pick_model(body: dict) -> str | None:
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise ApiError(400, f"field 'model' is required: one of {', '.join(engine.model_ids())}", param="model")
        if not engine.has_model(name):
            raise ApiError(404, f"the model {name!r} does not exist; available: {', '.join(engine.model_ids())}",
                           type="not_found_error", code="model_not_found", param="model")
        return None if name == engine.base_id else name

    async def start(body: dict, prompt_ids: list[int], adapter, opts: dict):
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(ev: tuple) -> None:
            loop.call_soon_threadsafe(events.put_nowait, ev)

        req = GenRequest(prompt_ids, adapter, opts["max_tokens"], emit, opts["temperature"], opts["top_p"],
                         opts["stop"], opts["seed"])
        engine.submit(req)
        return req, events

    async def answer(request: Request, chat: bool):
        authorize(request)
        body = await read_json(request)
        adapter = pick_model(body)
        if chat:
            messages = parse_messages(body.get("messages"))
            prompt_ids = engine.encode_chat(messages)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1:
                prompt = prompt[0]
            if not isinstance(prompt, str):
                raise ApiError(400, "field 'prompt' must be a string (or a list holding one string)", param="prompt")
            raw = body.get("raw", False)
            if not isinstance(raw, bool):
                raise ApiError(400, "field 'raw' must be true or false", param="raw")
            prompt_ids = (engine.encode_raw(prompt) if raw
                          else engine.encode_chat([{"role": "user", "content": prompt}]))
        if not prompt_ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        opts = _sampling(body, engine, settings, len(prompt_ids))
        req, events = await start(body, prompt_ids, adapter, opts)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        model_name = body["model"]
        obj = "chat.completion" if chat else "text_completion"

        def usage(n: int) -> dict:
            return {"prompt_tokens": len(prompt_ids), "completion_tokens": n, "total_tokens": len(prompt_ids) + n}

        if not opts["stream"]:
            parts = []
            try:
                while True:
                    ev = await events.get()
                    if ev[0] == "text":
                        parts.append(ev[1])
                    elif ev[0] == "error":
                        raise ev[1]
                    else:
                        break
            finally:
                req.cancelled = True
            text, reason, n = "".join(parts), ev[1], ev[2]
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason,
                       "logprobs": None} if chat
                      else {"index": 0, "text": text, "finish_reason": reason, "logprobs": None})
            return JSONResponse({"id": rid, "object": obj, "created": created, "model": model_name,
                                 "choices": [choice], "usage": usage(n)})

        chunk_obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: str | None, reason: str | None = None, first: bool = False) -> str:
            if chat:
                d = {"role": "assistant", "content": ""} if first else ({"content": delta} if delta else {})
                choice = {"index": 0, "delta": d, "finish_reason": reason, "logprobs": None}
            else:
                choice = {"index": 0, "text": delta or "", "finish_reason": reason, "logprobs": None}
            payload = {"id": rid, "object": chunk_obj, "created": created, "model": model_name, "choices": [choice]}
            if opts["include_usage"]:
                payload["usage"] = None
            return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

        async def sse():
            try:
                if chat:
                    yield chunk(None, first=True)
                while True:
                    ev = await events.get()
                    if ev[0] == "text":
                        yield chunk(ev[1])
                    elif ev[0] == "error":
                        yield f"data: {json.dumps(ev[1].body())}\n\n"
                        break
                    else:
                        yield chunk(None, ev[1])
                        if opts["include_usage"]:
                            tail = {"id": rid, "object": chunk_obj, "created": created, "model": model_name,
                                    "choices": [], "usage": usage(ev[2])}
                            yield f"data: {json.dumps(tail)}\n\n"
                        break
                yield "data: [DONE]\n\n"
            finally:
                req.cancelled = True  # the client left early, or we are done: stop decoding this row

        return StreamingResponse(sse(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": engine.base_id, "adapters": list(engine.adapters),
                "device": engine.device, "dtype": engine.dtype}

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        now = int(time.time())
        data = [{"id": engine.base_id, "object": "model", "created": now, "owned_by": "roctune", "parent": None}]
        data += [{"id": a, "object": "model", "created": now, "owned_by": "roctune", "parent": engine.base_id}
                 for a in engine.adapters]
        return {"object": "list", "data": data}

    @app.get("/v1/models/{name}")
    async def model(name: str, request: Request):
        authorize(request)
        if not engine.has_model(name):
            raise ApiError(404, f"the model {name!r} does not exist", type="not_found_error",
                           code="model_not_found")
        return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "roctune",
                "parent": None if name == engine.base_id else engine.base_id}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, chat=False)

    def listing() -> dict:
        return {"object": "list", "data": [{"name": n, "path": a.path} for n, a in engine.adapters.items()]}

    @app.get("/admin/adapters")
    async def admin_list(request: Request):
        authorize(request, admin=True)
        return listing()

    @app.post("/admin/adapters")
    async def admin_load(request: Request):
        authorize(request, admin=True)
        body = await read_json(request)
        if not settings.adapter_root:
            raise ApiError(403, "loading adapters is off: start the server with --adapter-root DIR",
                           type="permission_error", code="adapter_root_unset")
        name = check_adapter_name(body.get("name"))
        path = adapter_dir_under(settings.adapter_root, body.get("path"))
        from starlette.concurrency import run_in_threadpool

        await run_in_threadpool(engine.load_adapter, name, path)
        return JSONResponse(listing(), status_code=201)

    @app.delete("/admin/adapters/{name}")
    async def admin_unload(name: str, request: Request):
        authorize(request, admin=True)
        from starlette.concurrency import run_in_threadpool

        await run_in_threadpool(engine.unload_adapter, name)
        return listing()

    return app


# ---------------------------------------------------------------------------------------------- running it
def bind_socket(host: str, port: int):
    """A listening TCP socket on host:port (port 0: a free one). Raises ConfigError when it cannot bind."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror}); pick another "
                          "--port (is another server running?)") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class ServerThread:
    """Run the app with uvicorn in a background thread (tests, scripts): `with ServerThread(app) as url: ...`."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import uvicorn

        self.sock = bind_socket(host, port)
        h, p = self.sock.getsockname()[:2]
        self.url = f"http://{h}:{p}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RoctuneError("the server did not start")
            time.sleep(0.02)
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def parse_adapter_specs(specs: list[str]) -> list[tuple[str, str]]:
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
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            raise ConfigError(f"--adapter {spec!r}: {path} has no adapter_config.json; is training finished?")
        if name in [n for n, _ in out]:
            raise ConfigError(f"--adapter {spec!r}: the name {name!r} is given twice")
        out.append((name, os.path.abspath(path)))
    return out


def build_engine(model: str | None, adapters: list[tuple[str, str]], **kw) -> Engine:
    """Load the base model and the named adapters; raises RoctuneError naming the bad adapter."""
    engine = Engine(model, **kw)
    for name, path in adapters:
        try:
            engine.load_adapter(name, path)
        except ApiError as e:
            raise ModelError(f"--adapter {name}={path}: {e.message}") from None
    return engine
