"""The JSON Lines sink: one line per attributed request; a file it cannot write is counted, not raised."""

from __future__ import annotations

import json
from pathlib import Path

from kvscope.agent.core.catalogue import Catalogue
from kvscope.agent.core.records import AttributedRequest, Attribution, Part, RequestRecord, TierFetch
from kvscope.agent.core.store import Store
from kvscope.exporters import jsonl
from kvscope.exporters.jsonl import JsonlSink


def result(i: int) -> AttributedRequest:
    record = RequestRecord(f"r{i}", "vllm", "m", "0", arrival=10.0 + i, ttft=1.0, prompt_tokens=100, cached_tokens=50)
    parts = {"queue": Part(0.1, "measured"), "fetch": Part(0.2, "estimated"), "prefill": Part(0.6, "derived"),
             "other": Part(0.1, "derived")}
    return AttributedRequest(record, Attribution(1.0, parts), prefill_saved=0.3, ttft_without_cache=1.3)


def counts(store: Store) -> tuple[float | None, float | None]:
    return store.value(jsonl.LINES_WRITTEN, ()), store.value(jsonl.WRITE_ERRORS, ())


def test_lines_carry_components_with_their_method_and_are_counted(tmp_path: Path) -> None:
    store, path = Store(Catalogue(jsonl.METRICS)), tmp_path / "requests.jsonl"
    sink = JsonlSink(str(path), store, wall_clock=lambda: 0.0)
    sink.start()
    assert counts(store) == (0.0, 0.0)
    sink.write([result(1), result(2)])
    sink.write([result(3)])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["request_id"] for line in lines] == ["r1", "r2", "r3"]
    assert lines[0]["components"]["fetch"] == {"seconds": 0.2, "method": "estimated"}
    assert (lines[0]["prefill_saved"], lines[0]["ttft_without_cache"]) == (0.3, 1.3)
    assert counts(store) == (3.0, 0.0)


def test_an_unwritable_file_is_counted_and_the_analysis_goes_on(tmp_path: Path) -> None:
    store = Store(Catalogue(jsonl.METRICS))
    sink = JsonlSink(str(tmp_path / "no-such-dir" / "requests.jsonl"), store, wall_clock=lambda: 0.0)
    sink.write([result(1), result(2)])  # must not raise
    assert counts(store) == (0.0, 2.0)


def test_tokens_by_tier_where_the_source_splits_them(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    split = RequestRecord("s1", "sglang", "m", "0", arrival=1.0, ttft=0.2, prompt_tokens=4096, cached_tokens=3072,
                          fetches=(TierFetch("G2", 2048),), g1_tokens=1024, source="sglang")
    JsonlSink(str(path), wall_clock=lambda: 0.0).write(
        [AttributedRequest(split, Attribution(0.2, {}), None, None), result(1)])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["tier_tokens"] == {"G1": 1024, "G2": 2048}
    assert lines[1]["tier_tokens"] is None  # vLLM's spans do not say
