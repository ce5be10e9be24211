"""The whole agent (`kvscope run`) subscribed to a KV-event publisher process: its CPU, memory, scrape latency
and loss counters at a given rate and batch size (bench/bench_kv_events.py part (b), bench/bench_kv_memory.py).

The agent runs the KV-event collector and the host collectors (collected when read: idle here) with the
correlation analysis, NVML and engine discovery off, so that its CPU is what the events cost it. Its CPU
is its process clock from the first batch to the last one applied (scrapes included: the run scrapes
/metrics once a second, as Prometheus would, and times each scrape).
"""

from __future__ import annotations

import gzip
import http.client
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "lib"))  # testkit; kvscope itself is installed
from kvscope.collectors.kv_events.collector import VllmKvEventsOptions  # noqa: E402
from kvscope.collectors.kv_events.subscriber import steady_window  # noqa: E402

FLAGS = ("--no-collector.nvml", "--no-collector.engine_discovery", "--no-analysis.correlation",
         "--no-collector.lustre", "--log.level", "warning")
_SAMPLE = re.compile(r'^(kvscope_kv_[a-z_]+)(?:\{([^}]*)\})? (\S+)$', re.M)


def process_cpu(pid: int) -> float:
    return time.clock_gettime(((~pid) << 3) | 2)  # the whole process' CPU clock, every thread


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


@dataclass
class LiveResult:
    rate: float  # offered block events per second
    events: int  # per batch
    sent: int  # batches
    applied: float  # block events the agent applied
    cpu: float  # seconds of agent CPU from the first batch to the last one applied
    seconds: float  # of sending
    wall: float  # seconds from the first batch to the last one accounted for
    idle_cpu_per_s: float  # the agent's CPU per second before the first batch
    rss_mib: float  # at the end
    hwm_mib: float  # peak
    rss_after_mib: float = 0.0  # after `settle` seconds of quiet
    dropped: float = 0.0
    missed: float = 0.0
    shed: float = 0.0
    scrapes_ms: list[float] = field(default_factory=list)

    @property
    def us_per_event(self) -> float:
        return self.cpu / max(self.applied, 1.0) * 1e6

    @property
    def core_share(self) -> float:
        """Of one core, while the events came and were handled."""
        return self.cpu / max(self.wall, self.seconds)

    @property
    def scrape_ms(self) -> float:
        return statistics.median(self.scrapes_ms) if self.scrapes_ms else 0.0


