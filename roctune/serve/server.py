"""Running the app: `check_host` (a non-loopback address needs an API key, or --allow-no-key), `bind_socket`
(listen first, so a busy port fails before the model loads), `uvicorn_config` (uvicorn with `JsonErrorH11`, so
even a request too malformed for the app, e.g. a bad Content-Length, gets an OpenAI-shaped 400) and
`ServerThread`, uvicorn in a background thread for tests and scripts."""

import json
import socket
import threading
import time

from roctune.errors import ConfigError, RoctuneError
from roctune.hardware.network import is_loopback
from roctune.serve.errors import ApiError


def check_host(host: str, api_key: str | None, allow_no_key: bool) -> None:
    """Refuse to serve other machines without an API key unless the user said so (--allow-no-key)."""
    if not is_loopback(host) and not api_key and not allow_no_key:
        raise ConfigError(f"--host {host} lets other machines use the model and it has no API key: add --api-key KEY "
                          "(or set ROCTUNE_API_KEY), keep --host 127.0.0.1, or pass --allow-no-key to serve it open")


def _json_400_class():
    """uvicorn's h11 protocol, answering the requests it cannot parse (bad Content-Length, broken headers) with
    OpenAI's error shape instead of plain text."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class JsonErrorH11(H11Protocol):
        def send_400_response(self, msg: str) -> None:
            body = json.dumps(ApiError(400, f"malformed HTTP request: {msg}", code="invalid_http").body()).encode()
            headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                       (b"content-length", str(len(body)).encode())]
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                          h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

    return JsonErrorH11


def uvicorn_config(app, log_level: str = "warning"):
    import uvicorn

    return uvicorn.Config(app, log_level=log_level, lifespan="off", http=_json_400_class())


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one). Raises ConfigError when it cannot bind."""
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
        self.server = uvicorn.Server(uvicorn_config(app, log_level))
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
