"""`roctune serve`: the real server (uvicorn in a thread, loopback, free port) driven by the official `openai`
client and raw HTTP. Two LoRA adapters are trained once per session on the bundled model to give different
answers to the same question; the tests check that each answers as trained, alone and inside concurrent mixed
batches, plus streaming, stop strings, seeds, admin load/unload, path confinement and every error status; hostile
fields answer 400 naming the field, and a request that fails inside the engine fails alone."""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import write_jsonl

KEY = "test-key-123"
QUESTION = "What is the secret word?"
WORDS = {"fruit": "apple", "peak": "mountain"}
LIMIT = 64  # --max-tokens-limit of the test server
BODY_LIMIT = 64 * 1024


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def adapter_root(tmp_path_factory, default_model_dir) -> str:
    """Folder with two trained adapters: fruit (answers 'apple') and peak (answers 'mountain')."""
    from roctune.config import TrainConfig
    from roctune.recipes import train

    root = tmp_path_factory.mktemp("adapters")
    data_dir = tmp_path_factory.mktemp("serve-data")
    asks = [QUESTION, "Tell me the secret word.", "Which word is secret?", "Say the secret word."]
    for name, word in WORDS.items():
        data = write_jsonl(data_dir / f"{name}.jsonl",
                           [{"instruction": q, "output": f"The secret word is {word}."} for q in asks])
        cfg = TrainConfig(data=[data], output=str(root / name), max_steps=8, lr=2e-3, batch_size=4, grad_accum=1,
                          lora_r=16, lora_alpha=32, lora_dropout=0.0, device="cpu", seed=1)
        cfg.validate()
        train(cfg, log=lambda s: None, progress=False)
    return str(root)


@pytest.fixture(scope="module")
def server(adapter_root, tmp_path_factory):
    import torch

    from roctune.serve import ServerThread, Settings, build_engine, create_app

    # One decoding thread leaves the second core to uvicorn and the client threads (and keeps the tests quick
    # on a busy machine, where OpenMP's spinning threads slow decoding down many times over).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = build_engine(None, [(n, os.path.join(adapter_root, n)) for n in WORDS], device="cpu", max_batch=8)
    settings = Settings(api_key=KEY, adapter_root=adapter_root, max_tokens_limit=LIMIT, max_body_bytes=BODY_LIMIT)
    engine.start()
    try:
        with ServerThread(create_app(engine, settings)) as url:
            yield url, engine
    finally:
        engine.stop()
        torch.set_num_threads(threads)


@pytest.fixture
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0, timeout=600)


