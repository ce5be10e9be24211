"""CPU per collection + exposition cycle of the host collectors, next to node_exporter's per scrape.

Reference (measured in the same run): `prometheus-node-exporter --collector.disable-defaults
--collector.diskstats --collector.netdev --collector.infiniband --collector.mountstats` on a free
loopback port; utime+stime of its process from /proc/<pid>/stat around 1000 keep-alive scrapes,
plain and with `Accept-Encoding: gzip` (shared/facts/perf-baselines.md §1 and appendix).

kvscope, two ways:
1. in process: `collect()` of disk, network, rdma, process -> `Store.ingest` -> `TextRenderer.render`,
   `time.process_time` around N cycles;
2. over HTTP, measured exactly like node_exporter: a child process (this file with `--serve`) runs one
   full collection cycle per GET and then serves the exposition through `exporters.http.MetricsServer`;
   its utime+stime from /proc/<pid>/stat around 1000 keep-alive scrapes, plain and gzip.

Both exporters read this machine's real /proc and /sys. Prints a table with medians (min-max) over
rounds, sample counts of both pages, and the ratio. Runs in well under two minutes on 2 cores.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvscope.agent.catalogue import AGENT_METRICS, Catalogue
from kvscope.agent.pipeline import Collector, CollectorContext
from kvscope.agent.readings import Reading
from kvscope.agent.store import Store
from kvscope.collectors import disk, network, process, rdma
from kvscope.exporters.http import MetricsServer
from kvscope.exporters.prometheus import TextRenderer

MODULES = (disk, network, rdma, process)
ROUNDS = 3
SCRAPES = 1000
WARMUP = 50
CYCLES = 1000
CLK_TCK = os.sysconf("SC_CLK_TCK")
NODE_EXPORTER_FLAGS = ("--collector.disable-defaults", "--collector.diskstats", "--collector.netdev",
                       "--collector.infiniband", "--collector.mountstats")


def host_collectors() -> list[tuple[str, Collector]]:
    context = CollectorContext()
    return [(m.SPEC.name, m.SPEC.factory(m.SPEC.options(), context)) for m in MODULES]


def host_store() -> Store:
    return Store(Catalogue([*AGENT_METRICS, *(spec for m in MODULES for spec in m.METRICS)]))


def cycle(store: Store, collectors: list[tuple[str, Collector]]) -> None:
    now = time.time()
    for name, collector in collectors:
        readings: list[Reading] = list(collector.collect())
        store.ingest(name, readings, now)


# -- the child: a kvscope exporter that runs one collection cycle per scrape ----------------------


def serve() -> None:
    store, collectors = host_store(), host_collectors()

    class CyclingServer(MetricsServer):
        def exposition(self, accept: str) -> tuple[bytes, str]:
            cycle(store, collectors)
            return super().exposition(accept)


    server = CyclingServer(store, "127.0.0.1", 0)
    server.start()
    print(server.port, flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop()


# -- measuring ----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def scrape_rounds(pid: int, port: int, gzip: bool) -> tuple[list[float], list[float], bytes, int]:
    """(CPU ms per scrape per round, wall ms per scrape per round, last plain body, last wire size)."""
    headers = {"Accept-Encoding": "gzip"} if gzip else {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = b""
    for _ in range(WARMUP):
        conn.request("GET", "/metrics", headers=headers)
        body = conn.getresponse().read()
    cpu, wall = [], []
    for _ in range(ROUNDS):
        c0, w0 = cpu_seconds(pid), time.perf_counter()
        for _ in range(SCRAPES):
            conn.request("GET", "/metrics", headers=headers)
            body = conn.getresponse().read()
        cpu.append((cpu_seconds(pid) - c0) / SCRAPES * 1e3)
        wall.append((time.perf_counter() - w0) / SCRAPES * 1e3)
    conn.request("GET", "/metrics")
    plain = conn.getresponse().read()
    conn.close()
    return cpu, wall, plain, len(body)


def samples_in(page: bytes) -> tuple[int, int]:
    """(sample lines, of them the exporter's own data: node_* or kvscope_*)."""
    lines = [ln for ln in page.decode().splitlines() if ln and not ln.startswith("#")]
    return len(lines), sum(1 for ln in lines if ln.startswith(("node_", "kvscope_")))


def in_process() -> list[float]:
    store, collectors = host_store(), host_collectors()
    renderer = TextRenderer(store)
    for _ in range(50):
        cycle(store, collectors)
        renderer.render()
    out = []
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(CYCLES):
            cycle(store, collectors)
            renderer.render()
        out.append((time.process_time() - t0) / CYCLES * 1e3)
    return out


def breakdown(n: int = 2000) -> list[tuple[str, float]]:
    """CPU µs per call of each stage (medians are in the table above; this shows where it goes)."""
    store, collectors = host_store(), host_collectors()
    renderer = TextRenderer(store)
    cycle(store, collectors)
    out = []
    for name, collector in collectors:
        t0 = time.process_time()
        for _ in range(n):
            readings = list(collector.collect())
        out.append((f"{name}.collect ({len(readings)} readings)", (time.process_time() - t0) / n * 1e6))
        t0 = time.process_time()
        for _ in range(n):
            store.ingest(name, readings, 0.0)
        out.append((f"{name} Store.ingest", (time.process_time() - t0) / n * 1e6))
    t0 = time.process_time()
    for _ in range(n):
        renderer.render()
    out.append(("TextRenderer.render", (time.process_time() - t0) / n * 1e6))
    return out


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):6.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> int:
    node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if node_exporter is None:
        print("prometheus-node-exporter is not installed (make tools installs it)", file=sys.stderr)
        return 1
    results: dict[str, tuple[list[float], list[float], bytes, int]] = {}

    port = free_port()
    ne = subprocess.Popen([node_exporter, f"--web.listen-address=127.0.0.1:{port}", *NODE_EXPORTER_FLAGS],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port)
        for gz in (False, True):
            results[f"node_exporter {'gzip' if gz else 'plain'}"] = scrape_rounds(ne.pid, port, gz)
    finally:
        ne.terminate()
        ne.wait(10)

    kv = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True)
    try:
        assert kv.stdout is not None and kv.stdin is not None
        kv_port = int(kv.stdout.readline())
        for gz in (False, True):
            results[f"kvscope {'gzip' if gz else 'plain'}"] = scrape_rounds(kv.pid, kv_port, gz)
    finally:
        if kv.stdin is not None:
            kv.stdin.close()
        kv.wait(10)

    local = in_process()
    print(f"host collectors: one cycle = collect + ingest + exposition; {ROUNDS} rounds x {SCRAPES} keep-alive "
          f"scrapes each (after {WARMUP} warm-up), CPU = utime+stime of the serving process")
    print(f"{'exporter':<22} {'CPU ms/scrape med (min-max)':<30} {'wall ms/scrape':<16} {'body B':>7} "
          f"{'wire B':>7} {'samples (own)':>14}")
    for name, (cpu, wall, plain, wire) in results.items():
        total, own = samples_in(plain)
        print(f"{name:<22} {fmt(cpu):<30} {statistics.median(wall):<16.3f} {len(plain):>7} {wire:>7} "
              f"{f'{total} ({own})':>14}")
    print(f"{'kvscope in-process':<22} {fmt(local):<30} (collect+ingest+TextRenderer.render, "
          f"time.process_time, 5 rounds x {CYCLES})")
    for mode in ("plain", "gzip"):
        ours = statistics.median(results[f"kvscope {mode}"][0])
        ref = statistics.median(results[f"node_exporter {mode}"][0])
        print(f"ratio kvscope / node_exporter, {mode}: {ours / ref:.2f}")
    ref = statistics.median(results["node_exporter plain"][0])
    print(f"ratio kvscope in-process / node_exporter plain: {statistics.median(local) / ref:.2f}")
    print("where the in-process cycle goes (CPU µs per call):",
          ", ".join(f"{what} {us:.0f}" for what, us in breakdown()))
    print(f"CPU tick resolution: {1e3 / CLK_TCK / SCRAPES:.3f} ms per scrape over one round")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        raise SystemExit(main())
