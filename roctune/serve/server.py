"""Running the app: `bind_socket` (listen first, so a busy port fails before the model loads) and `ServerThread`,
uvicorn in a background thread for tests and scripts."""

import socket
import threading
import time

from roctune.errors import ConfigError, RoctuneError


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
