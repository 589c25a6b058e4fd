"""`roctune serve`: an OpenAI-compatible API (chat/completions, responses, completions, models) for a base model and
its LoRA adapters, with concurrent requests batched together. Binds to 127.0.0.1 unless --host says otherwise;
any other address needs an API key, or --allow-no-key to serve it open on purpose. The API key comes from
--api-key or the ROCTUNE_API_KEY environment variable; admin endpoints need it.

--engine vllm hands the same base and adapters, host, port and key rules to vLLM's OpenAI server instead (for
more traffic than one roctune process serves; `make vllm` installs its CPU build). Every adapter is checked
before vLLM starts (roctune.serve.vllm)."""
from __future__ import annotations

import os
import sys

from roctune.config import check_number
from roctune.errors import ConfigError, RoctuneError
from roctune.hardware.choices import DEVICES, DTYPES
from roctune.serve.images import DEFAULT_MAX_IMAGES, DEFAULT_MAX_PIXELS


# roctune's own engine's settings, which vLLM has no counterpart for: set with --engine vllm, they are refused.
ROCTUNE_ENGINE_ONLY = ("adapter_root", "batch_wait_ms", "max_tokens_limit", "max_body_bytes", "max_stored_responses",
                       "threads", "max_images", "max_image_pixels")


