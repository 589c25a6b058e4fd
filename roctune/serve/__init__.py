"""`roctune serve`: an OpenAI-compatible HTTP server for a base model and any number of LoRA adapters.

One copy of the base weights is loaded; every adapter is a PEFT adapter on top of it, and a request's `model`
field picks the base or an adapter. A single worker thread owns the model and decodes waiting requests together
in continuously refilled batches (see engine.py). Prompts are rendered by `roctune.data.render.render_prompt`, the same
function training uses, and answers are parsed back into reasoning_content, content and tool_calls by
`roctune.data.answer_format`, the module that wrote the tool calls for training. Errors have OpenAI's shape:
{"error": {"message", "type", "code"}}, for every bad request (uvicorn's own 400s included).

The package, by responsibility:
- errors.py: ApiError, the OpenAI-shaped error;
- fields.py: which top-level fields each endpoint acts on, refuses, or accepts as changing no answer (reported in
  the x-roctune-ignored header);
- schemas.py: request parsing and validation (messages, tools, response_format), sampling settings, Settings
  (the server's limits);
- responses_schema.py, responses_output.py, responses.py: POST /v1/responses (the Responses API): its request as
  pydantic models turned into chat turns, its output items and stream events, and the responses kept for
  previous_response_id;
- images.py: images in chat requests (data: URLs only, limits), for a vision-language model;
- constrain.py: constrained decoding with llguidance (response_format, forced tool calls);
- adapters.py: adapter names and --adapter specs, folders confined under --adapter-root, loading/unloading;
- decode.py: one request's decoding row (the batch tensors and sampling are roctune.decoding's, shared with
  GRPO's rollouts);
- engine.py: Engine, the continuous-batching worker, and build_engine;
- completions.py and app.py: the FastAPI routes (create_app);
- vllm.py: `--engine vllm`, the hand-off to vLLM's server: adapter checks, its command line and chat template;
- server.py: check_host (no open non-loopback server by accident), bind_socket, uvicorn_config and ServerThread
  (uvicorn in a thread).

Importing this package loads neither torch nor FastAPI: the names from engine.py, app.py and server.py are
imported on first use.
"""

from importlib import import_module

from roctune.serve.adapters import adapter_dir_under, check_adapter_name, parse_adapter_specs
from roctune.serve.errors import ApiError
from roctune.serve.schemas import Settings

_LAZY = {"Engine": "engine", "GenRequest": "decode", "build_engine": "engine", "create_app": "app",
         "ServerThread": "server", "bind_socket": "server"}

__all__ = ["ApiError", "Engine", "GenRequest", "ServerThread", "Settings", "adapter_dir_under", "bind_socket",
           "build_engine", "check_adapter_name", "create_app", "parse_adapter_specs"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"roctune.serve.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'roctune.serve' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
