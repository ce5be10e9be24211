"""Engine autodetection: identification by the names a page serves, then scraping through the ordinary adapters,
against real HTTP servers on loopback serving the fixture pages; explicit configuration wins."""

from __future__ import annotations

import http.server

import pytest

from kvscope.agent.app.wiring import build_agent, build_catalogue, components
from kvscope.agent.config.settings import load_config
from kvscope.agent.core.pipeline import CollectorContext
from kvscope.collectors.engines.discovery import DiscoveryCollector, DiscoveryOptions, identify
from kvscope.collectors.scrape.exposition import ExpositionScanner
from kvscope.collectors.scrape.fetch import http_fetch
from testkit.engine_pages import FIXTURES, PageServer, Readings, as_dict, fixture_module, page, series, serving, value

DYNAMO = fixture_module("dynamo")
NODE = str(FIXTURES / "dynamo" / "node" / "proc")
HOST = ("disk", "network", "rdma", "nfs", "lustre", "process", "nvml")


@pytest.mark.parametrize(("folder", "name", "kinds"), [
    ("vllm", "v0.33.0-cpu-offload-dp2.prom", {"vllm"}),
    ("dynamo", "worker-0.9.0-vllm-0.14.1.prom", {"vllm", "dynamo"}),
    ("dynamo", "kvbm-0.9.0-seeds-g4.prom", {"dynamo_kvbm"}),
    ("dynamo", "worker-legacy-kvbm.prom", {"dynamo_kvbm", "dynamo"}),
    ("dynamo", "frontend-0.9.0.prom", {"dynamo"}),
    ("sglang", "v0.5.10.post1-tp2.prom", {"sglang"}),
    ("sglang", "hicache-hf3fs-underscore-tp2.prom", {"sglang"}),
    ("lmcache", "on-vllm-0.20-page.prom", {"vllm", "lmcache"}),
    ("lmcache", "internal-api-tp2-remote.prom", {"lmcache"}),
])
def test_identify_by_names_served(folder: str, name: str, kinds: set[str]) -> None:
    scanner = ExpositionScanner(("vllm:", "sglang:", "sglang_", "lmcache:", "kvbm_", "dynamo_"))
    assert identify(scanner.scan(page(folder, name).decode())) == kinds


def _dead_url() -> str:
    srv = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    url = f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    srv.server_close()
    return url


def test_the_seeds_pod_found_and_scraped_through_its_adapters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker (vLLM 0.14.1 lines + dynamo_component_*), KVBM leader and frontend on their own ports, one port
    with nothing and one serving something else: KVBM's model and block size come from the other pages, its
    disk pool (DYN_KVBM_DISK_CACHE_DIR, given to the sidecar) is G4 by the node's mount table."""
    monkeypatch.setenv("DYN_KVBM_DISK_CACHE_DIR", "/kvbm/pool")
    with serving(page("dynamo", "worker-0.9.0-vllm-0.14.1.prom"), page("dynamo", "kvbm-0.9.0-seeds-g4.prom"),
                 page("dynamo", "frontend-0.9.0.prom"), b"node_load1 0.5\n") as (worker, leader, frontend, other):
        dead = _dead_url()
        options = DiscoveryOptions(candidates=[worker.url(), leader.url(), frontend.url(), dead, other.url()],
                                   kv_bytes_per_token=DYNAMO.BYTES_PER_TOKEN)
        r = as_dict(DiscoveryCollector(options, CollectorContext(proc_root=NODE)).collect())
    assert series(r, "kvscope_engine_discovered_info") == {
        ("vllm", worker.url()), ("dynamo", worker.url()), ("dynamo", frontend.url()), ("dynamo_kvbm", leader.url())}
    s, model = DYNAMO.SEEDS, DYNAMO.MODEL
    assert value(r, "kvscope_kv_lookup_tokens_total", "vllm", model, "0") == s["requests"] * s["prompt_tokens"]
    assert value(r, "kvscope_kv_hit_tokens_total", "dynamo", model, "0", "G4") == s["matched_tokens"]
    assert value(r, "kvscope_kv_transfer_bytes_total", "dynamo", model, "0", "G4", "G1") == (
        s["onboard_blocks_d2d"] * 16 * DYNAMO.BYTES_PER_TOKEN)
    assert value(r, "kvscope_kv_block_size_tokens", "dynamo", model, "0", worker.url()) == 16
    assert ("kvscope_ttft_seconds", ("dynamo", model, "0")) in r
    assert {labels[2] for labels in series(r, "kvscope_tier_placement_info")} == {"G4"}
    assert value(r, "kvscope_scrape_target_up", "vllm", worker.url()) == 1
    catalogue = build_catalogue()
    assert all(catalogue.get(name) is not None for name, _ in r)