def http(server, method: str, path: str, body=None, key: str | None = KEY, raw: bytes | None = None):
    """(status, parsed JSON or text) for a raw request."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    content = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    if content is not None:
        headers["Content-Type"] = "application/json"
    r = httpx.request(method, server[0] + path, content=content, headers=headers, timeout=600)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


def ask(client, model: str, question: str = QUESTION, max_tokens: int = 8, **kw) -> str:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                       max_tokens=max_tokens, temperature=0, **kw)
    return r.choices[0].message.content


def assert_openai_error(status_body, status: int, code: str | None = None):
    got, body = status_body
    assert got == status, body
    assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"]), body
    assert body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code, body


# ------------------------------------------------------------------------------------- no model needed
def test_adapter_paths_stay_under_the_root(tmp_path):
    from roctune.serve import ApiError, adapter_dir_under

    root = tmp_path / "root"
    (root / "good").mkdir(parents=True)
    (root / "good" / "adapter_config.json").write_text("{}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "adapter_config.json").write_text("{}")
    os.symlink(outside, root / "escape")
    os.symlink(root / "good", root / "inner")
    assert adapter_dir_under(str(root), "good") == os.path.realpath(root / "good")
    assert adapter_dir_under(str(root), "inner") == os.path.realpath(root / "good")
    for bad in ["../outside", "good/../../outside", str(outside), "/etc", "~/x", "escape", "", None, "a\\..\\b"]:
        with pytest.raises(ApiError) as e:
            adapter_dir_under(str(root), bad)
        assert e.value.status == 400, bad
    with pytest.raises(ApiError) as e:
        adapter_dir_under(str(root), "missing")
    assert e.value.status == 404


def test_cli_flags_and_adapter_specs(tmp_path):
    from roctune.cli import build_parser
    from roctune.errors import ConfigError
    from roctune.serve import parse_adapter_specs

    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.max_batch) == ("127.0.0.1", 8000, 8)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "adapter_config.json").write_text("{}")
    assert parse_adapter_specs([f"x={tmp_path / 'a'}"]) == [("x", str(tmp_path / "a"))]
    for bad in ["noequals", f"={tmp_path}", f"bad.name={tmp_path / 'a'}", f"x={tmp_path / 'nope'}", f"x={tmp_path}"]:
        with pytest.raises(ConfigError):
            parse_adapter_specs([bad])
    with pytest.raises(ConfigError, match="twice"):
        parse_adapter_specs([f"x={tmp_path / 'a'}", f"x={tmp_path / 'a'}"])


# -------------------------------------------------------------------------------------- the real server
@pytest.mark.slow
def test_models_and_health(server, client):
    from roctune.models import DEFAULT_MODEL

    ids = [m.id for m in client.models.list().data]
    assert ids == [DEFAULT_MODEL, "fruit", "peak"]
    assert client.models.retrieve("peak").id == "peak"
    status, body = http(server, "GET", "/health", key=None)
    assert status == 200 and body == {"status": "ok"}  # no names without the key
    status, body = http(server, "GET", "/health")
    assert status == 200 and body["status"] == "ok" and body["adapters"] == ["fruit", "peak"]
    assert server[0].startswith("http://127.0.0.1:")


@pytest.mark.slow
def test_adapters_answer_as_trained_alone_and_in_mixed_batches(server, client):
    from roctune.models import DEFAULT_MODEL

    models = [DEFAULT_MODEL, "fruit", "peak"]
    questions = [QUESTION, "Tell me the secret word."]
    alone = {(m, q): ask(client, m, q) for m in models for q in questions}
    for q in questions:
        assert "apple" in alone[("fruit", q)].lower() and "mountain" not in alone[("fruit", q)].lower()
        assert "mountain" in alone[("peak", q)].lower() and "apple" not in alone[("peak", q)].lower()
        base = alone[(DEFAULT_MODEL, q)].lower()
        assert "apple" not in base and "mountain" not in base
    jobs = [(models[i % 3], questions[(i // 3) % 2]) for i in range(33)]
    before = dict(server[1].stats)
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        answers = list(pool.map(lambda job: ask(client, *job), jobs))
    for job, answer in zip(jobs, answers):
        assert answer == alone[job], job
    # the requests really were decoded together, in batches of several adapters
    assert server[1].stats["max_rows"] > 1
    assert server[1].stats["batches"] - before["batches"] < len(jobs)


@pytest.mark.slow
def test_streaming_chat_and_completions(server, client):
    full = client.chat.completions.create(model="fruit", messages=[{"role": "user", "content": QUESTION}],
                                          max_tokens=8, temperature=0)
    stream = client.chat.completions.create(model="fruit", messages=[{"role": "user", "content": QUESTION}],
                                            max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    deltas, reasons, usage = [], [], None
    for ev in stream:
        if ev.usage is not None:
            usage = ev.usage
        for c in ev.choices:
            deltas.append(c.delta.content or "")
            reasons.append(c.finish_reason)
    assert "".join(deltas) == full.choices[0].message.content
    assert reasons[-1] == full.choices[0].finish_reason and all(r is None for r in reasons[:-1])
    assert usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens

    # completions: the prompt is one user turn, rendered by the training chat template
    comp = client.completions.create(model="peak", prompt=QUESTION, max_tokens=8, temperature=0)
    assert comp.choices[0].text == ask(client, "peak")
    parts = [c.choices[0].text for c in client.completions.create(model="peak", prompt=QUESTION, max_tokens=8,
                                                                  temperature=0, stream=True) if c.choices]
    assert "".join(parts) == comp.choices[0].text

    # the raw stream: server-sent events ending with [DONE]
    import httpx

    with httpx.stream("POST", server[0] + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "peak", "messages": [{"role": "user", "content": QUESTION}],
                            "max_tokens": 4, "temperature": 0, "stream": True}, timeout=600) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert all(ln.startswith("data: ") for ln in lines) and lines[-1] == "data: [DONE]"


@pytest.mark.slow
def test_usage_stop_and_seed(server, client):
    from roctune.data.render import render_prompt

    engine = server[1]
    r = client.chat.completions.create(model="fruit", messages=[{"role": "user", "content": QUESTION}],
                                       max_tokens=12, temperature=0)
    prompt = render_prompt(engine.tokenizer, [{"role": "user", "content": QUESTION}])
    assert r.usage.prompt_tokens == len(engine.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert 0 < r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    text = r.choices[0].message.content
    assert "secret" in text
    cut = ask(client, "fruit", max_tokens=12, stop=["secret", "zzz"])
    assert cut == text[:text.index("secret")]
    short = client.chat.completions.create(model="fruit", messages=[{"role": "user", "content": QUESTION}],
                                           max_tokens=2, temperature=0)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 2

    def sample(seed):
        return client.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=6, temperature=1.0,
                                              seed=seed, messages=[{"role": "user", "content": "Name a color."}]
                                              ).choices[0].message.content

    assert sample(7) == sample(7)


@pytest.mark.slow
def test_error_statuses_have_openai_shape(server, client):
    import openai

    msgs = [{"role": "user", "content": QUESTION}]
    ok = {"model": "fruit", "messages": msgs, "max_tokens": 2}
    # 401: missing or wrong key, for the API and for the models list
    assert_openai_error(http(server, "POST", "/v1/chat/completions", ok, key=None), 401, "missing_api_key")
    assert_openai_error(http(server, "GET", "/v1/models", key="wrong"), 401, "invalid_api_key")
    from openai import OpenAI

    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=server[0] + "/v1", api_key="wrong", max_retries=0).models.list()
    # 404: unknown model, unknown route
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=msgs, max_tokens=2)
    assert_openai_error(http(server, "POST", "/v1/completions", {"model": "nope", "prompt": "x"}), 404,
                        "model_not_found")
    assert_openai_error(http(server, "GET", "/v1/nothing"), 404)
    # 400: invalid JSON and invalid fields
    assert_openai_error(http(server, "POST", "/v1/chat/completions", raw=b"{not json"), 400, "invalid_json")
    assert_openai_error(http(server, "POST", "/v1/chat/completions", raw=b"[1, 2]"), 400, "invalid_json")
    bad_fields = [{"messages": msgs}, {"model": "fruit"}, {"model": "fruit", "messages": []},
                  {"model": "fruit", "messages": [{"role": "robot", "content": "hi"}]},
                  {"model": "fruit", "messages": [{"role": "user", "content": 5}]},
                  {**ok, "n": 2}, {**ok, "temperature": 5}, {**ok, "temperature": "hot"}, {**ok, "top_p": 0},
                  {**ok, "max_tokens": 0}, {**ok, "max_tokens": "8"}, {**ok, "stop": ["a", "b", "c", "d", "e"]},
                  {**ok, "stop": [""]}, {**ok, "seed": 1.5}, {**ok, "stream": "yes"}]
    for body in bad_fields:
        status, reply = http(server, "POST", "/v1/chat/completions", body)
        assert_openai_error((status, reply), 400)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="fruit", messages=msgs, max_tokens=2, n=2)
    assert_openai_error(http(server, "POST", "/v1/completions", {"model": "fruit", "prompt": ["a", "b"]}), 400)
    # 413: oversized body, refused before it is parsed
    huge = {"model": "fruit", "messages": [{"role": "user", "content": "x" * (BODY_LIMIT + 10)}]}
    assert_openai_error(http(server, "POST", "/v1/chat/completions", huge), 413, "request_too_large")
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="fruit", messages=huge["messages"], max_tokens=2)
    assert e.value.status_code == 413
    # 422: max_tokens over --max-tokens-limit
    assert_openai_error(http(server, "POST", "/v1/chat/completions", {**ok, "max_tokens": LIMIT + 1}), 422)
    with pytest.raises(openai.UnprocessableEntityError):
        client.completions.create(model="fruit", prompt="x", max_tokens=LIMIT + 1)
    # the server still answers after all that
    assert "apple" in ask(client, "fruit").lower()


@pytest.mark.slow
def test_hostile_fields_answer_400_naming_the_field(server, client):
    msgs = [{"role": "user", "content": QUESTION}]
    ok = {"model": "fruit", "messages": msgs, "max_tokens": 2}
    bad = {"seed": [-1, 2 ** 64, 10 ** 30, 1.5, "7", True], "temperature": [-0.1, float("inf"), float("-inf")],
           "top_p": [0, -1, 1.5, float("inf")], "max_tokens": [0, -5, 1.0, float("inf"), 10 ** 30 * -1],
           "max_completion_tokens": [0, 2.5], "n": [2, 0, "1", True, float("inf")]}
    for key, values in bad.items():
        for value in values:
            status, reply = http(server, "POST", "/v1/chat/completions", {**ok, key: value})
            assert_openai_error((status, reply), 400)
            assert reply["error"]["param"] == key and key in reply["error"]["message"], (key, value, reply)
    # NaN and Infinity as JSON extensions (Python's json accepts them), and a number too large for a float
    for key in ["temperature", "top_p", "seed", "max_tokens", "n"]:
        for token in ["NaN", "Infinity", "-Infinity", "1e999"]:
            raw = json.dumps(ok)[:-1] + f', "{key}": {token}}}'
            status, reply = http(server, "POST", "/v1/chat/completions", raw=raw.encode())
            assert_openai_error((status, reply), 400)
            assert reply["error"]["param"] == key, (key, token, reply)
    # a lone surrogate is not text: refused wherever text goes in
    lone = "\ud800"
    bodies = [({**ok, "messages": [{"role": "user", "content": f"hi {lone}"}]}, "/v1/chat/completions",
               "messages[0].content"),
              ({**ok, "messages": [{"role": "user", "content": [{"type": "text", "text": lone}]}]},
               "/v1/chat/completions", "messages[0].content[0].text"),
              ({**ok, "stop": ["a", lone]}, "/v1/chat/completions", "stop"),
              ({"model": "fruit", "prompt": lone, "max_tokens": 2}, "/v1/completions", "prompt"),
              ({"model": "fruit", "prompt": [lone], "raw": True, "max_tokens": 2}, "/v1/completions", "prompt")]
    for body, path, param in bodies:
        status, reply = http(server, "POST", path, raw=json.dumps(body).encode())  # json escapes it as \ud800
        assert_openai_error((status, reply), 400)
        assert reply["error"]["param"] == param, reply
    assert_openai_error(http(server, "POST", "/admin/adapters", raw=json.dumps({"name": "x", "path": lone}).encode()),
                        400)
    # a role that is not even a string
    assert_openai_error(http(server, "POST", "/v1/chat/completions",
                             {**ok, "messages": [{"role": ["user"], "content": "hi"}]}), 400)
    # the edges of the ranges are accepted
    edge = {**ok, "seed": 2 ** 64 - 1, "temperature": 2, "top_p": 1e-9, "n": 1, "max_tokens": 1}
    status, reply = http(server, "POST", "/v1/chat/completions", edge)
    assert status == 200 and reply["usage"]["completion_tokens"] == 1, reply
    assert http(server, "POST", "/v1/chat/completions", {**ok, "seed": 0, "temperature": 0.5})[0] == 200
    assert "apple" in ask(client, "fruit").lower()


@pytest.mark.slow
def test_a_row_failing_while_decoding_fails_alone(server, client, monkeypatch):
    """A request that fails inside the engine mid-batch answers 500 alone; the row decoded with it goes on."""
    import threading

    from roctune.serve.decode import Row

    engine, bad_seed = server[1], 4242
    expected = ask(client, "fruit", seed=1)
    bad_queued, good_running, batches = threading.Event(), threading.Event(), []
    real_push, real_submit, real_next = Row.push, engine.submit, engine._next_tokens

    def submit(req):
        real_submit(req)
        if req.sampling.seed == bad_seed:
            bad_queued.set()

    def push(row, token):
        if row.req.sampling.seed == bad_seed:
            raise RuntimeError("injected failure")
        good_running.set()
        bad_queued.wait(timeout=120)  # hold the good row until the bad request waits to join its batch
        return real_push(row, token)

    def next_tokens(st):
        batches.append(sorted(r.req.sampling.seed for r in st.rows))
        return real_next(st)

    monkeypatch.setattr(engine, "submit", submit)
    monkeypatch.setattr(engine, "_next_tokens", next_tokens)
    monkeypatch.setattr(Row, "push", push)
    with ThreadPoolExecutor(max_workers=1) as pool:
        good = pool.submit(ask, client, "fruit", seed=1)
        assert good_running.wait(timeout=120)
        status, reply = http(server, "POST", "/v1/chat/completions",
                             {"model": "peak", "messages": [{"role": "user", "content": QUESTION}],
                              "max_tokens": 8, "temperature": 0, "seed": bad_seed})
        assert good.result(timeout=300) == expected
    assert_openai_error((status, reply), 500, "internal_error")
    assert "injected failure" in reply["error"]["message"]
    assert [1, bad_seed] in batches  # the two really shared a batch


@pytest.mark.slow
def test_a_failing_prefill_is_retried_row_by_row(server, client, monkeypatch):
    """When a batch's prefill fails, each request is tried alone: only the one that fails alone gets an error."""
    import threading

    engine = server[1]
    bad_prompt = "zebra zebra zebra"
    marks = set(engine.encode_raw(bad_prompt)) - set(engine.encode_chat([{"role": "user", "content": QUESTION}]))
    mark = next(iter(marks))
    expected = ask(client, "fruit")
    real_forward, real_submit = engine.stack.forward, engine.submit
    queued, failed_widths = [], []
    both_queued, holding = threading.Event(), threading.Event()

    def hold_worker():
        holding.set()
        return both_queued.wait(timeout=120)

    def forward(adapters, **inputs):
        ids = inputs["input_ids"]
        if ids.shape[1] > 1 and bool((ids == mark).any()):
            failed_widths.append(ids.shape[0])
            raise RuntimeError("injected prefill failure")
        return real_forward(adapters, **inputs)

    def submit(req):
        real_submit(req)
        queued.append(req)
        if len(queued) == 2:
            both_queued.set()

    monkeypatch.setattr(engine.stack, "forward", forward)
    monkeypatch.setattr(engine, "submit", submit)
    with ThreadPoolExecutor(max_workers=3) as pool:
        # hold the worker between batches until both requests wait, so that they are prefilled together
        hold = pool.submit(engine._on_worker, hold_worker)
        assert holding.wait(timeout=120)
        good = pool.submit(ask, client, "fruit")
        bad = pool.submit(http, server, "POST", "/v1/completions",
                          {"model": "fruit", "prompt": bad_prompt, "raw": True, "max_tokens": 4})
        assert hold.result(timeout=120) is True
        assert good.result(timeout=300) == expected
        status, reply = bad.result(timeout=300)
    assert_openai_error((status, reply), 500, "internal_error")
    assert "injected prefill failure" in reply["error"]["message"]
    assert failed_widths == [2, 1]  # together first, then alone


