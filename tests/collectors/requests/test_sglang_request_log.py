"""SGLang's per-request metrics lines (tests/fixtures/sglang/request_log) as request records, tier by tier."""

from __future__ import annotations

import json

import pytest

from kvscope.agent.analyses.correlation.attribution import estimate_fetch
from kvscope.agent.core.records import RequestRecord, TierFetch
from kvscope.collectors.engines.sglang_backends import backend_tiers
from kvscope.collectors.requests.sglang_request_log import BadLine, LineLabels, parse_line
from testkit.paths import FIXTURES

FOLDER = FIXTURES / "sglang" / "request_log"
CURRENT = FOLDER / "sglang-request-metrics-20261205_20.log"
UNTIMED = FOLDER / "sglang-request-metrics-20261205_21-untimed.log"
LABELS = LineLabels("sglang", "gpt-oss-120b", "0")
TIERS = backend_tiers({}, "G3")


def lines() -> list[bytes]:
    return CURRENT.read_bytes().splitlines()


def parsed() -> dict[str, RequestRecord]:
    out = {}
    for line in lines():
        try:
            record = parse_line(line, LABELS, TIERS)
        except BadLine:
            continue
        out[record.request_id] = record
    return out


def test_each_request_becomes_a_record_with_its_phases() -> None:
    by_id = parsed()
    assert sorted(by_id) == ["4f1c0a7e01", "4f1c0a7e02", "4f1c0a7e03", "4f1c0a7e04"]
    cold = by_id["4f1c0a7e01"]
    assert cold.source == "sglang" and cold.engine == "sglang" and cold.model == "gpt-oss-120b"
    assert cold.arrival == 1_796_500_000.0 and cold.prompt_tokens == 2048 and cold.cached_tokens == 0
    # received -> prefill finished: tokenize 3.1 ms + queue 1.2 ms + prefill 210.4 ms
    assert cold.ttft == pytest.approx(0.0031 + 0.0012 + 0.2104, abs=1e-6)
    assert cold.queue == 0.0012 and cold.prefill == pytest.approx(0.2104, abs=1e-6)
    assert cold.fetches == () and cold.g1_tokens == 0 and cold.nothing_fetched


def test_hits_are_split_by_the_tier_that_served_them() -> None:
    by_id = parsed()
    g1 = by_id["4f1c0a7e02"]
    assert g1.cached_tokens == 2047 and g1.g1_tokens == 2047 and g1.fetches == () and g1.nothing_fetched
    host = by_id["4f1c0a7e03"]
    assert host.g1_tokens == 1024 and host.fetches == (TierFetch("G2", 2048),) and not host.nothing_fetched
    storage = by_id["4f1c0a7e04"]  # storage_backend "HiCacheNixl": the nixl backend, G4 by default
    assert storage.g1_tokens == 0 and storage.fetches == (TierFetch("G4", 8064),)
    assert storage.queue == 0.0934  # L3 prefetch holds the request in the waiting queue


def test_the_storage_tier_follows_the_backend_table_and_its_overrides() -> None:
    line = json.loads(lines()[3])
    for backend, configured, tier in (("HiCacheFile", {}, "G3"), ("HiCacheFile", {"file": "G4"}, "G4"),
                                      ("MooncakeStore", {}, "G4"), ("KVCCStore", {}, "unattributed"),
                                      ("KVCCStore", {"kvcc": "G4"}, "G4"), ("AcmeKV", {}, "unattributed"),
                                      ("AcmeKV", {"AcmeKV": "G3"}, "G3"), ("none", {"none": "G3"}, "unattributed")):
        line["cached_tokens_details"]["storage_backend"] = backend
        record = parse_line(json.dumps(line), LABELS, backend_tiers(configured, "G3"))
        assert record.fetches == (TierFetch(tier, 8064),), backend


def test_a_request_aborted_before_its_prefill_has_no_timing() -> None:
    with pytest.raises(BadLine) as caught:
        parse_line(lines()[4], LABELS, TIERS)
    assert caught.value.reason == "no_timing"


