"""The sglang_requests collector on real files: SGLang's lines become records; bad lines are counted, not fatal."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvscope.agent.core.pipeline import CollectorContext
from kvscope.agent.core.records import RecordBuffer, TierFetch
from kvscope.agent.core.streams import REQUEST_RECORDS
from kvscope.collectors.requests.sglang_requests import (
    LINES,
    READ_BYTES,
    REOPENS,
    SPEC,
    SglangRequestsCollector,
    SglangRequestsOptions,
    build,
)
from testkit.paths import FIXTURES
from testkit.stages import streams_for

FOLDER = FIXTURES / "sglang" / "request_log"
CURRENT = FOLDER / "sglang-request-metrics-20261205_20.log"
UNTIMED = FOLDER / "sglang-request-metrics-20261205_21-untimed.log"


def counts(collector: SglangRequestsCollector) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(r.name, r.labels): r.value for r in collector.collect()}  # type: ignore[union-attr]


def make(tmp_path: Path, **options: object) -> tuple[SglangRequestsCollector, RecordBuffer]:
    buffer = RecordBuffer()
    opts = SglangRequestsOptions(directory=str(tmp_path), model="gpt-oss-120b", **options)  # type: ignore[arg-type]
    opts.validate("collectors.sglang_requests")
    return SglangRequestsCollector(opts, buffer), buffer


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def test_lines_written_after_the_start_become_records(tmp_path: Path) -> None:
    log = tmp_path / CURRENT.name
    log.write_bytes(b'{"id": "before the agent"}\n')
    collector, buffer = make(tmp_path)
    append(log, CURRENT.read_bytes())
    got = counts(collector)
    records = buffer.drain()
    assert [r.request_id for r in records] == ["4f1c0a7e01", "4f1c0a7e02", "4f1c0a7e03", "4f1c0a7e04"]
    assert records[3].fetches == (TierFetch("G4", 8064),) and records[3].model == "gpt-oss-120b"
    assert got[(LINES, ("accepted",))] == 4 and got[(LINES, ("no_timing",))] == 1  # the aborted request
    assert got[(LINES, ("invalid",))] == 0 and got[(READ_BYTES, ())] == len(CURRENT.read_bytes())


def test_bad_lines_are_counted_and_reading_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / CURRENT.name
    log.write_bytes(b"")
    collector, buffer = make(tmp_path)
    good = CURRENT.read_bytes().splitlines(keepends=True)
    append(log, good[0] + b"garbage that is not json\n" + b'{"id": 5}\n' + b"\n" + good[1][:40] + b"\n" + good[2])
    got = counts(collector)
    assert [r.request_id for r in buffer.drain()] == ["4f1c0a7e01", "4f1c0a7e03"]
    assert got[(LINES, ("malformed",))] == 2 and got[(LINES, ("invalid",))] == 1
    assert "skipping a malformed line" in caplog.text and caplog.text.count("skipping a malformed line") == 1
    append(log, good[3])
    assert counts(collector)[(LINES, ("accepted",))] == 3
    assert [r.request_id for r in buffer.drain()] == ["4f1c0a7e04"]


def test_truncation_and_rotation_are_counted_and_nothing_is_read_twice(tmp_path: Path) -> None:
    log = tmp_path / CURRENT.name
    log.write_bytes(b"")
    collector, buffer = make(tmp_path)
    good = CURRENT.read_bytes().splitlines(keepends=True)
    append(log, good[0] + good[1])
    counts(collector)
    with open(log, "r+b") as handle:
        handle.truncate(0)
    append(log, good[2])
    got = counts(collector)
    assert got[(REOPENS, ("truncated",))] == 1
    append(log, good[3])
    shutil.copy(UNTIMED, tmp_path / "sglang-request-metrics-20261205_21.log")
    got = counts(collector)
    assert got[(REOPENS, ("rotated",))] == 1 and got[(LINES, ("no_timing",))] == 1
    assert [r.request_id for r in buffer.drain()] == ["4f1c0a7e01", "4f1c0a7e02", "4f1c0a7e03", "4f1c0a7e04"]


def test_a_directory_sglang_has_not_made_yet_is_no_data(tmp_path: Path) -> None:
    collector, buffer = make(tmp_path / "later")
    got = counts(collector)
    assert got[(LINES, ("accepted",))] == 0 and len(buffer) == 0
    (tmp_path / "later").mkdir()
    shutil.copy(CURRENT, tmp_path / "later" / CURRENT.name)
    assert counts(collector)[(LINES, ("accepted",))] == 4


def test_options_are_checked() -> None:
    for bad in ({"directory": ""}, {"directory": "relative/dir"}, {"directory": "/d", "start_at": "middle"},
                {"directory": "/d", "storage_backend_tiers": {"nixl": "G9"}},
                {"directory": "/d", "max_line_bytes": 10}):
        with pytest.raises(ValueError):
            SglangRequestsOptions(**bad).validate("collectors.sglang_requests")  # type: ignore[arg-type]


def test_the_spec_writes_request_records(tmp_path: Path) -> None:
    options = SglangRequestsOptions(directory=str(tmp_path))
    streams = streams_for(SPEC.streams, options)
    collector = build(options, CollectorContext(streams=streams))
    shutil.copy(CURRENT, tmp_path / CURRENT.name)
    collector.collect()
    assert len(streams.require(REQUEST_RECORDS).drain()) == 4
    assert {m.name for m in SPEC.metrics} == {LINES, REOPENS, READ_BYTES}
