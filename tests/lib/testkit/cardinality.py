"""Series per pod, measured: the agent as deployed (the Helm chart's sidecar or node-agent configuration, only
addresses changed) against real engine pages over HTTP, KV events over ZMQ and a replayed NVML, its own
/metrics read over HTTP and counted.

One `Configuration` per row of the cardinality budget (docs/cardinality.md, docs/cardinality.json). A series
is one sample line of the exposition (each histogram bucket, `_sum` and `_count` its own series), which is
what a Prometheus that scrapes the pod stores; Prometheus adds 5 of its own per target (`up`, `scrape_*`).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import zmq

from kvscope.agent.app.wiring import Agent, build_agent, components
from kvscope.agent.config.settings import load_config
from kvscope.agent.core.pipeline import CollectorContext, Components
from kvscope.agent.tools.reference.kv_publisher import BlockRemoved, BlockStored, KVEventPublisher
from kvscope.collectors.gpu import nvml
from testkit.advancing import advance
from testkit.engine_pages import PageServer, fixture_module, page
from testkit.http import free_port
from testkit.nvml_replay import NvmlReplay
from testkit.paths import FIXTURES, ROOT

SIDECAR = ROOT / "deploy" / "helm" / "kvscope" / "files" / "sidecar.toml"
NODE_AGENT = ROOT / "deploy" / "helm" / "kvscope" / "files" / "node-agent.toml"
BUDGET = ROOT / "docs" / "cardinality.json"
GROWTH_ALLOWED = 0.10
BLOCK_TOKENS = 16
ENGINE_URL = "http://localhost:8000/metrics"  # the sidecar's engine page, as sidecar.toml names it
# every run: collections 4 times a second; engine discovery off (on a shared machine it would find whatever
# else listens on localhost; in a pod it finds the engine the sidecar already scrapes)
FAST = "interval = 0.25\n"
NO_DISCOVERY = "[collectors.engine_discovery]\nenabled = false\n"


@dataclass(frozen=True)
class Configuration:
    key: str
    title: str
    base: Path  # the chart's configuration it starts from
    pages: dict[str, Callable[[], bytes]]  # URL in the configuration -> the page served there
    extra: str = ""  # TOML sections added to the chart's
    replace_text: dict[str, str] = field(default_factory=dict)  # the chart's text changed (first occurrence)
    kv_ranks: int = 0  # data-parallel ranks publishing KV events (the sidecar's vllm_kv_events)
    gpus: int = 0  # GPUs the NVML replay shows (the node agent)
    host_root: str = ""  # proc/sys fixture for the node agent's host collectors
    model: str = "openai/gpt-oss-120b"  # the served model, as the engine's page names it


def vllm_page(ranks: int) -> bytes:
    """vLLM 0.33.0 with the CPU offloading connector, `ranks` data-parallel engines (tests/fixtures/vllm)."""
    pages = fixture_module("vllm")
    built = pages.Page((0, 33), "cpu", cpu_kv_bytes=8 * 2**30)
    for rank in range(ranks):
        built.engine(rank)
    return str(built.text()).encode()


def eight_gpus() -> dict[str, Any]:
    """The real H200 recording (tests/fixtures/nvml/h200_real_auto.json) answered for 8 handles: every call
    on GPU 0 is also GPU 1..7's, each with its own UUID and PCI bus id."""
    recording: dict[str, Any] = json.loads((FIXTURES / "nvml" / "h200_real_auto.json").read_text())
    calls = []
    for call in recording["calls"]:
        if call["fn"] == "nvmlDeviceGetCount":
            calls.append({**call, "result": 8})
            continue
        if call["fn"] == "nvmlInit":
            calls.append(call)
            continue
        for gpu in range(8):
            args = json.loads(json.dumps(call["args"]).replace('{"handle": 0}', f'{{"handle": {gpu}}}'))
            if call["fn"] == "nvmlDeviceGetHandleByIndex":
                args, result = [gpu], {"handle": gpu}
            elif call["fn"] == "nvmlDeviceGetUUID":
                result = f"{call['result'][:-2]}{gpu:02d}"
            elif call["fn"] == "nvmlDeviceGetPciInfo":
                bus = f"{gpu + 6:02x}"
                result = {**call["result"], "busId": f"00000000:00:{bus}.0", "busIdLegacy": f"0000:00:{bus}.0"}
            else:
                result = call.get("result")
            calls.append({**call, "args": args, "result": result})
    return {**recording, "origin": f"{recording['origin']}; answered for 8 GPUs (testkit/cardinality.py)",
            "calls": calls, "defaults": {"nvmlShutdown": {"result": None}}}


