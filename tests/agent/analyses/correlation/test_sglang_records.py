"""SGLang's per-request file through the whole agent: the collector's records are attributed, tier by tier."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvscope.agent.analyses.correlation import metrics as m
from kvscope.agent.app.wiring import build_agent, components
from kvscope.agent.config.settings import load_config
from testkit.growing_pages import growing_server
from testkit.paths import FIXTURES

LOG = FIXTURES / "sglang" / "request_log" / "sglang-request-metrics-20261205_20.log"
PAGE = FIXTURES / "sglang" / "hicache-nixl-current-tp1.prom"


def test_sglang_requests_are_attributed_with_their_tiers(tmp_path: Path) -> None:
    directory, out = tmp_path / "sglang", tmp_path / "requests.jsonl"
    config = ("[exporters.prometheus]\nenabled = false\n"
              f"[collectors.sglang_requests]\nenabled = true\ndirectory = '{directory}'\nmodel = 'gpt-oss-120b'\n"
              f"[exporters.jsonl]\nenabled = true\npath = '{out}'\n")
    agent = build_agent(load_config(config, components(), environ={}))
    directory.mkdir()
    shutil.copy(LOG, directory / LOG.name)  # SGLang writes after the agent started
    list(agent.collectors["sglang_requests"].collect())
    readings = {(r.name, r.labels): getattr(r, "value", None) for r in agent.analyses["correlation"].run()}
    key = ("sglang", "gpt-oss-120b", "0")
    assert readings[(m.REQUESTS_ATTRIBUTED, (*key, "sglang"))] == 4
    lines = {line["request_id"]: line for line in map(json.loads, out.read_text().splitlines())}
    assert sorted(lines) == ["4f1c0a7e01", "4f1c0a7e02", "4f1c0a7e03", "4f1c0a7e04"]
    for line in lines.values():  # the components add up to the TTFT
        assert sum(c["seconds"] for c in line["components"].values()) == pytest.approx(line["ttft"], abs=1e-9)
    g1 = lines["4f1c0a7e02"]
    assert g1["tier_tokens"] == {"G1": 2047} and g1["cached_tokens"] == 2047
    assert g1["components"]["fetch"] == {"seconds": 0.0, "method": "measured"}  # all of it from G1
    assert g1["components"]["queue"] == {"seconds": 0.001, "method": "measured"}
    assert g1["components"]["prefill"]["method"] == "measured"
    assert g1["components"]["frontend"]["seconds"] == pytest.approx(0.0029, abs=1e-6)  # tokenise + dispatch
    assert lines["4f1c0a7e03"]["tier_tokens"] == {"G1": 1024, "G2": 2048}
    assert lines["4f1c0a7e04"]["tier_tokens"] == {"G1": 0, "G4": 8064}
    assert lines["4f1c0a7e01"]["tier_tokens"] == {"G1": 0} and lines["4f1c0a7e01"]["cached_tokens"] == 0


def test_with_sglangs_metrics_page_a_host_hit_gets_a_fetch_time_from_the_host_links_bandwidth(tmp_path: Path) -> None:
    """The /metrics collector measures the G2 → G1 link (load-back bytes and seconds); the record's 2,048 G2 tokens
    are fetched at that bandwidth, with the bytes per token learned from the same page."""
    directory, out = tmp_path / "sglang", tmp_path / "requests.jsonl"
    with growing_server({"/metrics": PAGE.read_text()}) as server:
        config = ("[exporters.prometheus]\nenabled = false\n"
                  f"[collectors.sglang]\nenabled = true\nurls = ['{server.url()}']\n"
                  f"[collectors.sglang_requests]\nenabled = true\ndirectory = '{directory}'\nmodel = 'Qwen/Qwen3-8B'\n"
                  f"[exporters.jsonl]\nenabled = true\npath = '{out}'\n")
        agent = build_agent(load_config(config, components(), environ={}))
        correlation = agent.analyses["correlation"]
        for now in (1000.0, 1015.0):  # two scrapes: the page grows by one page's worth of traffic
            agent.store.ingest("sglang", agent.collectors["sglang"].collect(), now)
            readings = correlation.run()
    gauges = {(r.name, r.labels): getattr(r, "value", None) for r in readings}
    key = ("sglang", "Qwen/Qwen3-8B", "0")
    bandwidth, per_token = gauges[(m.TIER_BANDWIDTH, (*key, "G2"))], gauges[(m.TOKEN_BYTES, key)]
    assert bandwidth and per_token
    directory.mkdir()
    host_hit = LOG.read_bytes().splitlines(keepends=True)[2]  # the first record: no prefill cost model yet
    (directory / LOG.name).write_bytes(host_hit)
    list(agent.collectors["sglang_requests"].collect())
    correlation.run()
    (line,) = map(json.loads, out.read_text().splitlines())
    parts = line["components"]
    assert line["request_id"] == "4f1c0a7e03" and line["tier_tokens"] == {"G1": 1024, "G2": 2048}
    assert parts["fetch"]["method"] == "estimated"
    assert parts["fetch"]["seconds"] == pytest.approx(2048 * per_token / bandwidth)
    # SGLang loads host hits back inside the prefill phase: the fetch comes out of it, the queue keeps its own
    assert parts["prefill"] == {"seconds": pytest.approx(0.1402 - parts["fetch"]["seconds"], abs=1e-6),
                                "method": "derived"}
    assert parts["queue"] == {"seconds": 0.0011, "method": "measured"}
