"""Reference engine + the ordinary agent, in one process, on loopback ports chosen by the OS.

For every engine a scenario starts (scenarios.py takes an `engine_factory`), `Harness.attached`:

1. starts the engine (G3/G4 in a temporary directory, KV-event PUB + replay ROUTER on port 0) and its
   OpenAI/metrics HTTP server on 127.0.0.1:0;
2. writes the agent's configuration as TOML text — what an operator would write for this engine — and
   builds the agent from it with `load_config` + `build_agent` (no environment overrides, so a
   `KVSCOPE_*` variable in the caller's shell cannot change the verdict);
3. once the OTLP receiver listens, points the engine's span exporter at it;
4. yields the engine to the scenario; afterwards waits until the engine is idle (write-behind landed,
   spans flushed) and the agent's totals stopped changing across two collections of every collector,
   then captures both sides (`RunCapture`) and stops them.

Ground truth is what the engine itself knows: its per-request truth records, its tier store at the
end, and every Transfer its store reported (a tally kept by a subclass, since background write-behind
transfers belong to no request). What the agent measured is read the way an operator reads it: its
own /metrics exposition over HTTP, and the correlation engine's per-request JSONL.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvscope.agent.app.wiring import Agent, build_agent, components
from kvscope.agent.config.settings import load_config
from kvscope.agent.core.tiers import STORAGE_TIERS
from kvscope.agent.tools.reference.device import DeviceSamples
from kvscope.agent.tools.reference.engine import Engine, EngineConfig
from kvscope.agent.tools.reference.openai_server import ReferenceServer
from kvscope.agent.tools.reference.tierstore import Transfer
from kvscope.agent.tools.reference.tracing import RequestTracer
from kvscope.agent.tools.reference.truth import RequestTruth
from kvscope.collectors.host.inputs import block_device_of

log = logging.getLogger("kvscope.selftest")

ENGINE_KIND = "reference"
# what the reference engine's /metrics needs (vllm_dialect.py): its G4 hits arrive as vLLM's
# "external_unspecified" source, and its tiering labels are 1:fs (G3) and 2:fs (G4)
SOURCE_TIERS = {"device": "G1", "host": "G2", "disk": "G3", "external_unspecified": "G4"}
TIERING_TIERS = {"1:fs": "G3", "2:fs": "G4"}
# The correlation engine counts fetch stall once its horizon (now - this) passes a stretch: short here,
# so a run settles quickly; _settle waits for the horizon to pass the last request.
STALL_SETTLE_SECONDS = 0.5
# how close the aggregate's component seconds must come to the TTFT sum for the run to count as wholly
# attributed (float sums of the same seconds, added in another order)
AGGREGATE_WHOLE_RELATIVE = 1e-6
# totals that must stop changing before the run counts as seen (names in the agent's store)
SETTLE_METRICS = ("kvscope_ttft_seconds", "kvscope_kv_hit_tokens_total", "kvscope_kv_transfer_bytes_total",
                  "kvscope_kv_resident_blocks", "kvscope_kv_events_total", "kvscope_requests_attributed_total",
                  "kvscope_ttft_attributed_seconds_total", "kvscope_kv_computed_tokens_total")


class TallyingEngine(Engine):
    """The reference engine, also tallying every Transfer its store reports (request and background)."""

    def __init__(self, config: EngineConfig) -> None:
        self.tally: dict[str, list[float]] = {}
        self._tally_lock = threading.Lock()
        super().__init__(config)

    def transfer(self, t: Transfer) -> None:
        with self._tally_lock:
            entry = self.tally.setdefault(f"{t.src}->{t.dst}", [0.0, 0.0])
            entry[0] += t.bytes
            entry[1] += t.seconds
        super().transfer(t)


@dataclass
class RunCapture:
    """Both sides of one engine run, captured once the agent had seen everything."""

    label: str
    truths: list[RequestTruth]
    link_bytes: dict[str, int]  # every transfer the store made, by "src->dst"
    resident: dict[str, int]  # blocks per tier in the engine's store at the end
    exposition: str  # the agent's /metrics text at the end
    requests: list[dict[str, Any]]  # the correlation engine's per-request lines
    settled: bool
    settle_seconds: float
    disk_device: str | None
    block_tokens: int
    config: EngineConfig


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


def _table(d: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{_toml_str(k)} = {_toml_str(v)}" for k, v in d.items()) + " }"


def agent_config_text(metrics_url: str, kv_endpoint: str, kv_replay: str, model: str, disk_device: str | None,
                      requests_jsonl: Path, interval: float, kv_bytes_per_token: int,
                      reuse_sample_rate: float | None = None, extra: str = "") -> str:
    """The agent's configuration for one reference engine, as an operator would write it (`extra`: more
    tables at the end; `reuse_sample_rate`: the KV-event collector's, when not its default)."""
    rate = f"reuse_sample_rate = {reuse_sample_rate}\n" if reuse_sample_rate is not None else ""
    disk = (f"include = [{_toml_str(disk_device)}]  # the disk holding G3/G4" if disk_device
            else "enabled = false  # G3/G4 are not on a block device (tmpfs, overlay)")
    return agent_config_head(interval) + f"""\
[collectors.vllm]
enabled = true
urls = [{_toml_str(metrics_url)}]
engine = "{ENGINE_KIND}"
cache_hit_source_tiers = {_table(SOURCE_TIERS)}
tiering_tiers = {_table(TIERING_TIERS)}

[collectors.vllm_kv_events]
enabled = true
endpoint = {_toml_str(kv_endpoint)}
replay_endpoint = {_toml_str(kv_replay)}
engine = "{ENGINE_KIND}"
model = {_toml_str(model)}
kv_bytes_per_token = {kv_bytes_per_token}  # the model's KV geometry (kvscope kv-size prints it)
{rate}
""" + agent_config_tail(model, requests_jsonl, disk) + extra