class Agent:
    """`kvscope run` subscribed to `endpoint`, serving /metrics on a free port."""

    def __init__(self, endpoint: str, port: int, extra: str = "") -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="bench-kv-")
        config = Path(self._dir.name) / "kvscope.toml"
        config.write_text(f'[collectors.vllm_kv_events]\nenabled = true\nendpoint = "{endpoint}"\n'
                          f'model = "bench"\n{extra}')
        self.port = port
        self.proc = subprocess.Popen([sys.executable, "-m", "kvscope.agent.app.cli", "run", "--config", str(config),
                                      f"--web.listen-address=127.0.0.1:{port}", *FLAGS], cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # it warns of the end
        deadline = time.monotonic() + 30
        while True:
            try:
                self.scrape()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def scrape(self) -> tuple[dict[str, float], float]:
        """(kvscope_kv_* samples summed by name, with `{type}` and `{tier}` kept; wall ms of the scrape)."""
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})  # one request, as Prometheus makes
        resp = conn.getresponse()
        body = resp.read()
        wall = (time.perf_counter() - t0) * 1e3
        conn.close()
        text = (gzip.decompress(body) if resp.getheader("Content-Encoding") == "gzip" else body).decode()
        out: dict[str, float] = {}
        for name, labels, value in _SAMPLE.findall(text):
            key = name
            for keep in ("type", "tier"):
                m = re.search(rf'{keep}="([^"]*)"', labels or "")
                if m:
                    key += f"{{{m.group(1)}}}"
            out[key] = out.get(key, 0.0) + float(value)
        return out, wall

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(20)
        self._dir.cleanup()


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(rate: float, events: int, seconds: float, settle: float = 0.0, extra: str = "") -> LiveResult:
    """One publisher at `rate` events/s in batches of `events`, for `seconds`, into a fresh agent."""
    pub = subprocess.Popen([sys.executable, str(ROOT / "bench" / "kv_publisher.py"), "--rate", str(rate),
                            "--events", str(events), "--seconds", str(seconds), "--wait"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert pub.stdin is not None and pub.stdout is not None
    endpoint = pub.stdout.readline().split()[1]
    agent = Agent(endpoint, free_port(), extra)
    try:
        assert pub.stdout.readline().strip() == "subscribed"
        pid = agent.proc.pid
        c0, t0 = process_cpu(pid), time.monotonic()
        time.sleep(2.0)
        idle = (process_cpu(pid) - c0) / (time.monotonic() - t0)
        c0, w0 = process_cpu(pid), time.monotonic()
        pub.stdin.write("go\n")
        pub.stdin.flush()
        scrapes: list[float] = []
        done = time.monotonic() + seconds
        while time.monotonic() < done:
            time.sleep(1.0)
            scrapes.append(agent.scrape()[1])
        sent_line = pub.stdout.readline().split()
        sent = int(sent_line[1])
        deadline = time.monotonic() + 60
        while True:  # until the agent has accounted for every batch (applied or counted lost)
            figures, _ = agent.scrape()
            applied = figures.get("kvscope_kv_events_total{BlockStored}", 0.0)
            dropped = figures.get("kvscope_kv_events_dropped_total", 0.0)
            if applied / events + dropped >= sent or time.monotonic() > deadline:
                break
            time.sleep(1.0)  # once a second, as Prometheus would: each scrape is the agent's CPU too
        cpu, wall = process_cpu(pid) - c0, time.monotonic() - w0 - 1.0  # less the publisher's closing pause
        pub.stdin.write("stop\n")  # it stops repeating its last batch, delivers its queue and exits
        pub.stdin.flush()
        pub.wait(30)
        result = LiveResult(rate, events, sent, applied, cpu, float(sent_line[3]), wall, idle,
                            status_kib(pid, "VmRSS") / 1024, status_kib(pid, "VmHWM") / 1024,
                            dropped=dropped, missed=figures.get("kvscope_kv_events_missed_total", 0.0),
                            shed=figures.get("kvscope_kv_events_shed_total", 0.0), scrapes_ms=scrapes)
        if settle:
            time.sleep(settle)
            result.rss_after_mib = status_kib(pid, "VmRSS") / 1024
        return result
    finally:
        agent.stop()
        if pub.poll() is None:
            pub.kill()


_BARE = """
import sys, time, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.SUB); s.setsockopt(zmq.RCVHWM, int(sys.argv[3]))
s.setsockopt(zmq.SUBSCRIBE, b""); s.connect(sys.argv[1])
print("ready", flush=True)
n, end, window = 0, time.monotonic() + float(sys.argv[2]), float(sys.argv[4])
while time.monotonic() < end:
    try:
        while True:
            s.recv(zmq.NOBLOCK, copy=False); s.recv(copy=False); s.recv(copy=False).buffer; n += 1
    except zmq.Again:
        time.sleep(window) if n else s.poll(100)
print(n, flush=True)
"""


def bare_floor(rate: float, events: int, seconds: float) -> float:
    """CPU seconds per block event of a bare subscriber process: a SUB socket with the agent's receive
    queue (rcvhwm) that only takes each message's three frames as the agent does (no copy), one look per
    window of the length the agent's socket thread would wait at this rate. What ZMQ and Python cost to
    receive, before any decoding."""
    rcvhwm = VllmKvEventsOptions.rcvhwm
    window = steady_window(events / rate, rcvhwm)
    pub = subprocess.Popen([sys.executable, str(ROOT / "bench" / "kv_publisher.py"), "--rate", str(rate),
                            "--events", str(events), "--seconds", str(seconds), "--wait"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert pub.stdin is not None and pub.stdout is not None
    endpoint = pub.stdout.readline().split()[1]
    bare = subprocess.Popen([sys.executable, "-c", _BARE, endpoint, str(seconds + 4), str(rcvhwm), str(window)],
                            stdout=subprocess.PIPE, text=True)
    assert bare.stdout is not None
    try:
        bare.stdout.readline()
        pub.stdout.readline()  # subscribed
        time.sleep(0.5)
        c0 = process_cpu(bare.pid)
        pub.stdin.write("go\n")
        pub.stdin.flush()
        pub.stdout.readline()
        cpu = process_cpu(bare.pid) - c0
        received = int(bare.stdout.readline())
        return cpu / max(received * events, 1)
    finally:
        for proc in (pub, bare):
            if proc.poll() is None:
                proc.kill()
