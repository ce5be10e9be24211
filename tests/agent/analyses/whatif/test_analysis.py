"""The what-if analysis in the agent: its exported counters, its profile (route and recording), the wiring
that feeds it, and `kvscope what-if` on what it serves."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kvscope.agent.analyses.correlation import metrics as cm
from kvscope.agent.analyses.whatif import metrics as m
from kvscope.agent.analyses.whatif.analysis import PROFILE_ROUTE, WhatIfAnalysis
from kvscope.agent.analyses.whatif.options import WhatIfOptions
from kvscope.agent.analyses.whatif.predict import replay
from kvscope.agent.analyses.whatif.profile import loads
from kvscope.agent.analyses.whatif.sizes import scenario
from kvscope.agent.app.cli import main
from kvscope.agent.app.wiring import build_agent, build_catalogue, components
from kvscope.agent.config.settings import load_config
from kvscope.agent.core import contract as c
from kvscope.agent.core.kv_access import BATCH, RESET, KvAccessLog
from kvscope.agent.core.readings import HistogramSample, Reading, Sample
from kvscope.agent.core.records import AttributedRequest, Attribution, RecentRequests, RequestRecord
from kvscope.agent.core.store import Store

E = ("vllm", "m", "0")
BT = 16
# a little conversation: three prompts of 3, 4 and 3 blocks, then the first again, twice
STEPS = [[1, 2, 3], [1, 2, 4, 5], [6, 7, 8], [1, 2, 3], [9, 10], [1, 2, 3]]


def attributed(ttft: float, prompt: int, cached: int) -> AttributedRequest:
    record = RequestRecord("r", *E, arrival=0.0, ttft=ttft, prompt_tokens=prompt, cached_tokens=cached)
    return AttributedRequest(record, Attribution(ttft, {}), None, None)


def engine_series(store: Store, lookup: float, hits: dict[str, float]) -> None:
    readings: list[Reading] = [Sample(c.KV_LOOKUP_TOKENS, E, lookup),
                               Sample(c.TIER_CAPACITY_TOKENS, (*E, "G1"), 4 * BT),
                               Sample(c.TIER_CAPACITY_TOKENS, (*E, "G2"), 2 * BT)]
    readings += [Sample(c.KV_HIT_TOKENS, (*E, t), v) for t, v in hits.items()]
    store.ingest("vllm", readings, 0.0)
    store.ingest("correlation", [Sample(cm.COST_A, E, 4e-5), Sample(cm.COST_B, E, 1e-9),
                                 Sample(cm.COST_CONFIDENT, E, 1), Sample(cm.TIER_BANDWIDTH, (*E, "G2"), 5e9)], 0.0)


def setup(tmp_path: Path, **options: object) -> tuple[WhatIfAnalysis, Store, KvAccessLog, RecentRequests]:
    store, log, recent = Store(build_catalogue()), KvAccessLog(), RecentRequests()
    opts = WhatIfOptions(scales=[2.0], scenarios={"no-G2": {"G2": "0"}}, tier_sizes={"G3": "0", "G4": "0"},
                         recording=str(tmp_path / "whatif.json"), **options)  # type: ignore[arg-type]
    return WhatIfAnalysis(opts, store, log, recent, lambda: 1000.0), store, log, recent


def feed(log: KvAccessLog, steps: list[list[int]]) -> None:
    stream = log.stream(E, 1.0)
    for keys in steps:
        stream.queue.append(BATCH)
        stream.queue.extend(keys)
    stream.meta.block_tokens, stream.meta.bytes_per_token, stream.meta.complete = BT, 36_864, True
    stream.meta.sampled_accesses += sum(map(len, steps))


def exported(readings: list[Reading]) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(r.name, r.labels): r.value for r in readings if isinstance(r, Sample)}


def test_exported_counters_say_what_the_replay_of_the_profile_says(tmp_path: Path) -> None:
    analysis, store, log, recent = setup(tmp_path)
    engine_series(store, lookup=19 * BT + 40, hits={"G1": 6 * BT, "G2": 2 * BT})
    feed(log, STEPS)
    recent.write([attributed(0.05, 3 * BT + 10, 2 * BT), attributed(0.2, 3 * BT + 10, 0)])
    out = analysis.run()
    values = exported(out)
    (profile,) = analysis.profiles()
    assert profile.counted == sum(map(len, STEPS)) and profile.warmup == 0 and len(profile.batches) == len(STEPS)
    built = analysis._states[E].setup
    assert built is not None and [s.name for s in built.scenarios] == ["today", "G1x2", "G2x2", "no-G2"]
    for p in replay(profile, built.scenarios[1:]):
        for tier, n in zip(("G1", "G2", "G3", "G4"), p.model_hit_tokens, strict=True):
            assert values.get((m.HIT_TOKENS, (*E, p.scenario.name, tier)), 0.0) == pytest.approx(n, abs=1e-9)
    assert values[(m.CAPACITY_TOKENS, (*E, "G1x2", "G1"))] == 8 * BT
    assert values[(m.CAPACITY_BYTES, (*E, "no-G2", "G2"))] == 0
    assert values[(m.SIMULATED, E)] == sum(map(len, STEPS))
    ttft = {r.labels: r for r in out if isinstance(r, HistogramSample) and r.name == m.TTFT}
    assert {labels[3] for labels in ttft} == {"today", "G1x2", "G2x2", "no-G2"}
    assert all(h.count == pytest.approx(2.0) for h in ttft.values())  # each request's outcomes weigh 1 in all
    assert ttft[(*E, "today", "high")].sum == pytest.approx(0.25)  # today's model changes nothing


def test_the_profile_is_served_and_recorded(tmp_path: Path) -> None:
    analysis, store, log, _ = setup(tmp_path)
    engine_series(store, lookup=100.0, hits={})
    feed(log, STEPS)
    analysis.run()
    body, ctype = analysis.routes()[PROFILE_ROUTE]()
    assert ctype == "application/json"
    assert loads(body) == loads((tmp_path / "whatif.json").read_bytes())


def test_a_publisher_restart_starts_the_models_and_the_trace_again(tmp_path: Path) -> None:
    analysis, store, log, _ = setup(tmp_path)
    engine_series(store, lookup=100.0, hits={})
    feed(log, STEPS)
    analysis.run()
    log.stream(E, 1.0).queue.append(RESET)
    feed(log, STEPS[:2])
    analysis.run()
    (profile,) = analysis.profiles()
    assert list(profile.trace) == [1, 2, 3, 1, 2, 4, 5] and profile.warmup == 0


def test_without_g1_s_size_nothing_is_predicted(tmp_path: Path) -> None:
    analysis, _, log, _ = setup(tmp_path)
    feed(log, STEPS)
    assert analysis.run() == [Sample(m.SIMULATED, E, float(sum(map(len, STEPS)))), Sample(m.DROPPED, E, 0.0)]
    assert analysis.profiles() == []


def test_the_agent_wires_the_analysis_and_serves_its_profile(tmp_path: Path) -> None:
    text = ("[exporters.prometheus]\nlisten = '127.0.0.1:0'\n[collectors.vllm_kv_events]\nenabled = true\n"
            "endpoint = 'tcp://127.0.0.1:1'\nmodel = 'm'\n")
    agent = build_agent(load_config(text, components(), environ={}))
    agent.start()
    try:
        assert agent.server is not None and PROFILE_ROUTE in agent.server.routes
        analysis = agent.analyses["whatif"]
        assert isinstance(analysis, WhatIfAnalysis) and analysis._access is not None
        assert analysis._access.streams()[0].labels == ("vllm", "m", "0")  # the collector's rank 0
        url = f"http://127.0.0.1:{agent.server.port}"
        assert main(["what-if", "--url", url, "--g1", "2x"]) == 1  # nothing published yet: said, not guessed
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url + PROFILE_ROUTE, timeout=10) as r:  # beside /metrics, behind its TLS and auth
            assert r.headers["Content-Type"] == "application/json" and json.loads(r.read())["streams"] == []
    finally:
        agent.stop()


def test_kvscope_what_if_on_a_recording(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    analysis, store, log, recent = setup(tmp_path)
    engine_series(store, lookup=19 * BT + 40, hits={"G1": 6 * BT, "G2": 2 * BT})
    feed(log, STEPS)
    recent.write([attributed(0.05, 3 * BT + 10, 2 * BT)])
    analysis.run()
    out = tmp_path / "out.json"
    assert main(["what-if", "--recording", str(tmp_path / "whatif.json"), "--g1", "2x", "--g2", "64KiB",
                 "--scenario", "off:G2=0", "--json", str(out), "--gpus-per-engine", "2"]) == 0
    text = capsys.readouterr().out
    assert "today (measured)" in text and "G1=2x,G2=64KiB" in text and "off" in text
    (doc,) = json.loads(out.read_text())
    # the marginal value of G1's next step: its prefill saved per request at 2x less today's, x 2 GPUs
    (profile,) = loads((tmp_path / "whatif.json").read_bytes())
    today, doubled = replay(profile, [scenario("G1x2", {"G1": "2x"})])
    assert today.ttft is not None and doubled.ttft is not None
    (step,) = [m for m in doc["marginal"] if m["tier"] == "G1" and m["step"] == "next"]
    assert step["per_request"] == pytest.approx(2 * (doubled.ttft.prefill_saved - today.ttft.prefill_saved))
    assert step["blocks_change"] == 4 and "G1 +" in text and "GPU-ms per request" in text
    names = [s["name"] for s in doc["scenarios"]]
    assert names == ["today", "G1=2x,G2=64KiB", "off"]
    assert doc["scenarios"][1]["blocks"] == {"G1": 8, "G2": 65536 // (BT * 36_864), "G3": 0, "G4": 0}
    assert main(["what-if", "--recording", str(tmp_path / "whatif.json"), "--g1", "fast"]) == 2


def test_the_profile_route_is_behind_the_metrics_endpoints_auth(tmp_path: Path) -> None:
    """GET /whatif/profile answers only with /metrics' credentials; `kvscope what-if --url user:pass@...` has them."""
    import bcrypt

    from kvscope.agent.analyses.whatif.commands import fetch
    from kvscope.agent.http.webconfig import load_web_config
    from kvscope.exporters.prometheus.server import MetricsServer

    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prom: '{bcrypt.hashpw(b's3cret', bcrypt.gensalt(rounds=4)).decode()}'\n")
    analysis, store, log, _ = setup(tmp_path)
    engine_series(store, lookup=100.0, hits={})
    feed(log, STEPS)
    analysis.run()
    server = MetricsServer(store, "127.0.0.1", 0, load_web_config(str(web)), routes=analysis.routes())
    server.start()
    try:
        url = f"127.0.0.1:{server.port}"
        with pytest.raises(urllib.error.HTTPError) as refused:
            fetch(url)
        assert refused.value.code == 401
        (profile,) = loads(fetch(f"http://prom:s3cret@{url}/metrics"))
        assert profile.counted == sum(map(len, STEPS))
    finally:
        server.stop()
