"""The continuous-batching engine: `Engine` owns the model, its adapters and one worker thread.

Requests wait in a queue; the worker takes those waiting (up to --max-batch, after a few milliseconds for
more to arrive), prefills their prompts in one left-padded batch with a KV cache and decodes them token by
token; new requests join a running batch between two tokens, and rows leave it as soon as they finish. Adapter
loads and unloads run on the worker between batches.

A request that fails inside the engine fails alone: a row whose sampler or token handling raises is answered
with an error and dropped while the others go on, and when a batch's prefill fails as a whole its requests are
tried again each in a batch of its own, so only the one that fails alone gets the error."""

import copy
import inspect
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from roctune.errors import ConfigError, ModelError
from roctune.serve.adapters import Adapter, AdapterStack, base_model_id
from roctune.serve.constrain import Grammars
from roctune.serve.decode import Batch, GenRequest, Row, advance, cache_joinable, fail, join, keep_rows, left_pad
from roctune.serve.errors import ApiError, model_not_found

log = logging.getLogger(__name__)


@dataclass
class _Control:
    fn: Callable[[], object]
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None
    error: BaseException | None = None


class Engine:
    """The model, its adapters and the batching worker. Thread-safe: `submit` from any thread; adapter
    changes run on the worker between batches."""

    def __init__(self, model: str | None = None, device: str = "auto", dtype: str = "auto", max_batch: int = 8,
                 batch_wait_ms: float = 5.0, trust_remote_code: bool = False, max_queue: int = 1024,
                 rope_scaling: str = "", template: str | None = None):
        from roctune.generate import is_vision_model, load_vision_model
        from roctune.hardware import choose_attention, choose_device, choose_dtype
        from roctune.models import fit_attention, load_model, load_tokenizer, resolve_model

        if max_batch < 1:
            raise ConfigError(f"--max-batch must be >= 1 (got {max_batch})")
        self.base_path = resolve_model(model)
        self.base_id = base_model_id(model)
        self.device = choose_device(device).value
        self.dtype = choose_dtype(dtype, self.device).value
        attn = fit_attention(choose_attention("auto", self.device, self.dtype), "auto", self.base_path).value
        if attn == "flash_attention_2":
            attn = "sdpa"  # left-padded batches with a KV cache: sdpa is the safe kernel everywhere
        self.tokenizer = load_tokenizer(self.base_path, trust_remote_code, template)  # the adapters' (run.yaml)
        self.processor = None  # a vision-language model's: images to pixel values and image tokens
        if is_vision_model(self.base_path):
            base, self.processor = load_vision_model(self.base_path, self.dtype, self.device, attn,
                                                     trust_remote_code, self.tokenizer)
        else:
            base = load_model(self.base_path, self.dtype, self.device, attn, trust_remote_code, rope_scaling)
        base.eval()
        self.stack = AdapterStack(base, self.base_id, self.base_path, rope_scaling)
        self.max_batch = max_batch
        self.batch_wait = batch_wait_ms / 1000.0
        self.max_queue = max_queue
        self.context = int(getattr(base.config.get_text_config(), "max_position_embeddings", 0) or 0) or None
        self._init_tokens(base)
        self._tok_lock = threading.Lock()
        self._decode_tok = copy.deepcopy(self.tokenizer)  # the worker's own (see decode)
        self._tool_formats: dict[str | None, str | None] = {}
        self._image_pixels: dict[str | None, tuple[int, int]] = {}  # run folder -> its pixel bounds (image_pixels)
        n_vocab = base.get_output_embeddings().weight.shape[0]
        self.grammars = Grammars(self._decode_tok, n_vocab, self.eos_ids)  # llguidance, imported on first use
        self._queue: queue.Queue = queue.Queue()
        self._controls: deque[_Control] = deque()
        self._thread: threading.Thread | None = None
        self.stats = {"batches": 0, "rows": 0, "max_rows": 0}

    def _init_tokens(self, base) -> None:
        """End-of-sequence ids, the padding id and the name of the forward pass's cache argument."""
        from roctune.models import stop_token_ids

        eos = stop_token_ids(base, self.tokenizer)
        self.eos_ids = set(eos)
        # transformers renamed the forward argument past_key_values to cache; use whichever this model takes
        params = inspect.signature(type(base).forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (eos or [0])[0]

    @property
    def base(self):
        return self.stack.base

    @property
    def adapters(self) -> dict[str, Adapter]:
        return self.stack.loaded

    # ---- tokenizer: request threads encode (one at a time: a fast tokenizer may not be used by two threads at
    # once); the worker decodes with a copy of its own, so a long prompt being tokenized never stalls decoding
    def render_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The prompt text (jinja only: needs no lock). The template was tried when the server started, so a
        failure here is about these messages: HTTP 400 with the template's reason (no server paths)."""
        from roctune.data.render import render_prompt
        from roctune.data.template_limits import TemplateFailed
        from roctune.serve.errors import ApiError

        try:
            return render_prompt(self.tokenizer, messages, tools)
        except TemplateFailed as e:
            raise ApiError(400, f"the model's chat template cannot render these messages: it {e.reason}",
                           code="chat_template_failed", param="messages") from None

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return self.tokenize(self.render_chat(messages, tools))

    def encode_chat_images(self, messages: list[dict], tools: list[dict] | None = None):
        """(prompt text, token ids, the processor's other inputs) of a chat whose user turns hold images: the
        template places each image, the processor expands it into its tokens and pixel values."""
        from roctune.data.parts import take_images

        shaped, images = take_images(messages)
        text = self.render_chat(shaped, tools)
        with self._tok_lock:
            enc = self.processor(text=[text], images=[images], return_tensors="pt", add_special_tokens=False)
        ids = enc.pop("input_ids")[0].tolist()
        enc.pop("attention_mask", None)
        return text, ids, dict(enc)

    def tokenize(self, text: str) -> list[int]:
        """Token ids of a rendered prompt (it holds its special tokens as text already)."""
        with self._tok_lock:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def image_pixels(self, adapter: str | None) -> tuple[int, int]:
        """(max, min) pixels the run behind `adapter` scaled its pictures to in training; for the base (None), its
        own run's when the base is a run folder (freeze/full), else the defaults. Read once per run folder (as
        tool_format is), not on every request."""
        from roctune import rundir
        from roctune.generate import image_pixels

        if adapter in self.adapters:
            path = self.adapters[adapter].path
        else:
            path = self.base_path if rundir.is_run_dir(self.base_path) else None
        if path not in self._image_pixels:
            self._image_pixels[path] = image_pixels(path)
        return self._image_pixels[path]

    def tool_format(self, adapter: str | None) -> str | None:
        """How the model behind `adapter` (None: the base) writes tool calls: what its run recorded in run.yaml
        while it trained, else what the chat template writes (answer_format)."""
        from roctune import rundir
        from roctune.data.render import detect_tool_format

        path = self.adapters[adapter].path if adapter in self.adapters else None
        if path not in self._tool_formats:
            recorded = rundir.tool_format(path) if path else None
            self._tool_formats[path] = recorded or detect_tool_format(self.tokenizer)
        return self._tool_formats[path]

    def encode_raw(self, text: str) -> list[int]:
        with self._tok_lock:
            return self.tokenizer(text, add_special_tokens=True)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self._decode_tok.decode(ids, skip_special_tokens=True)

    # ---- adapters
    def model_ids(self) -> list[str]:
        return [self.base_id] + list(self.adapters)

    def has_model(self, name: str) -> bool:
        return name == self.base_id or name in self.adapters

    def load_adapter(self, name: str, path: str) -> None:
        """Load adapter `path` as `name` (on the worker when it runs). Raises ApiError."""
        self._on_worker(lambda: self.stack.load(name, path))

    def unload_adapter(self, name: str) -> None:
        self._on_worker(lambda: self.stack.unload(name))

    def _on_worker(self, fn: Callable[[], object]):
        if self._thread is None or not self._thread.is_alive():
            return fn()
        ctl = _Control(fn)
        self._queue.put(ctl)
        ctl.done.wait()
        if ctl.error is not None:
            raise ctl.error
        return ctl.result

    # ---- the worker's life
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

    def _loop(self) -> None:
        pending: deque[GenRequest] = deque()
        state: Batch | None = None
        running = True
        while running:
            if state is None and self._controls:
                self._run_control(self._controls.popleft())
                continue
            if state is None and not pending:
                running = self._take(self._queue.get(), pending)
                continue
            running = self._drain(pending) and running
            if state is None:
                running = self._gather(pending) and running
            state = self._advance(state, pending)

    @staticmethod
    def _run_control(ctl: _Control) -> None:
        try:
            ctl.result = ctl.fn()
        except BaseException as e:  # handed back to the caller's thread
            ctl.error = e
        ctl.done.set()

    def _take(self, item, pending: deque) -> bool:
        """File one queue item; False for the stop sentinel."""
        if item is None:
            return False
        if isinstance(item, _Control):
            self._controls.append(item)  # run once no batch is decoding
        else:
            pending.append(item)
        return True

    def _drain(self, pending: deque) -> bool:
        """File whatever is waiting, without blocking; False once the stop sentinel came."""
        running = True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return running
            running = self._take(item, pending) and running

    def _gather(self, pending: deque) -> bool:
        """Wait a few milliseconds for more requests to fill a new batch; False once the stop sentinel came."""
        running = True
        deadline = time.monotonic() + self.batch_wait
        while running and len(pending) < self.max_batch and time.monotonic() < deadline:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            running = self._take(item, pending)
        return running

    # ---- batches
    def _advance(self, state: Batch | None, pending: deque) -> Batch | None:
        """Start a batch or let waiting requests join the running one, then decode one token. A failure that
        cannot be pinned on one request fails the rows of the running batch, never the server."""
        rows: list[Row] = []
        try:
            if state is None:
                rows = self._rows(self._select(pending, [], self.max_batch))
                state = self._prefill(rows, pending)
            elif pending and len(state.rows) < self.max_batch and state.joinable and not self._controls:
                # continuous batching: new requests join the running batch between two tokens
                rows = self._rows(self._select(pending, [r.req.adapter for r in state.rows],
                                               self.max_batch - len(state.rows)))
                new = self._prefill(rows, pending)
                state = join(state, new) if new is not None else state
            return self._step(state) if state is not None else None
        except Exception as e:  # never leave a client waiting
            log.exception("generation failed")
            for row in (state.rows if state is not None else []) + rows:
                fail(row.req, e)
            return None

    def _select(self, pending: deque, running: list, room: int) -> list[GenRequest]:
        """Up to `room` waiting requests, oldest first, that can share a batch with rows using adapters
        `running`: any mix of mixable adapters, else only the same adapter. A `solo` request goes alone."""
        for r in list(pending):
            if r.cancelled:
                pending.remove(r)
            elif r.adapter is not None and r.adapter not in self.adapters:
                pending.remove(r)
                fail(r, model_not_found(f"model {r.adapter!r} was unloaded", param=None))
        chosen: list[GenRequest] = []
        for r in list(pending):
            if len(chosen) >= room or (chosen and (chosen[0].solo or chosen[0].images is not None)):
                break
            if (r.solo and (running or chosen)) or (r.images is not None and chosen):
                continue  # a prompt with images is prefilled alone (its pixels), then joins the running batch
            if self.stack.compatible(running + [c.adapter for c in chosen] + [r.adapter]):
                chosen.append(r)
                pending.remove(r)
        return chosen

    def _rows(self, batch: list[GenRequest]) -> list[Row]:
        """A decoding row for each request; one whose row cannot be set up fails alone."""
        rows = []
        for req in batch:
            try:
                rows.append(Row(req, self.decode, self.eos_ids, self.device))
            except Exception as e:
                log.exception("request setup failed")
                fail(req, e)
        return rows

    def _prefill(self, rows: list[Row], pending: deque) -> Batch | None:
        """Run the prompts of `rows` (left-padded) and return a decoding state with the first logits. When a
        batch of several fails, its requests go back to wait, each to be tried in a batch of its own; a request
        that fails alone gets the error."""
        import torch
        from transformers import DynamicCache

        if not rows:
            return None
        ids, mask, pos = (t.to(self.device) for t in left_pad([r.req.prompt_ids for r in rows], self.pad_id))
        cache = DynamicCache(config=self.base.config)
        pixels = {k: v.to(self.device, dtype=self.base.dtype) if v.is_floating_point() else v.to(self.device)
                  for k, v in (rows[0].req.images or {}).items()}  # _select prefills a prompt with images alone
        try:
            with torch.inference_mode():
                logits = self.stack.forward([r.req.adapter for r in rows], input_ids=ids, attention_mask=mask,
                                            position_ids=pos, **pixels, **{self._cache_arg: cache})
        except Exception as e:
            if len(rows) == 1:
                log.exception("prefill failed")
                fail(rows[0].req, e)
                return None
            log.warning("a prefill of %d rows failed (%s: %s); trying each alone", len(rows), type(e).__name__, e)
            for row in reversed(rows):
                row.req.solo = True
                pending.appendleft(row.req)
            return None
        self.stats["batches"] += 1
        self.stats["rows"] += len(rows)
        return Batch(rows, cache, mask, pos[:, -1:], logits, cache_joinable(cache))

    def _next_tokens(self, st: Batch) -> tuple[list[int], list[int]]:
        """(indices of the rows that go on, their next tokens): each row takes its token; a row that finishes,
        is cancelled, or fails (answered alone with an error) is left out."""
        greedy = st.logits.argmax(dim=-1).tolist()
        keep, tokens = [], []
        for j, row in enumerate(st.rows):
            try:
                token = row.next_token(st.logits[j], greedy[j])
                done = row.push(token)
            except Exception as e:
                log.exception("decoding one row failed")
                row.finished = True
                fail(row.req, e)
                continue
            if done or row.req.cancelled:
                row.finished = True
            else:
                keep.append(j)
                tokens.append(token)
        return keep, tokens

    def _step(self, st: Batch) -> Batch | None:
        """Pick each row's next token from the last logits, retire finished rows, and run the next forward
        pass. Returns None when no row is left."""
        import torch

        self.stats["max_rows"] = max(self.stats["max_rows"], len(st.rows))
        keep, tokens = self._next_tokens(st)
        if not keep:
            return None
        if len(keep) < len(st.rows):
            keep_rows(st, keep)
        advance(st)
        nxt = torch.tensor(tokens, dtype=torch.long, device=self.device)[:, None]
        with torch.inference_mode():
            st.logits = self.stack.forward([r.req.adapter for r in st.rows], input_ids=nxt, attention_mask=st.mask,
                                           position_ids=st.last_pos, **{self._cache_arg: st.cache})
        return st


def build_engine(model: str | None, adapters: list[tuple[str, str]], **kw) -> Engine:
    """Load the base model and the named adapters; raises RoctuneError naming the bad adapter. The base takes the
    --rope-scaling the adapters were trained with (they must agree: one base serves them all)."""
    from roctune import rundir

    scalings = {rundir.rope_scaling(path) for _, path in adapters}
    if len(scalings) > 1:
        shown = ", ".join(sorted(s or "none" for s in scalings))
        raise ModelError(f"--adapter: these runs were trained with different --rope-scaling ({shown}); serve them "
                         "from separate servers")
    engine = Engine(model, rope_scaling=scalings.pop() if scalings else "", **kw)
    for name, path in adapters:
        try:
            engine.load_adapter(name, path)
        except ApiError as e:
            raise ModelError(f"--adapter {name}={path}: {e.message}") from None
    return engine
