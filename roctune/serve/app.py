"""The FastAPI application: `create_app` wires each route to a small handler here, plus the exception handlers
that give every error OpenAI's shape, the API-key check and the size-limited JSON body reader.

Endpoints: GET /health, GET /v1/models, GET /v1/models/{name}, POST /v1/chat/completions, POST /v1/completions,
POST /v1/responses, GET /v1/responses/{id}, and (API key required) GET/POST /admin/adapters and
DELETE /admin/adapters/{name}. The engine, the `Settings` and the responses kept for previous_response_id live on
`app.state`. Request fields that change no answer are accepted and named in the x-roctune-ignored header
(fields.py)."""

import hmac
import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from roctune.serve import completions, responses
from roctune.serve.adapters import adapter_dir_under, check_adapter_name
from roctune.serve.errors import ApiError, model_not_found
from roctune.serve.fields import check_fields, report_ignored
from roctune.serve.schemas import Settings, parse_sampling, parse_stream

log = logging.getLogger(__name__)
# A request nests a JSON schema (response_format, tools) a few levels into the body; 64 levels leave room for any
# real schema while keeping every later step (the chat template's tojson, the grammar compiler) far from Python's
# recursion limit.
MAX_JSON_DEPTH = 64


# ------------------------------------------------------------------------------------------ errors
async def api_error(request: Request, exc: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    msg = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
    return JSONResponse(ApiError(exc.status_code, msg, type=kind).body(), status_code=exc.status_code)


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("request failed")
    return JSONResponse(ApiError(500, f"internal error: {type(exc).__name__}", type="server_error").body(),
                        status_code=500)


# ------------------------------------------------------------------------------------ request helpers
def authorized(request: Request) -> bool:
    """Whether the request may see the server's details: it has no key, or the request carries it."""
    try:
        authorize(request)
    except ApiError:
        return False
    return True


def authorize(request: Request, admin: bool = False) -> None:
    """Check the bearer key (when the server has one); admin endpoints need one to exist at all."""
    settings: Settings = request.app.state.settings
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
    """The body as a JSON object, refused (413) past --max-body-bytes before it is all read."""
    limit = request.app.state.settings.max_body_bytes
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
            raise ApiError(413, f"request body is over {limit} bytes (--max-body-bytes)", code="request_too_large")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the body is not valid JSON ({e})", code="invalid_json") from None
    except RecursionError:
        body = None  # nested past Python's recursion limit: answered below with the depth limit
    if body is None or json_depth(body) > MAX_JSON_DEPTH:
        raise ApiError(400, f"the body's JSON is nested more than {MAX_JSON_DEPTH} levels deep", code="invalid_json")
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    return body


def json_depth(value) -> int:
    """How deeply `value` nests lists and objects (walked without recursion, so any depth is safe to measure)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            if deepest > MAX_JSON_DEPTH:
                return deepest
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _model_card(name: str, parent: str | None, created: int) -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": "roctune", "parent": parent}


def _adapter_listing(engine) -> dict:
    return {"object": "list", "data": [{"name": n, "path": a.path} for n, a in engine.adapters.items()]}


# ------------------------------------------------------------------------------------------- routes
async def health(request: Request):
    """Liveness for anyone; the model, adapter names and device only for a caller with the API key."""
    engine = request.app.state.engine
    if not authorized(request):
        return {"status": "ok"}
    return {"status": "ok", "model": engine.base_id, "adapters": list(engine.adapters), "device": engine.device,
            "dtype": engine.dtype}


async def list_models(request: Request):
    authorize(request)
    engine, now = request.app.state.engine, int(time.time())
    data = [_model_card(engine.base_id, None, now)] + [_model_card(a, engine.base_id, now) for a in engine.adapters]
    return {"object": "list", "data": data}


async def get_model(name: str, request: Request):
    authorize(request)
    engine = request.app.state.engine
    if not engine.has_model(name):
        raise model_not_found(f"the model {name!r} does not exist", param=None)
    return _model_card(name, None if name == engine.base_id else engine.base_id, int(time.time()))


async def _complete(request: Request, chat: bool):
    authorize(request)
    engine, settings = request.app.state.engine, request.app.state.settings
    body = await read_json(request)
    ignored = check_fields(body, "chat" if chat else "text")
    adapter = completions.pick_adapter(body, engine)
    # rendering and tokenizing a long chat takes a while (about a second for 900 kB): off the event loop
    images = settings.images if getattr(engine, "processor", None) is not None else None
    prompt = await run_in_threadpool(completions.prompt_ids, body, engine, chat, adapter, images)
    sampling = parse_sampling(body, settings, len(prompt.ids), engine.context, engine.base_id)
    stream, include_usage = parse_stream(body)
    req, events = completions.submit(engine, prompt, adapter, sampling)
    reply = completions.Reply(chat, body["model"], len(prompt.ids), include_usage, prompt)
    response = completions.streamed(req, events, reply) if stream else await completions.whole(req, events, reply)
    report_ignored(response, ignored, request.url.path)
    return response


async def chat_completions(request: Request):
    return await _complete(request, chat=True)


async def text_completions(request: Request):
    return await _complete(request, chat=False)


async def create_response(request: Request):
    authorize(request)
    body = await read_json(request)
    ignored = check_fields(body, "responses")
    response = await responses.create(request, body)
    report_ignored(response, ignored, request.url.path)
    return response


async def get_response(response_id: str, request: Request):
    authorize(request)
    return responses.retrieve(response_id, request.app.state.responses)


async def admin_list(request: Request):
    authorize(request, admin=True)
    return _adapter_listing(request.app.state.engine)


async def admin_load(request: Request):
    authorize(request, admin=True)
    engine, settings = request.app.state.engine, request.app.state.settings
    body = await read_json(request)
    if not settings.adapter_root:
        raise ApiError(403, "loading adapters is off: start the server with --adapter-root DIR",
                       type="permission_error", code="adapter_root_unset")
    name = check_adapter_name(body.get("name"))
    path = adapter_dir_under(settings.adapter_root, body.get("path"))
    await run_in_threadpool(engine.load_adapter, name, path)
    return JSONResponse(_adapter_listing(engine), status_code=201)


async def admin_unload(name: str, request: Request):
    authorize(request, admin=True)
    engine = request.app.state.engine
    await run_in_threadpool(engine.unload_adapter, name)
    return _adapter_listing(engine)


ROUTES = [
    ("GET", "/health", health),
    ("GET", "/v1/models", list_models),
    ("GET", "/v1/models/{name}", get_model),
    ("POST", "/v1/chat/completions", chat_completions),
    ("POST", "/v1/completions", text_completions),
    ("POST", "/v1/responses", create_response),
    ("GET", "/v1/responses/{response_id}", get_response),
    ("GET", "/admin/adapters", admin_list),
    ("POST", "/admin/adapters", admin_load),
    ("DELETE", "/admin/adapters/{name}", admin_unload),
]


def create_app(engine, settings: Settings) -> FastAPI:
    """The FastAPI application serving `engine`."""
    app = FastAPI(title="roctune serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine, app.state.settings = engine, settings
    app.state.responses = responses.ResponseStore(settings.max_stored_responses)
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)
    for method, path, handler in ROUTES:
        app.add_api_route(path, handler, methods=[method])
    return app