def _replayed_nvml(recording: dict[str, Any]) -> Components:
    parts = components()

    def build(options: nvml.NvmlOptions, context: CollectorContext) -> nvml.NvmlCollector:
        return nvml.NvmlCollector(NvmlReplay(recording), options, context.clock, context.wall_clock,
                                  context.proc_root, None)

    collectors = dict(parts.collectors)
    collectors["nvml"] = replace(collectors["nvml"], factory=build)
    return Components(collectors, parts.analyses, parts.sinks)


def _kv_batch(rank: int, step: int) -> list[BlockStored | BlockRemoved]:
    """One engine step: a new block to G1 (chained to the last), the previous one offloaded to G2, one
    from a few steps back re-announced (a reuse), one older removed from G1."""
    def key(n: int) -> int:
        return rank << 32 | n

    tokens = [step % 50_000] * BLOCK_TOKENS
    events: list[BlockStored | BlockRemoved] = [
        BlockStored([key(step)], key(step - 1) if step else None, tokens, BLOCK_TOKENS, None, "GPU", None)]
    if step:
        events.append(BlockStored([key(step - 1)], None, tokens, BLOCK_TOKENS, None, "CPU", None))
    if step >= 4:
        events.append(BlockStored([key(step - 4)], None, tokens, BLOCK_TOKENS, None, "GPU", None))
    if step >= 8:
        events.append(BlockRemoved([key(step - 8)], "GPU"))
    return events