def test_explicit_configuration_wins() -> None:
    calls: list[str] = []

    def fetch(url: str, timeout: float, max_bytes: int) -> bytes:
        calls.append(url)
        return page("dynamo", "kvbm-0.9.0-seeds-g4.prom")

    collector = DiscoveryCollector(DiscoveryOptions(), CollectorContext(enabled_collectors=frozenset({"sglang"})),
                                   fetch)
    assert collector.collect() == [] and calls == []
    text = '[exporters.prometheus]\nlisten = "127.0.0.1:0"\n[collectors.vllm]\nenabled = true\n' \
           'urls = ["http://127.0.0.1:9/metrics"]\n'
    agent = build_agent(load_config(text, components(), environ={}))
    assert agent.collectors["engine_discovery"].collect() == []  # type: ignore[attr-defined]
    alone = build_agent(load_config('[exporters.prometheus]\nlisten = "127.0.0.1:0"\n', components(), environ={}))
    assert "engine_discovery" in alone.collectors and components().collectors["engine_discovery"].enabled_by_default


def test_probes_at_start_then_on_the_slow_interval() -> None:
    now = [0.0]
    probes: list[str] = []

    def fetch(url: str, timeout: float, max_bytes: int) -> bytes:
        probes.append(url)
        return http_fetch(url, timeout, max_bytes)

    with PageServer({}) as late:  # serves nothing yet (404)
        options = DiscoveryOptions(candidates=[late.url()], reprobe_interval_seconds=60, probe_timeout_seconds=1)
        collector = DiscoveryCollector(options, CollectorContext(proc_root=NODE), fetch, clock=lambda: now[0])
        assert not series(as_dict(collector.collect()), "kvscope_engine_discovered_info")
        late.routes["/metrics"] = page("sglang", "v0.5.10.post1-tp2.prom")
        now[0] = 30.0
        collector.collect()
        assert probes == [late.url()]  # no probe before the interval has passed
        now[0] = 61.0
        r: Readings = as_dict(collector.collect())
    assert series(r, "kvscope_engine_discovered_info") == {("sglang", late.url())}
    assert ("kvscope_kv_hit_tokens_total", ("sglang", "Qwen/Qwen3-8B", "0", "G1")) in r


@pytest.mark.integration
def test_kvscope_run_autodetects_and_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent as `kvscope run` builds it, with no engine configured: its own /metrics shows what was found
    and the engines' per-tier figures (host collectors off: the node fixture has only a mount table)."""
    import time
    import urllib.request

    monkeypatch.setenv("DYN_KVBM_DISK_CACHE_DIR", "/kvbm/pool")
    with serving(page("sglang", "hicache-hf3fs-underscore-tp2.prom"), page("dynamo", "kvbm-0.9.0-seeds-g4.prom"),
                 page("dynamo", "worker-0.9.0-vllm-0.14.1.prom")) as (sgl, leader, worker):
        text = (f'[agent]\ninterval = 0.1\nproc_root = "{NODE}"\n[exporters.prometheus]\nlisten = "127.0.0.1:0"\n'
                f'[collectors.engine_discovery]\ncandidates = ["{sgl.url()}", "{leader.url()}", "{worker.url()}"]\n'
                'kv_bytes_per_token = 36864\n' + "".join(f"[collectors.{n}]\nenabled = false\n" for n in HOST))
        agent = build_agent(load_config(text, components(), environ={}))
        agent.start()
        try:
            deadline = time.monotonic() + 10
            while not agent.store.values("kvscope_engine_discovered_info") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert agent.server is not None
            with urllib.request.urlopen(f"http://127.0.0.1:{agent.server.port}/metrics", timeout=5) as response:
                exposition = response.read().decode()
        finally:
            agent.stop()
    assert f'kvscope_engine_discovered_info{{engine="sglang",url="{sgl.url()}"}} 1.0' in exposition
    assert 'kvscope_kv_hit_tokens_total{dp_rank="0",engine="sglang",model="Qwen/Qwen3-8B",tier="G4"} 16384.0' in (
        exposition)
    # two models on the pod's pages: KVBM's unlabelled series cannot be given one
    assert 'kvscope_kv_transfer_bytes_total{dp_rank="0",dst="G1",engine="dynamo",model="",src="G4"} 4.41778176e+09' \
        in exposition
