"""The agent's HTTP servers under hostile or careless clients, measured on a real `kvscope run` process.

Each case starts `python -m kvscope.agent.app.cli run` (from --checkout, default this repository) with
/metrics and the OTLP receiver on loopback ports, does something a peer can do, and reports what a
legitimate client sees. No case needs a setting the old servers lacked, so the same script measures a
checkout before and after a change:

- idle-tls: TCP connections to the HTTPS /metrics port that send nothing, or 3 bytes of a ClientHello;
  latency of HTTPS scrapes meanwhile, and how long SIGTERM takes to stop the agent.
- idle-conns: N idle TCP connections to the OTLP port, then to the /metrics port, with the agent's
  nofile limit at 1024; latency and failures of scrapes meanwhile.
- burst: 100 connects at once to /metrics; how many took longer than 0.5 s (a dropped SYN waits 1 s).
- auth: basic auth (bcrypt cost 10); time of a wrong password for a known user vs an unknown user, then
  scrape latency with cached credentials while 8 clients send wrong passwords.
- content-length: POST /metrics (the default, unauthenticated port) with Content-Length -1 followed by
  300 MiB; the agent's peak RSS, and traceback lines logged for Content-Length abc and 2**62.

Usage: python bench/bench_http.py [--checkout DIR] [--only CASE ...]. Runs in about two minutes.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import bcrypt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "lib"))  # testkit; kvscope itself is installed
MIB = 1 << 20

from testkit.http import free_port, kvscope_run  # noqa: E402


class Agent:
    def __init__(self, proc: subprocess.Popen[str], metrics: int, otlp: int, stderr: Path) -> None:
        self.proc, self.metrics, self.otlp, self.stderr = proc, metrics, otlp, stderr

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def log(self) -> str:
        return self.stderr.read_text()


@contextmanager
def agent(checkout: Path, tmp: Path, web_config: str = "", nofile: int | None = None) -> Iterator[Agent]:
    metrics, otlp = free_port(), free_port()
    config = tmp / "kvscope.toml"
    config.write_text(f"[exporters.prometheus]\nlisten = '127.0.0.1:{metrics}'\nweb_config_file = '{web_config}'\n"
                      f"[collectors.otlp_traces]\nenabled = true\nlisten = '127.0.0.1:{otlp}'\n")
    stderr = tmp / "stderr.log"
    with kvscope_run(config, stderr, (metrics, otlp), nofile, cwd=checkout) as proc:
        yield Agent(proc, metrics, otlp, stderr)


def scrape(port: int, context: ssl.SSLContext | None = None, headers: dict[str, str] | None = None,
           timeout: float = 30.0) -> tuple[float, int]:
    """(seconds, status) of one GET /metrics on a new connection; status 0 when it failed."""
    start = time.perf_counter()
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
    try:
        conn.request("GET", "/metrics", headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        status = resp.status
    except OSError:
        status = 0
    finally:
        conn.close()
    return time.perf_counter() - start, status


def summary(seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    return f"median {statistics.median(ms):.1f} ms, max {ms[-1]:.1f} ms (n={len(ms)})"


def self_signed(tmp: Path) -> ssl.SSLContext:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-keyout", str(tmp / "key.pem"),
                    "-out", str(tmp / "cert.pem")], check=True, capture_output=True)
    context = ssl.create_default_context(cafile=str(tmp / "cert.pem"))
    context.check_hostname = False
    return context


def case_idle_tls(checkout: Path, tmp: Path) -> None:
    context = self_signed(tmp)
    (tmp / "web.yml").write_text("tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n")
    with agent(checkout, tmp, str(tmp / "web.yml")) as a:
        print(f"idle-tls: baseline HTTPS scrape: {summary([scrape(a.metrics, context)[0] for _ in range(5)])}")
        silent = socket.create_connection(("127.0.0.1", a.metrics))
        partial = socket.create_connection(("127.0.0.1", a.metrics))
        partial.sendall(b"\x16\x03\x01")  # the first 3 bytes of a TLS record header
        time.sleep(0.2)
        results = [scrape(a.metrics, context, timeout=60) for _ in range(5)]
        failed = sum(1 for _, status in results if status != 200)
        print(f"idle-tls: HTTPS scrape with 2 idle connections open: {summary([s for s, _ in results])}, "
              f"{failed} failed")
        start = time.monotonic()
        a.proc.send_signal(signal.SIGTERM)
        try:
            a.proc.wait(timeout=30)
            print(f"idle-tls: SIGTERM to exit with the idle connections open: {time.monotonic() - start:.2f} s")
        except subprocess.TimeoutExpired:
            print("idle-tls: SIGTERM to exit with the idle connections open: still running after 30 s")
        silent.close()
        partial.close()


def open_idle(port: int, n: int) -> tuple[list[socket.socket], int]:
    """Up to n connections that send nothing, and how many connects failed (it stops after 10 in a row)."""
    out: list[socket.socket] = []
    failed = streak = 0
    while len(out) < n and streak < 10:
        s = socket.socket()
        s.settimeout(1)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            failed += 1
            streak += 1
            continue
        streak = 0
        out.append(s)
    return out, failed


def case_idle_conns(checkout: Path, tmp: Path, n: int = 1100) -> None:
    with agent(checkout, tmp, nofile=1024) as a:
        print(f"idle-conns: baseline scrape: {summary([scrape(a.metrics)[0] for _ in range(5)])}")
        for name, port in (("OTLP", a.otlp), ("/metrics", a.metrics)):
            idle, failed_connects = open_idle(port, n)
            time.sleep(0.5)
            results = [scrape(a.metrics, timeout=5) for _ in range(5)]
            failed = sum(1 for _, status in results if status != 200)
            print(f"idle-conns: {len(idle)} idle connections to the {name} port ({failed_connects} connects "
                  f"failed), nofile 1024: scrape "
                  f"{summary([s for s, _ in results])}, {failed} of {len(results)} failed (5 s timeout); "
                  f"agent alive: {a.proc.poll() is None}")
            for s in idle:
                s.close()
            time.sleep(1.0)


def case_burst(checkout: Path, tmp: Path, n: int = 100) -> None:
    with agent(checkout, tmp) as a:
        times: list[float] = []
        lock = threading.Lock()

        def connect() -> None:
            start = time.perf_counter()
            try:
                s = socket.create_connection(("127.0.0.1", a.metrics), timeout=10)
            except OSError:
                s = None
            with lock:
                times.append(time.perf_counter() - start)
            time.sleep(2)
            if s is not None:
                s.close()

        threads = [threading.Thread(target=connect) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        slow = sum(1 for t in times if t > 0.5)
        print(f"burst: {n} connects at once: {slow} took over 0.5 s; {summary(times)}")


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def case_auth(checkout: Path, tmp: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=10)).decode()
    (tmp / "web.yml").write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    with agent(checkout, tmp, str(tmp / "web.yml")) as a:
        scrape(a.metrics, headers=basic("prom", "s3cret"))  # verified once, cached from here on
        for round_ in range(2):  # the first round warms up; the second is reported
            known, unknown = [], []
            for i in range(10):  # interleaved, so that drifting load falls on both alike
                known.append(scrape(a.metrics, headers=basic("prom", f"wrong{round_}-{i}"))[0])
                unknown.append(scrape(a.metrics, headers=basic(f"nobody{round_}-{i}", "wrong"))[0])
        print(f"auth: known user, wrong password: {summary(known)}")
        print(f"auth: unknown user:               {summary(unknown)}")
        good = [scrape(a.metrics, headers=basic("prom", "s3cret"))[0] for _ in range(20)]
        print(f"auth: cached credentials, quiet:  {summary(good)}")
        stop = threading.Event()

        def attack(k: int) -> None:
            i = 0
            while not stop.is_set():
                scrape(a.metrics, headers=basic("prom", f"guess{k}-{i}"), timeout=10)
                i += 1

        attackers = [threading.Thread(target=attack, args=(k,)) for k in range(8)]
        for t in attackers:
            t.start()
        time.sleep(0.5)
        results = [scrape(a.metrics, headers=basic("prom", "s3cret"), timeout=10) for _ in range(20)]
        stop.set()
        for t in attackers:
            t.join()
        statuses = sorted({status for _, status in results})
        print(f"auth: cached credentials, 8 clients guessing: {summary([s for s, _ in results])}, "
              f"statuses {statuses}")


def case_content_length(checkout: Path, tmp: Path, send: int = 300 * MIB) -> None:
    with agent(checkout, tmp) as a:
        before = a.rss_mib()
        s = socket.create_connection(("127.0.0.1", a.metrics))
        s.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n")
        chunk, sent = b"\0" * MIB, 0
        s.settimeout(10)
        try:
            while sent < send:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        s.close()
        time.sleep(0.5)
        print(f"content-length: -1 then {sent / MIB:.0f} MiB sent: RSS {before:.0f} MiB before, peak "
              f"{a.peak_rss_mib():.0f} MiB")
        for value in (b"abc", str(2**62).encode()):
            lines_before = a.log().count("Traceback")
            c = socket.create_connection(("127.0.0.1", a.metrics), timeout=10)
            c.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: " + value + b"\r\n\r\n")
            try:
                reply = c.recv(200).split(b"\r\n", 1)[0].decode(errors="replace")
            except OSError as exc:
                reply = repr(exc)
            c.close()
            time.sleep(0.3)
            print(f"content-length: {value.decode()}: reply {reply!r}, tracebacks logged "
                  f"{a.log().count('Traceback') - lines_before}")


CASES: dict[str, Callable[[Path, Path], None]] = {
    "idle-tls": case_idle_tls, "idle-conns": case_idle_conns, "burst": case_burst, "auth": case_auth,
    "content-length": case_content_length,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkout", type=Path, default=ROOT)
    parser.add_argument("--only", nargs="*", choices=list(CASES), default=list(CASES))
    args = parser.parse_args()
    print(f"checkout {args.checkout}")
    for name in args.only:
        with tempfile.TemporaryDirectory(prefix=f"kvscope-bench-http-{name}-") as tmp:
            CASES[name](args.checkout.resolve(), Path(tmp))


if __name__ == "__main__":
    main()
