"""What the HTTP tests share: a certificate, raw sockets, timed scrapes, a real `kvscope run` process."""

from __future__ import annotations

import base64
import http.client
import resource
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from testkit.paths import ROOT


@dataclass(frozen=True)
class Certificate:
    cert: Path
    key: Path

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.cert))
        context.check_hostname = False
        return context


def self_signed(directory: Path) -> Certificate:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return Certificate(cert, key)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def scrape(port: int, path: str = "/metrics", headers: dict[str, str] | None = None,
           context: ssl.SSLContext | None = None, timeout: float = 10.0) -> tuple[int, float]:
    """(status, seconds) of one GET on a new connection; status 0 when it failed (timeout, reset)."""
    start = time.perf_counter()
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        response.read()
        status = response.status
    except OSError:
        status = 0
    finally:
        conn.close()
    return status, time.perf_counter() - start


def exchange(port: int, data: bytes, timeout: float = 5.0) -> tuple[bytes, bool]:
    """Sends `data` and reads until the server closes or `timeout` passes: (reply, closed by the server)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_until_closed(sock, timeout)


def read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, bool]:
    reply = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return reply, False
        except ConnectionResetError:
            return reply, True
        if not data:
            return reply, True
        reply += data
    return reply, False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[str], timeout: float = 30.0) -> bool:
    """Whether `port` listens before `timeout` passes or `proc` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


@contextmanager
def kvscope_run(config: Path, log: Path, ports: tuple[int, ...], nofile: int | None = None,
                cwd: Path = ROOT) -> Iterator[subprocess.Popen[str]]:
    """`kvscope run --config CONFIG` as a process, its stderr in `log`, once every port in `ports` listens."""

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "kvscope.agent.app.cli", "run", "--config", str(config)],
                                cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, text=True, preexec_fn=limit)
    try:
        for port in ports:
            assert wait_listening(port, proc), f"kvscope run did not listen on {port}:\n{log.read_text()}"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
