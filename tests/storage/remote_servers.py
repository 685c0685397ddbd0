"""A real S3 server on the loopback (moto's server mode, reached by s3fs through AWS_ENDPOINT_URL) and a
plain HTTP server, both started once per session, and one eager capture to serve from them."""
from __future__ import annotations

import functools
import http.server
import logging
import os
import socket
import threading
import time
from pathlib import Path

import pytest

BUCKET = "artifacts"
STARTUP_TIMEOUT = 30.0


class RequestLog(logging.Handler):
    """The request lines moto's server logs ("GET /bucket/key HTTP/1.1" 206 -, coloured)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def gets(self, key: str) -> int:
        return sum(f"GET /{BUCKET}/{key} " in line for line in self.lines)


def _wait_for(host: str, port: int) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no server on {host}:{port} after {STARTUP_TIMEOUT} s") from None
            time.sleep(0.05)


def _bounded(call, what: str) -> None:
    """`call()`, given STARTUP_TIMEOUT seconds (in a daemon thread, abandoned if it takes longer)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # reported in the test's thread
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(STARTUP_TIMEOUT)
    if thread.is_alive():
        raise TimeoutError(f"could not {what} within {STARTUP_TIMEOUT} s")
    if failure:
        raise failure[0]


@pytest.fixture(scope="session")
def s3_server():
    """(endpoint URL, request log, the environment a process needs to reach it with s3fs), the environment
    also set in this process while the session lasts."""
    pytest.importorskip("s3fs")
    server_module = pytest.importorskip("moto.server")
    log = RequestLog()
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.addHandler(log)
    werkzeug.setLevel(logging.INFO)
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    _bounded(server.start, "start moto's S3 server")  # start() itself waits for the server without a timeout
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {name: os.environ.get(name) for name in env}
    try:
        _wait_for(host, port)
        os.environ.update(env)
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem().mkdir(BUCKET)
        yield env["AWS_ENDPOINT_URL"], log, env
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _bounded(server.stop, "stop moto's S3 server")
        werkzeug.removeHandler(log)


@pytest.fixture
def s3(s3_server):
    """A fresh s3fs client (nothing cached from other tests' listings)."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    return s3fs.S3FileSystem(skip_instance_cache=True)


@pytest.fixture(scope="session")
def http_root(tmp_path_factory):
    """(base URL, directory it serves): a plain HTTP server on the loopback."""
    root = tmp_path_factory.mktemp("http-root")
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        _wait_for("127.0.0.1", server.server_address[1])
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        thread.join(timeout=10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:
        pass


@pytest.fixture(scope="session")
def eager_pair(tmp_path_factory) -> tuple[Path, Path]:
    """tests/cases.py's mlp_batchnorm captured once (MakeFx, eager backend), and a second capture of the
    plain function (to mismatch it with)."""
    import torch
    from cases import CASES

    import precompile

    directory = tmp_path_factory.mktemp("remote-capture")
    pairs = {}
    for name in ("mlp_batchnorm", "plain_function"):
        case = CASES[name]
        artifact, cache = directory / f"{name}.py", directory / f"{name}.cache"
        with torch.set_grad_enabled(case.grad), precompile.capture(
            case.fn, artifact_path=artifact, cache_path=cache, tracer=precompile.MakeFxTracer(), backend="eager"
        ) as cap:
            cap(*case.args())
        pairs[name] = (artifact, cache)
    return pairs
