"""`kvscope run` as a process against hostile or careless peers, and its signals: what issue 11 measured,
measured again on the real agent (its HTTP servers, its file-descriptor limit, its memory, SIGHUP)."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from testkit.http import Certificate, basic, free_port, kvscope_run, read_until_closed, scrape, self_signed
from testkit.paths import FIXTURES

pytestmark = pytest.mark.integration
FIXTURE = FIXTURES / "correlation" / "otlp" / "llm_request.binpb"


def write_config(tmp_path: Path, metrics: int, otlp: int, web: str = "") -> Path:
    config = tmp_path / "kvscope.toml"
    config.write_text(f"[exporters.prometheus]\nlisten = '127.0.0.1:{metrics}'\nweb_config_file = '{web}'\n"
                      f"[collectors.otlp_traces]\nenabled = true\nlisten = '127.0.0.1:{otlp}'\n"
                      f"web_config_file = '{web}'\n")
    return config


def users(path: Path, password: bytes) -> None:
    path.write_text(f"basic_auth_users:\n  prom: '{bcrypt.hashpw(password, bcrypt.gensalt(rounds=4)).decode()}'\n")


def export(port: int, password: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=FIXTURE.read_bytes(), method="POST",
                                     headers={"Content-Type": "application/x-protobuf", **basic("prom", password)})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def wait_for(predicate: object, timeout: float = 10.0) -> bool:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def stop(proc: subprocess.Popen[str], log: Path, within: float) -> float:
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kvscope run did not stop within {within} s of SIGTERM")
    text = log.read_text()
    assert proc.returncode == 0, text
    assert "Traceback" not in text, text
    return time.monotonic() - start


def test_sighup_rereads_the_web_config_of_both_servers(tmp_path: Path) -> None:
    """Issue 11 #12: SIGHUP killed the agent without a clean stop. Now it re-reads the web config files."""
    metrics, otlp = free_port(), free_port()
    web, log = tmp_path / "web.yml", tmp_path / "stderr.log"
    users(web, b"old")
    with kvscope_run(write_config(tmp_path, metrics, otlp, str(web)), log, (metrics, otlp)) as proc:
        assert scrape(metrics, headers=basic("prom", "old"))[0] == 200
        users(web, b"new")
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: scrape(metrics, headers=basic("prom", "new"))[0] == 200), log.read_text()
        assert scrape(metrics, headers=basic("prom", "old"))[0] == 401
        assert export(otlp, "new") == 200 and export(otlp, "old") == 401
        assert "web config files re-read" in log.read_text()
        # a broken file is reported and the one in force stays
        web.write_text("basic_auth_users: [\n")
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "the previous web config stays in force" in log.read_text()), log.read_text()
        assert proc.poll() is None
        assert scrape(metrics, headers=basic("prom", "new"))[0] == 200 and export(otlp, "new") == 200
        stop(proc, log, within=10)


def test_sigterm_stops_promptly_with_idle_tls_connections_open(tmp_path: Path) -> None:
    """Issue 11 #3: with one silent connection on the HTTPS port, SIGTERM did not stop the agent in 20 s."""
    certificate: Certificate = self_signed(tmp_path)
    metrics, otlp = free_port(), free_port()
    web, log = tmp_path / "web.yml", tmp_path / "stderr.log"
    web.write_text(f"tls_server_config:\n  cert_file: {certificate.cert}\n  key_file: {certificate.key}\n")
    with kvscope_run(write_config(tmp_path, metrics, otlp, str(web)), log, (metrics, otlp)) as proc:
        silent = socket.create_connection(("127.0.0.1", metrics))
        partial = socket.create_connection(("127.0.0.1", metrics))
        partial.sendall(b"\x16\x03\x01")
        status, seconds = scrape(metrics, context=certificate.client_context(), timeout=10)
        assert status == 200 and seconds < 1.0  # measured ~5 ms
        assert stop(proc, log, within=10) < 5.0  # measured ~0.3 s
        silent.close()
        partial.close()


def test_idle_otlp_connections_at_nofile_1024_leave_metrics_up(tmp_path: Path) -> None:
    """Issue 11 #6: 1,042 idle OTLP connections at nofile=1024 made 5 of 5 scrapes time out."""
    metrics, otlp = free_port(), free_port()
    log = tmp_path / "stderr.log"
    idle: list[socket.socket] = []
    with kvscope_run(write_config(tmp_path, metrics, otlp), log, (metrics, otlp), nofile=1024) as proc:
        try:
            for _ in range(1100):
                idle.append(socket.create_connection(("127.0.0.1", otlp), timeout=5))
            results = [scrape(metrics, timeout=5) for _ in range(5)]
            assert [status for status, _ in results] == [200] * 5, log.read_text()
            assert max(seconds for _, seconds in results) < 1.0
            fds = len(list(Path(f"/proc/{proc.pid}/fd").iterdir()))
            assert fds < 200  # the receiver's 128 connections and the agent's own ~25 (measured 153-156), not 1,100
            assert export_unauthenticated(otlp) == 200  # and the receiver itself still takes exports
        finally:
            for sock in idle:
                sock.close()
        stop(proc, log, within=10)


def export_unauthenticated(port: int) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=FIXTURE.read_bytes(), method="POST",
                                     headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return int(response.status)


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_content_length_minus_one_does_not_grow_memory(tmp_path: Path) -> None:
    """Issue 11 #5: POST with Content-Length -1 to the default, unauthenticated /metrics port read until EOF:
    RSS 37 -> 339 MB for 300 MiB sent."""
    metrics, otlp = free_port(), free_port()
    log = tmp_path / "stderr.log"
    with kvscope_run(write_config(tmp_path, metrics, otlp), log, (metrics, otlp)) as proc:
        before = peak_rss_mib(proc.pid)
        sent = 0
        with socket.create_connection(("127.0.0.1", metrics), timeout=5) as sock:
            sock.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n")
            try:
                while sent < 128 << 20:
                    sock.sendall(b"\0" * (1 << 20))
                    sent += 1 << 20
            except OSError:
                pass  # the agent answered 400 and closed
            reply, _ = read_until_closed(sock, 2.0)
        assert sent < 64 << 20, f"the agent took {sent >> 20} MiB of a body it had refused"
        assert reply.startswith(b"HTTP/1.1 400") or reply == b""  # the 400 may be lost to the reset
        assert peak_rss_mib(proc.pid) - before < 16  # measured: +0-2 MiB (was +300 MiB)
        stop(proc, log, within=10)