def test_without_enable_metrics_no_line_has_timing() -> None:
    with pytest.raises(BadLine) as caught:
        parse_line(UNTIMED.read_bytes().splitlines()[0], LABELS, TIERS)
    assert caught.value.reason == "no_timing"


@pytest.mark.parametrize(("change", "reason"), [
    (lambda m: "not json at all", "malformed"),
    (lambda m: json.dumps(m)[:-7], "malformed"),  # a line cut short
    (lambda m: json.dumps([m]), "malformed"),
    (lambda m: b"\xff\xfe" + json.dumps(m).encode(), "malformed"),
    (lambda m: json.dumps({**m, "id": 17}), "invalid"),
    (lambda m: json.dumps({**m, "prompt_tokens": -1}), "invalid"),
    (lambda m: json.dumps({**m, "prompt_tokens": True}), "invalid"),
    (lambda m: json.dumps({**m, "cached_tokens_details": [1, 2]}), "invalid"),
    (lambda m: json.dumps({**m, "cached_tokens_details": {"device": "1024", "host": 0}}), "invalid"),
    (lambda m: json.dumps({**m, "cached_tokens_details": {"host": 0}}), "invalid"),
    (lambda m: json.dumps({**m, "cached_tokens": 9000}), "invalid"),  # more than the prompt's 4096
    (lambda m: json.dumps({**m, "queue_time": -0.5}), "invalid"),
    (lambda m: json.dumps({**m, "request_received_ts": "yesterday"}), "invalid"),
    (lambda m: json.dumps({**m, "prefill_finished_time": m["request_received_ts"] - 1}), "invalid"),
    (lambda m: json.dumps({**m, "forward_entry_time": m["prefill_finished_time"] + 1}), "invalid"),
    (lambda m: json.dumps({k: v for k, v in m.items() if k != "prefill_finished_time"}), "no_timing"),
])
def test_bad_lines_say_why(change: object, reason: str) -> None:
    meta = json.loads(lines()[2])
    with pytest.raises(BadLine) as caught:
        parse_line(change(meta), LABELS, TIERS)  # type: ignore[operator]
    assert caught.value.reason == reason


def test_a_dp_rank_on_the_line_wins_over_the_configured_one() -> None:
    meta = json.loads(lines()[2])
    assert parse_line(json.dumps({**meta, "dp_rank": 3}), LABELS, TIERS).dp_rank == "3"
    assert parse_line(json.dumps(meta), LineLabels("sglang", "m", "7"), TIERS).dp_rank == "7"


def test_cached_tokens_without_details_leave_the_tier_unknown() -> None:
    meta = {k: v for k, v in json.loads(lines()[2]).items() if k != "cached_tokens_details"}
    record = parse_line(json.dumps(meta), LABELS, TIERS)
    assert record.cached_tokens == 3072 and record.g1_tokens is None and not record.nothing_fetched


def test_a_storage_hit_at_the_seeds_geometry_is_fetch_time_at_the_tier_bandwidth() -> None:
    """gpt-oss-120b (36,864 B/token), the seeds' 130k-token prompt: 129,024 tokens (2,016 pages of 64) from G4."""
    meta = json.loads(lines()[3])
    meta.update(prompt_tokens=130_000, cached_tokens=129_024,
                cached_tokens_details={"device": 0, "host": 0, "storage": 129_024, "storage_backend": "HiCacheHF3FS"})
    record = parse_line(json.dumps(meta), LABELS, TIERS)
    assert record.fetches == (TierFetch("G4", 129_024),) and record.new_tokens == 976
    g4_bandwidth = 8e9  # bytes per second, as a fitted tier model would give it
    fetch = estimate_fetch(record, lambda tier, moved: moved / g4_bandwidth if tier == "G4" else None,
                           lambda _tier: 36_864.0)
    assert fetch == pytest.approx(129_024 * 36_864 / 8e9)  # 4.76 GB in 0.595 s