class Ticker:
    """Calls `tick()` every `period` seconds on a thread of its own, from `start()` until `close()`."""

    def __init__(self, period: float) -> None:
        self._period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def tick(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            self.tick()

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


class AdvancingPages(Ticker):
    """Page servers whose counters grow 1 % a tick (testkit/advancing.py), from a thread until closed."""

    def __init__(self) -> None:
        super().__init__(0.25)
        self.pages: list[tuple[PageServer, str]] = []
        self._ticks = 0

    def serve(self, body: bytes) -> PageServer:
        server = PageServer({"/metrics": body})
        server.__enter__()
        self.pages.append((server, body.decode()))
        return server

    def tick(self) -> None:
        self._ticks += 1
        for server, text in self.pages:
            server.routes["/metrics"] = advance(text, 1 + 0.01 * self._ticks).encode()

    def close(self) -> None:
        super().close()
        for server, _ in self.pages:
            server.__exit__(None, None, None)


class SpanSender(Ticker):
    """vLLM's `llm_request` spans (tests/fixtures/correlation/otlp/llm_request.binpb) posted to the
    sidecar's OTLP receiver twice a second, as vLLM's exporter posts its batches."""

    def __init__(self, url: str) -> None:
        super().__init__(0.5)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._request = urllib.request.Request(
            url, data=(FIXTURES / "correlation" / "otlp" / "llm_request.binpb").read_bytes(), method="POST",
            headers={"Content-Type": "application/x-protobuf"})

    def tick(self) -> None:
        with contextlib.suppress(OSError):
            self._opener.open(self._request, timeout=5).close()


class KvEngines(Ticker):
    """`ranks` KV-event publishers on consecutive ports (vLLM offsets each data-parallel rank's port by
    its rank), publishing engine steps from a thread until closed."""

    def __init__(self, ranks: int) -> None:
        super().__init__(0.02)
        self._step = 0
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.publishers: list[KVEventPublisher] = []
        for _ in range(20):
            base = free_port()
            try:
                for rank in range(ranks):
                    self.publishers.append(KVEventPublisher(self.ctx, f"tcp://127.0.0.1:{base + rank}",
                                                            data_parallel_rank=rank))
                break
            except zmq.ZMQError:  # a port above the free one was taken: try elsewhere
                for publisher in self.publishers:
                    publisher.close()
                self.publishers.clear()
        assert self.publishers, "no run of consecutive free ports for the KV-event publishers"
        self.endpoint = self.publishers[0].endpoint

    def tick(self) -> None:
        for rank, publisher in enumerate(self.publishers):
            publisher.publish(list(_kv_batch(rank, self._step)))
        self._step += 1

    def close(self) -> None:
        super().close()
        for publisher in self.publishers:
            publisher.close()
        self.ctx.destroy(0)


def series(exposition: str) -> Counter[str]:
    """Series per metric name (the sample's, so a histogram's _bucket, _sum and _count apart)."""
    out: Counter[str] = Counter()
    for line in exposition.splitlines():
        if line and not line.startswith("#"):
            out[line.split("{", 1)[0].split(" ", 1)[0]] += 1
    return out


def _scrape(url: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as response:
        return str(response.read().decode())


@contextlib.contextmanager
def running(config: Configuration) -> Iterator[tuple[Agent, str]]:
    """The agent of `config` running against its sources; yields it and its /metrics URL."""
    with contextlib.ExitStack() as stack:
        text = config.base.read_text()
        for old, new in config.replace_text.items():
            text = text.replace(old, new, 1)
        text = text.replace('model = "openai/gpt-oss-120b"', f'model = "{config.model}"') + "\n" + config.extra
        pages = AdvancingPages()
        stack.callback(pages.close)
        for url, body in config.pages.items():
            text = text.replace(url, pages.serve(body()).url(), 1)
        if config.kv_ranks:
            engines = KvEngines(config.kv_ranks)
            stack.callback(engines.close)
            text = text.replace("tcp://localhost:5557", engines.endpoint, 1)
            text = text.replace('replay_endpoint = "tcp://localhost:5558"', 'replay_endpoint = ""', 1)
            text = text.replace('[collectors.vllm_kv_events]\n',
                                f'[collectors.vllm_kv_events]\ndata_parallel_size = {config.kv_ranks}\n', 1)
        otlp = f"127.0.0.1:{free_port()}"
        text = text.replace("127.0.0.1:4318", otlp, 1)
        port = free_port()
        text = text.replace('listen = "0.0.0.0:9474"', f'listen = "127.0.0.1:{port}"', 1)
        text = text.replace('listen = "0.0.0.0:9475"', f'listen = "127.0.0.1:{port}"', 1)
        if config.host_root:
            root = FIXTURES / "host" / config.host_root
            text = text.replace('proc_root = "/host/proc"', f'proc_root = "{root / "proc"}"', 1)
            text = text.replace('sys_root = "/host/sys"', f'sys_root = "{root / "sys"}"', 1)
            text = text.replace('path = "1/net/dev"', 'path = "net/dev"', 1)  # the fixture has no pid 1
        text = text.replace("[agent]\n", "[agent]\n" + FAST, 1) if "[agent]\n" in text else f"[agent]\n{FAST}\n" + text
        if NO_DISCOVERY not in text:
            text += "\n" + NO_DISCOVERY
        parts = _replayed_nvml(eight_gpus()) if config.gpus else components()
        agent = build_agent(load_config(text, parts, environ={}, origin=config.key), parts)
        agent.start()
        stack.callback(agent.stop)
        pages.start()
        if config.kv_ranks:
            engines.start()
        if '[collectors.otlp_traces]\nenabled = true' in text:
            spans = SpanSender(f"http://{otlp}/v1/traces")
            stack.callback(spans.close)
            spans.start()
        yield agent, f"http://127.0.0.1:{port}/metrics"


def settled(url: str, settle: float = 3.0, deadline: float = 30.0) -> Counter[str]:
    """Series per metric at `url` once the count has held for 4 scrapes in a row after `settle` seconds (the
    analyses have run several windows and every collector several times)."""
    time.sleep(settle)
    end = time.monotonic() + deadline
    counts: list[Counter[str]] = []
    while time.monotonic() < end:
        counts.append(series(_scrape(url)))
        if len(counts) >= 4 and all(c == counts[-1] for c in counts[-4:]):
            return counts[-1]
        time.sleep(0.5)
    raise AssertionError(f"{url}: the series count did not settle in {deadline:.0f} s: "
                         f"{[sum(c.values()) for c in counts[-6:]]}")


def measure(config: Configuration) -> Counter[str]:
    with running(config) as (_, url):
        return settled(url)


def _lmcache_page() -> bytes:
    return page("lmcache", "on-vllm-0.20-page.prom")


SIDECAR_ONLY_ENGINE = "[analyses.whatif]\nenabled = false\n"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"  # the vLLM and LMCache pages' model
CONFIGURATIONS = (
    Configuration("vllm", "one vLLM engine (0.33, CPU offloading), what-if off", SIDECAR,
                  {ENGINE_URL: lambda: vllm_page(1)}, SIDECAR_ONLY_ENGINE, kv_ranks=1, model=LLAMA),
    Configuration("vllm-dp8", "vLLM with 8 data-parallel ranks, what-if off", SIDECAR,
                  {ENGINE_URL: lambda: vllm_page(8)}, SIDECAR_ONLY_ENGINE, kv_ranks=8, model=LLAMA),
    Configuration("vllm-whatif", "one vLLM engine with what-if on, its default scenarios (the sidecar's default)",
                  SIDECAR, {ENGINE_URL: lambda: vllm_page(1)}, kv_ranks=1, model=LLAMA),
    Configuration("vllm-lmcache", "vLLM + LMCache (LMCache's metrics on vLLM's page), what-if off", SIDECAR,
                  {ENGINE_URL: _lmcache_page, "http://localhost:8001/metrics": _lmcache_page},
                  SIDECAR_ONLY_ENGINE + '[collectors.lmcache]\nenabled = true\nurls = ["http://localhost:8001/metrics"]\n',
                  kv_ranks=1, model=LLAMA),
    Configuration("dynamo-kvbm", "Dynamo 0.9 KVBM + vLLM 0.14.1 worker + frontend (the seeds' pod), what-if off",
                  SIDECAR,
                  {ENGINE_URL: lambda: page("dynamo", "worker-0.9.0-vllm-0.14.1.prom"),
                   "http://localhost:6880/metrics": lambda: page("dynamo", "kvbm-0.9.0-seeds-g4.prom"),
                   "http://localhost:8002/metrics": lambda: page("dynamo", "frontend-0.9.0.prom"),
                   "http://localhost:8003/metrics": lambda: page("dynamo", "worker-0.9.0-vllm-0.14.1.prom")},
                  SIDECAR_ONLY_ENGINE
                  + '[collectors.dynamo_kvbm]\nenabled = true\nurls = ["http://localhost:6880/metrics"]\n'
                    'model = "openai/gpt-oss-120b"\nkv_bytes_per_token = 36864\n'
                    # the seeds' disk pool is on IBM Storage Scale, shared by every pod: G4
                    'disk_cache_dir = "/kvbm/pool"\ndisk_tier = "G4"\n'
                    'geometry_url = "http://localhost:8003/metrics"\n'
                  + '[collectors.dynamo]\nenabled = true\nurls = ["http://localhost:8002/metrics"]\n',
                  kv_ranks=1),
    Configuration("sglang-hicache", "SGLang with HiCache (hf3fs storage backend, TP 2), what-if off", SIDECAR,
                  {"http://localhost:30000/metrics": lambda: page("sglang", "hicache-hf3fs-underscore-tp2.prom")},
                  SIDECAR_ONLY_ENGINE + '[collectors.sglang]\nenabled = true\nurls = ["http://localhost:30000/metrics"]\n',
                  replace_text={"[collectors.vllm]\nenabled = true": "[collectors.vllm]\nenabled = false",
                                "[collectors.vllm_kv_events]\nenabled = true":
                                    "[collectors.vllm_kv_events]\nenabled = false"}, model="Qwen/Qwen3-8B"),
    Configuration("node-nvml-8gpu", "the node agent on an 8-GPU node (NVML, disks, NICs of tests/fixtures/host/"
                  "gpu-node)", NODE_AGENT, {}, gpus=8, host_root="gpu-node"),
)


def budget() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(BUDGET.read_text())
    return data


BUDGET_DOC = ROOT / "docs" / "cardinality.md"
TABLE_START, TABLE_END = "<!-- budget table: generated -->\n", "<!-- end of budget table -->\n"


# the budget table's columns: each series counted under the first group whose prefix its name has
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("agent health", ("kvscope_collector_", "kvscope_analysis_", "kvscope_scrape_", "kvscope_store_",
                      "kvscope_http_", "kvscope_build_info", "process_", "kvscope_otlp_", "kvscope_kv_events_",
                      "kvscope_kv_publisher_", "kvscope_request_records_")),
    ("KV residency and reuse", ("kvscope_kv_block", "kvscope_kv_resid", "kvscope_kv_reuse")),
    ("what-if", ("kvscope_whatif_",)),
    ("GPUs and host", ("kvscope_gpu_", "kvscope_disk_", "kvscope_network_", "kvscope_rdma_", "kvscope_fs_")),
    ("engine and TTFT", ("",)),
)


def grouped(counts: Counter[str]) -> dict[str, int]:
    out = dict.fromkeys((name for name, _ in GROUPS), 0)
    for metric, n in counts.items():
        group = next(name for name, prefixes in GROUPS if metric.startswith(prefixes))
        out[group] += n
    return out


def budget_rows(measured: dict[str, Counter[str]]) -> dict[str, Any]:
    """The machine-readable budget (docs/cardinality.json) of a measurement."""
    return {config.key: {"title": config.title, "series": sum(measured[config.key].values()),
                         "groups": grouped(measured[config.key])} for config in CONFIGURATIONS}


def markdown_table(rows: dict[str, Any]) -> str:
    names = [name for name, _ in GROUPS]
    lines = ["| configuration | series per pod | " + " | ".join(names) + " |",
             "|---|---:|" + "---:|" * len(names)]
    for key, row in rows.items():
        lines.append(f"| {row['title']} (`{key}`) | **{row['series']:,}** | "
                     + " | ".join(f"{row['groups'][n]:,}" for n in names) + " |")
    return "\n".join(lines) + "\n"
