"""`roctune webui`: a web page with Doctor, Data, Train, Chat and Export panels (needs the `webui` extra:
pip install 'roctune[webui]'; `make setup` installs it). Nothing leaves the machine: no share link, no analytics.
The page reads and writes only inside --root; listening on anything but a loopback address needs a login."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("webui", help="web UI: doctor, data checks, training with a live loss curve, chat, export",
                       description=__doc__)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; any other address needs --auth or --auth-file)")
    p.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    p.add_argument("--root", default=".", metavar="DIR",
                   help="workspace: every path the page reads or writes must be inside it (default: this folder)")
    p.add_argument("--runs", default="runs", metavar="DIR",
                   help="where new runs go by default, inside --root (default runs)")
    p.add_argument("--auth", metavar="USER:PASS", help="login for the page and its API")
    p.add_argument("--auth-file", metavar="FILE", help="file whose first line is USER:PASS (kept out of `ps`)")
    p.add_argument("--lang", metavar="CODE",
                   help="the page's language, en or zh, for a browser that has not picked one on the page (default: "
                        "the browser's own language, else English)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let training started from the page run a model's own Python code (auto_map); off by "
                        "default, since anyone who reaches the page could then run code as you")
    p.set_defaults(func=run)


def run(args) -> int:
    import os

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from roctune.errors import ConfigError
    from roctune.webui import Workspace, check_host, launch, read_auth
    from roctune.webui.i18n import check_lang

    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535 (got {args.port})")
    check_lang(args.lang)
    auth = read_auth(args.auth, args.auth_file)
    check_host(args.host, auth)
    ws = Workspace(args.root)
    print(f"roctune webui: serving {ws.root} on http://{args.host}:{args.port} (Ctrl-C stops it)", flush=True)
    launch(args.host, args.port, run_root=args.runs, block=True, root=ws.root, auth=auth,
           trust_remote_code=args.trust_remote_code, lang=args.lang)
    return 0