def agent_config_head(interval: float) -> str:
    """The tables every self-test agent starts with: its interval and a /metrics port of its own."""
    return f"""\
[agent]
interval = {interval}
log_level = "warning"

[exporters.prometheus]
listen = "127.0.0.1:0"

"""


def agent_config_tail(model: str, requests_jsonl: Path, disk: str) -> str:
    """The tables every self-test agent ends with: the reference engine's traces, attributed requests to
    `requests_jsonl`, the disk collector as `disk` says, the host collectors the checks do not read off."""
    return f"""\
[collectors.otlp_traces]
enabled = true
listen = "127.0.0.1:0"
engine = "{ENGINE_KIND}"
model = {_toml_str(model)}

[analyses.correlation]
stall_settle_seconds = {STALL_SETTLE_SECONDS}

[exporters.jsonl]
enabled = true
path = {_toml_str(str(requests_jsonl))}

[collectors.disk]
{disk}

[collectors.nvml]
enabled = false

[collectors.network]
enabled = false

[collectors.rdma]
enabled = false
"""


Hook = Callable[[str, Engine, str, str], None]  # label, engine, engine URL, agent URL


@dataclass
class Harness:
    """Engine factory for scenarios; collects a RunCapture per engine started."""

    workdir: Path
    interval: float = 0.2
    settle_deadline: float = 30.0
    on_start: Hook | None = None
    on_stop: Callable[[str], None] | None = None
    keep_serving: set[str] = field(default_factory=set)  # labels left running until close()
    prefix: str = ""  # put before each run's label ("sweep " -> "sweep cache"), when one harness runs several
    reuse_sample_rate: float | None = None  # the KV-event collector's (None: its default)
    extra_config: str = ""  # more agent configuration (TOML tables), e.g. [analyses.whatif]
    runs: list[RunCapture] = field(default_factory=list)
    _deferred: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        while self._deferred:
            self._deferred.pop()()

    @staticmethod
    def label_of(config: EngineConfig) -> str:
        return "recompute" if not config.prefix_caching else "cache"

    @contextmanager
    def attached(self, config: EngineConfig) -> Iterator[Engine]:
        label = self.prefix + self.label_of(config)
        run_dir = self.workdir / f"{len(self.runs)}-{label.replace(' ', '-')}"
        run_dir.mkdir(parents=True, exist_ok=True)
        engine = TallyingEngine(config)
        server = ReferenceServer(engine)
        agent: Agent | None = None
        try:
            engine.start()
            server.start()
            pub = engine.publisher
            if pub is None or pub.replay_endpoint is None:
                raise ValueError("the selftest needs the engine's KV-event endpoint and replay endpoint")
            device = block_device_of(config.data_dir)
            text = agent_config_text(f"{server.url}/metrics", pub.endpoint, pub.replay_endpoint,
                                     config.served_model_name, device, run_dir / "requests.jsonl", self.interval,
                                     config.geometry.bytes_per_token, self.reuse_sample_rate, self.extra_config)
            (run_dir / "kvscope.toml").write_text(text)
            # the device slot stands in for the GPU the NVML collector would report (fetch stall)
            device_slot = DeviceSamples(lambda: list(engine.device_intervals), engine.wall_at(engine.clock()),
                                        time.time)
            agent = build_agent(load_config(text, components(), environ={}, origin="selftest"),
                                gpu_intervals=device_slot)
            agent.start()
            engine.tracer = RequestTracer(f"http://127.0.0.1:{self._receiver_port(agent)}")
            assert agent.server is not None
            agent_url = f"http://127.0.0.1:{agent.server.port}/metrics"
            if self.on_start is not None:
                self.on_start(label, engine, f"{server.url}/metrics", agent_url)
            yield engine
            engine.store.flush()
            engine.tracer.provider.force_flush()
            settled, waited = self._settle(agent, len(engine.truth.records))
            self.runs.append(RunCapture(
                label, list(engine.truth.records), {k: int(v[0]) for k, v in engine.tally.items()},
                {str(t): engine.store.resident(t) for t in STORAGE_TIERS}, _get(agent_url),
                _read_jsonl(run_dir / "requests.jsonl"), settled, waited, device, config.block_tokens, config))
        except BaseException:
            self._stop(agent, server, engine)
            raise
        if self.on_stop is not None:
            self.on_stop(label)
        if label in self.keep_serving:
            self._deferred.append(lambda: self._stop(agent, server, engine))
        else:
            self._stop(agent, server, engine)

    @staticmethod
    def _stop(agent: Agent | None, server: ReferenceServer, engine: Engine) -> None:
        if agent is not None:
            agent.stop()
        server.stop()
        engine.stop()

    def _receiver_port(self, agent: Agent) -> int:
        """The OTLP receiver binds in its start(), which the scheduler calls before its first collection."""
        receiver = agent.collectors["otlp_traces"]
        deadline = time.monotonic() + 10.0
        while (agent.store.value("kvscope_collector_runs_total", ("otlp_traces",)) or 0) < 1:
            if time.monotonic() > deadline:
                raise TimeoutError("the otlp_traces receiver did not start within 10 s")
            time.sleep(0.01)
        return int(receiver.address[1])  # type: ignore[attr-defined]

    def _settle(self, agent: Agent, requests: int) -> tuple[bool, float]:
        """Waits until every collector ran again and the totals did not change across two collections,
        with every request counted; (settled, seconds waited). False at the deadline."""
        store = agent.store
        # an idle job (an analysis with none of its inputs enabled) ran once at start and does not run again
        jobs = [(f"kvscope_{j.kind}_runs_total", j.name) for j in agent.scheduler.jobs if not j.idle]
        start = time.monotonic()
        deadline = start + self.settle_deadline

        def runs() -> list[float]:
            return [store.value(metric, (name,)) or 0.0 for metric, name in jobs]

        def fingerprint() -> tuple[Any, ...]:
            return tuple(tuple(sorted(store.values(name).items())) for name in SETTLE_METRICS)

        def complete() -> bool:
            ttft = sum(store.values("kvscope_ttft_seconds").values())
            attributed = sum(store.values("kvscope_requests_attributed_total").values())
            return ttft == requests and attributed == requests and aggregate_whole()

        def aggregate_whole() -> bool:
            """The aggregate attribution's components add up to the TTFT sum: no window is still held for
            phases or records that come after the TTFTs (it would leave the run's shares without it)."""
            ttft = math.fsum(store.histogram("kvscope_ttft_seconds", labels)[2]
                             for labels in store.values("kvscope_ttft_seconds"))
            parts = math.fsum(store.values("kvscope_ttft_attributed_seconds_total").values())
            return abs(parts - ttft) <= AGGREGATE_WHOLE_RELATIVE * max(ttft, 1.0)

        previous = None
        complete_since: float | None = None
        while time.monotonic() < deadline:
            before = runs()
            while any(a <= b for a, b in zip(runs(), before, strict=True)):
                if time.monotonic() > deadline:
                    return False, time.monotonic() - start
                time.sleep(self.interval / 10)
                agent.scheduler.refresh()  # a reader: the collectors that run when read run now
            current = fingerprint()
            if complete_since is None and complete():
                complete_since = time.monotonic()
            # every record is in; fetch stall is final once the engine's horizon has passed the last of them
            stall_final = (complete_since is not None
                           and time.monotonic() - complete_since > STALL_SETTLE_SECONDS + 2 * self.interval)
            if current == previous and stall_final and complete():
                return True, time.monotonic() - start
            previous = current
        return False, time.monotonic() - start


def _get(url: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        return bytes(response.read()).decode()


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