@pytest.mark.slow
def test_admin_load_and_unload_adapters(server, client):
    admin = "/admin/adapters"
    assert_openai_error(http(server, "GET", admin, key=None), 401)
    assert_openai_error(http(server, "POST", admin, {"name": "x", "path": "fruit"}, key="wrong"), 401)
    status, body = http(server, "GET", admin)
    assert status == 200 and [a["name"] for a in body["data"]] == ["fruit", "peak"]
    # paths outside --adapter-root are refused: '..', absolute, symlinks out
    outside = os.path.dirname(os.path.realpath(os.path.join(server[1].adapters["fruit"].path, "..")))
    link = os.path.join(os.path.dirname(server[1].adapters["fruit"].path), "escape")
    if not os.path.islink(link):
        os.symlink(outside, link)
    for path in ["../fruit", "fruit/../../fruit", server[1].adapters["fruit"].path, "escape", "/etc"]:
        assert_openai_error(http(server, "POST", admin, {"name": "sneaky", "path": path}), 400)
    assert_openai_error(http(server, "POST", admin, {"name": "sneaky", "path": "missing"}), 404)
    assert_openai_error(http(server, "POST", admin, {"name": "bad name", "path": "fruit"}), 400)
    assert_openai_error(http(server, "POST", admin, {"name": "peak", "path": "fruit"}), 409)
    # load a copy of fruit under a new name, use it, unload it
    status, body = http(server, "POST", admin, {"name": "fruit2", "path": "fruit"})
    assert status == 201 and "fruit2" in [a["name"] for a in body["data"]]
    assert "fruit2" in [m.id for m in client.models.list().data]
    assert ask(client, "fruit2") == ask(client, "fruit")
    status, body = http(server, "DELETE", admin + "/fruit2")
    assert status == 200 and [a["name"] for a in body["data"]] == ["fruit", "peak"]
    assert_openai_error(http(server, "DELETE", admin + "/fruit2"), 404)
    assert_openai_error(http(server, "POST", "/v1/chat/completions",
                             {"model": "fruit2", "messages": [{"role": "user", "content": QUESTION}]}), 404)
    assert "mountain" in ask(client, "peak").lower()
    # unloading every adapter leaves the plain base model; loading them again brings their answers back
    from roctune.models import DEFAULT_MODEL

    base = ask(client, DEFAULT_MODEL)
    for name in ["fruit", "peak"]:
        assert http(server, "DELETE", f"{admin}/{name}")[0] == 200
    assert [m.id for m in client.models.list().data] == [DEFAULT_MODEL]
    assert ask(client, DEFAULT_MODEL) == base
    for name in ["fruit", "peak"]:
        assert http(server, "POST", admin, {"name": name, "path": name})[0] == 201
    assert "apple" in ask(client, "fruit").lower() and "mountain" in ask(client, "peak").lower()
