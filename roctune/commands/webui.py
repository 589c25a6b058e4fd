"""`roctune webui`: a web page with Doctor, Data, Train, Chat and Export panels (needs the `webui` extra:
pip install 'roctune[webui]'; `make setup` installs it). Nothing leaves the machine: no share link, no analytics."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("webui", help="web UI: doctor, data checks, training with a live loss curve, chat, export",
                       description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    p.add_argument("--runs", default="runs", metavar="DIR", help="where new runs go by default (default ./runs)")
    p.set_defaults(func=run)


def run(args) -> int:
    import os

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from roctune.errors import ConfigError
    from roctune.webui import launch

    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535 (got {args.port})")
    print(f"roctune webui: serving on http://{args.host}:{args.port} (Ctrl-C stops it)", flush=True)
    launch(args.host, args.port, run_root=args.runs, block=True)
    return 0