def register(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible API server for a model and its adapters",
                       description=__doc__)
    p.add_argument("--model", metavar="NAME", help="base model (default: the one the adapters were trained on, "
                   "from their run.yaml; without adapters the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--adapter", metavar="NAME=DIR", action="append", default=[],
                   help="serve the adapter in DIR as model NAME (repeatable)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' (default: $ROCTUNE_API_KEY)")
    p.add_argument("--allow-no-key", action="store_true",
                   help="serve a non-loopback --host without an API key (refused otherwise: anyone who can reach "
                   "the port could use the model)")
    p.add_argument("--adapter-root", metavar="DIR",
                   help="admin endpoints may load adapters from folders under DIR (and nowhere else)")
    p.add_argument("--max-batch", type=int, default=8, help="requests decoded together (default 8)")
    p.add_argument("--batch-wait-ms", type=float, default=5.0,
                   help="how long a batch waits for more requests before it starts (default 5)")
    p.add_argument("--max-tokens-limit", type=int, default=1024,
                   help="largest max_tokens a request may ask for (default 1024; larger: HTTP 422)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20,
                   help="largest request body (default 1 MiB; images come inside it, as data URLs)")
    p.add_argument("--max-images", type=int, default=DEFAULT_MAX_IMAGES,
                   help=f"images one chat request may hold, for a vision-language model (default {DEFAULT_MAX_IMAGES})")
    p.add_argument("--max-image-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                   help=f"pixels one image may have, read from its header before decoding (default {DEFAULT_MAX_PIXELS:,})")
    p.add_argument("--max-stored-responses", type=int, default=256,
                   help="POST /v1/responses: answers kept in memory for previous_response_id (default 256; the "
                   "least recently used go first)")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads for the model (default: torch's choice; 1 is often faster on a busy CPU)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"], default="info")
    p.add_argument("--engine", choices=["roctune", "vllm"], default="roctune",
                   help="roctune (default), or vllm: start vLLM's OpenAI server on the same base and adapters")
    p.add_argument("--vllm-python", metavar="PATH",
                   help="with --engine vllm: the python that has vLLM (default: $ROCTUNE_VLLM_PYTHON, else the "
                   "repository's .venv-vllm from `make vllm`)")
    p.set_defaults(func=run, engine_only_defaults={d: p.get_default(d) for d in ROCTUNE_ENGINE_ONLY})


def run(args) -> int:
    from roctune.serve import Settings, bind_socket, build_engine, create_app, parse_adapter_specs
    from roctune.serve.adapters import adapters_base
    from roctune.hardware.network import is_loopback
    from roctune.data.images import ImageLimits
    from roctune.serve.images import ImageSettings
    from roctune.serve.server import check_host, uvicorn_config

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: expected 0-65535")
    for flag, value in (("--max-batch", args.max_batch), ("--max-tokens-limit", args.max_tokens_limit),
                        ("--max-body-bytes", args.max_body_bytes),
                        ("--max-stored-responses", args.max_stored_responses), ("--max-images", args.max_images),
                        ("--max-image-pixels", args.max_image_pixels)):
        check_number(flag, value, ge=1)
    check_number("--threads", args.threads, ge=0)
    check_number("--batch-wait-ms", args.batch_wait_ms, ge=0, le=60_000)  # NaN and inf too: a batch must start
    root = args.adapter_root
    if root is not None and not os.path.isdir(root):
        raise ConfigError(f"--adapter-root {root}: no such directory")
    api_key = args.api_key or os.environ.get("ROCTUNE_API_KEY") or None
    check_host(args.host, api_key, args.allow_no_key)
    adapters = parse_adapter_specs(args.adapter)
    args.model, template = adapters_base(args.model, adapters)  # without --model: the adapters' base (run.yaml)
    if args.engine == "vllm":
        return run_vllm(args, adapters, api_key, template)
    sock = bind_socket(args.host, args.port)  # fail fast on a busy port, before loading the model
    if not is_loopback(args.host) and not api_key:
        print(f"roctune serve: warning: listening on {args.host} without an API key (--allow-no-key); anyone who "
              "can reach this port can use the model", file=sys.stderr)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    engine = build_engine(args.model, adapters, device=args.device, dtype=args.dtype, max_batch=args.max_batch,
                          batch_wait_ms=args.batch_wait_ms, trust_remote_code=args.trust_remote_code,
                          template=template)
    images = ImageSettings(args.max_images, ImageLimits(max_bytes=args.max_body_bytes, max_pixels=args.max_image_pixels))
    settings = Settings(api_key=api_key, adapter_root=os.path.abspath(root) if root else None,
                        max_tokens_limit=args.max_tokens_limit, max_body_bytes=args.max_body_bytes,
                        max_stored_responses=args.max_stored_responses, images=images)
    app = create_app(engine, settings)
    import uvicorn

    host, port = sock.getsockname()[:2]
    names = ", ".join(engine.model_ids())
    print(f"roctune serve: http://{host}:{port}/v1 on {engine.device} ({engine.dtype}); models: {names}",
          flush=True)
    engine.start()
    try:
        uvicorn.Server(uvicorn_config(app, args.log_level)).run(sockets=[sock])
    finally:
        engine.stop()
        sock.close()
    return 0


def run_vllm(args, adapters: list[tuple[str, str]], api_key: str | None, template: str | None = None) -> int:
    """vLLM's server in a child process, after every check; its exit status is ours."""
    import subprocess

    from roctune.hardware.vllm import find_vllm_python
    from roctune.interrupts import end_child
    from roctune.serve import bind_socket
    from roctune.serve.vllm import prepare, shown

    for dest, default in args.engine_only_defaults.items():
        if getattr(args, dest) != default:
            raise ConfigError(f"--{dest.replace('_', '-')} works with --engine roctune only; drop it for vLLM")
    python = find_vllm_python(args.vllm_python)
    launch = prepare(args.model, adapters, python=python, host=args.host, port=args.port, api_key=api_key,
                     device=args.device, dtype=args.dtype, max_batch=args.max_batch,
                     trust_remote_code=args.trust_remote_code, template=template)
    bind_socket(args.host, args.port).close()  # a busy port fails here, in one line, not deep in vLLM's log
    for note in launch.notes:
        print(f"roctune serve: {note}", file=sys.stderr)
    print(f"roctune serve: starting vLLM: {shown(launch.argv)}", flush=True)
    proc = subprocess.Popen(launch.argv, env={**os.environ, **launch.env})
    # vLLM stops with us: a SIGTERM or SIGINT sent to roctune alone arrives as KeyboardInterrupt
    # (roctune.interrupts) and is passed on as SIGTERM, on which vLLM stops its engine processes itself.
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        end_child(proc)
        raise
    if rc == 0:  # a server ends when it is stopped; one that ends by itself did not serve
        raise RoctuneError(f"vLLM's server ({launch.argv[0]}) exited by itself with status 0 without serving; "
                           "check --vllm-python and the output above")
    return rc
