"""The reference engine's Dynamo KVBM dialect: the KVBM leader's /metrics (Dynamo 0.9.0), on its own port.

What the seeds' system runs: vLLM 0.14.1 whose KV connector is Dynamo's KV Block Manager, which keeps a host
pool (G2) and a disk pool; the reference engine's G4 directory plays that disk pool (on a shared mount in
the seeds, IBM Storage Scale). KVBM counts *blocks* per direction (facts/engines.md §1.2, Dynamo 0.9.0
appendix), and its counters have no `_total` (Rust `prometheus` crate):

- the engine's G1 → G2 copies are `offload_blocks_d2h`; its G2 → G3/G4 writes `offload_blocks_h2d` (host →
  disk);
- a block brought to G1 from G2 is `onboard_blocks_h2d` (host → device); one brought from the disk pool is
  `onboard_blocks_d2d` (disk → device) — the engine reads the file through host memory, which KVBM 0.9
  does not count as a host step, so that read is not counted on its own;
- `matched_tokens` are the prompt tokens found in KVBM's tiers (G1 hits are vLLM's own prefix cache);
- the hit-rate gauges are KVBM's sliding window: over the last `window` requests, blocks found in the
  host (disk) pool over blocks looked up in KVBM (those G1 did not hold).
"""

from __future__ import annotations

import threading
from collections import deque

from kvscope.agent.core.tiers import Tier
from kvscope.agent.http.messages import Request, Response
from kvscope.agent.http.server import HttpServer
from kvscope.agent.tools.reference.tierstore import Transfer

HELP = {  # Dynamo's lib/llm/src/block_manager/metrics_kvbm.rs
    "offload_blocks_d2h": "The number of offload blocks from device to host",
    "offload_blocks_h2d": "The number of offload blocks from host to disk",
    "offload_blocks_d2d": "The number of offload blocks from device to disk (bypassing host memory)",
    "offload_blocks_d2o": "The number of offload blocks from device to object storage",
    "onboard_blocks_h2d": "The number of onboard blocks from host to device",
    "onboard_blocks_d2d": "The number of onboard blocks from disk to device",
    "onboard_blocks_o2d": "The number of onboard blocks from object storage to device",
    "matched_tokens": "The number of matched tokens",
    "object_read_failures": "The number of failed object storage reads",
    "object_write_failures": "The number of failed object storage writes",
}
RATE_HELP = {
    "host_cache_hit_rate": "Host cache hit rate (0.0-1.0) from the sliding window",
    "disk_cache_hit_rate": "Disk cache hit rate (0.0-1.0) from the sliding window",
    "object_cache_hit_rate": "Object storage cache hit rate (0.0-1.0) from the sliding window",
}
DISK_TIERS = (Tier.G3, Tier.G4)


class KvbmMetrics:
    """KVBM's counters, fed by the engine's store (transfers) and lookups; thread-safe (write-behind)."""

    def __init__(self, block_tokens: int, window: int = 32) -> None:
        self.block_tokens = block_tokens
        self.counters = dict.fromkeys(HELP, 0)
        self._window: deque[tuple[int, int, int]] = deque(maxlen=window)  # host, disk, queried blocks
        self._lock = threading.Lock()

    def transfer(self, t: Transfer) -> None:
        name = None
        if t.src is Tier.G1 and t.dst is Tier.G2:
            name = "offload_blocks_d2h"
        elif t.src is Tier.G2 and t.dst in DISK_TIERS:
            name = "offload_blocks_h2d"
        elif t.src is Tier.G2 and t.dst is Tier.G1:
            name = "onboard_blocks_d2d" if t.origin in DISK_TIERS else "onboard_blocks_h2d"
        if name is not None:
            with self._lock:
                self.counters[name] += 1

    def looked_up(self, prompt_tokens: int, hit_tokens: dict[Tier, int]) -> None:
        """At admission: what KVBM matched (tokens G1 did not hold, found in its pools)."""
        bt = self.block_tokens
        host = hit_tokens.get(Tier.G2, 0) // bt
        disk = sum(hit_tokens.get(t, 0) for t in DISK_TIERS) // bt
        queried = (prompt_tokens - hit_tokens.get(Tier.G1, 0)) // bt
        with self._lock:
            self.counters["matched_tokens"] += (host + disk) * bt
            self._window.append((host, disk, queried))

    def text(self) -> str:
        """The page in the Rust prometheus crate's text format: families sorted by name, no `_total`."""
        with self._lock:
            values: dict[str, float] = {name: float(v) for name, v in self.counters.items()}
            queried = sum(q for _, _, q in self._window)
            values["host_cache_hit_rate"] = sum(h for h, _, _ in self._window) / queried if queried else 0.0
            values["disk_cache_hit_rate"] = sum(d for _, d, _ in self._window) / queried if queried else 0.0
            values["object_cache_hit_rate"] = 0.0
        out = []
        for name in sorted(values):
            kind = "gauge" if name in RATE_HELP else "counter"
            value = values[name]
            shown = str(int(value)) if value == int(value) else repr(value)
            out.append(f"# HELP kvbm_{name} {HELP.get(name) or RATE_HELP[name]}\n# TYPE kvbm_{name} {kind}\n"
                       f"kvbm_{name} {shown}\n")
        return "".join(out)


class KvbmServer:
    """GET /metrics on its own port, as the KVBM leader serves it (DYN_KVBM_METRICS_PORT, default 6880)."""

    def __init__(self, metrics: KvbmMetrics, host: str = "127.0.0.1", port: int = 0) -> None:
        def serve(request: Request) -> Response:
            if request.path != "/metrics":
                return Response(404, b"not found\n", "text/plain; version=0.0.4")
            return Response(200, metrics.text().encode(), "text/plain; version=0.0.4")

        self.httpd = HttpServer("reference-kvbm", host, port, serve)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.port}/metrics"

    def start(self) -> None:
        self.httpd.start()

    def stop(self) -> None:
        self.httpd.stop()
