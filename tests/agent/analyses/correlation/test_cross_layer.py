"""Fetch-stall interval arithmetic and the noisy-neighbour / saturation verdicts."""

from __future__ import annotations

import pytest

from kvscope.agent.analyses.correlation.attribution import attribute_request
from kvscope.agent.analyses.correlation.costmodel import PrefillCostModel
from kvscope.agent.analyses.correlation.cross_layer import (
    PathWindow,
    Thresholds,
    assess_path,
    clip,
    idle_seconds,
    phase_intervals,
    stall_seconds,
    subtract,
    union,
)
from kvscope.agent.core.records import RequestRecord


def test_union_and_subtract() -> None:
    assert union([(5, 6), (1, 3), (2, 4), (7, 7)]) == [(1, 4), (5, 6)]
    fetching = union([(0, 10), (12, 20)])
    computing = union([(2, 3), (5, 13), (19, 25)])
    assert subtract(fetching, computing) == [(0, 2), (3, 5), (13, 19)]
    assert subtract(fetching, []) == fetching
    assert subtract([], computing) == []
    assert clip([(0, 2), (3, 5), (13, 19)], 1, 14) == [(1, 2), (3, 5), (13, 14)]


def test_stall_is_idle_fraction_times_overlap_with_fetch_only_time() -> None:
    fetch_only = [(0.0, 2.0), (3.0, 5.0)]
    samples = [(0.0, 1.0, 0.0), (1.0, 2.0, 0.5), (2.0, 3.0, 0.0), (4.5, 6.0, 0.2), (6.0, 7.0, 0.0)]
    # 1 s fully idle + 1 s half idle + nothing in (2,3) + 0.5 s at 80 % idle
    assert stall_seconds(samples, fetch_only) == pytest.approx(1.0 + 0.5 + 0.4)
    assert stall_seconds([(0.0, 1.0, 1.0)], fetch_only) == 0.0  # busy GPU: no stall


def test_phase_intervals_are_placed_before_the_first_token() -> None:
    record = RequestRecord("r", "vllm", "m", "0", arrival=100.0, ttft=3.0, queue=1.5, prefill=1.0,
                           prompt_tokens=2000, cached_tokens=1000, fetch_seconds=0.5)
    async_att = attribute_request(record, PrefillCostModel(), None, "queue")
    assert phase_intervals(record, async_att, "queue") == ([(101.5, 102.0)], [(102.0, 103.0)])
    sync_att = attribute_request(record, PrefillCostModel(), None, "prefill")
    fetches, computes = phase_intervals(record, sync_att, "prefill")
    assert fetches == [(pytest.approx(102.0), pytest.approx(102.5))]
    assert computes == [(pytest.approx(102.5), 103.0)]
    explicit = RequestRecord("r", "reference", "m", "0", 0.0, 1.0, fetch_intervals=((0.1, 0.2),),
                             compute_intervals=((0.2, 0.9),))
    assert phase_intervals(explicit, sync_att, "prefill") == ([(0.1, 0.2)], [(0.2, 0.9)])


QUIET = [PathWindow(path_bps=50e9, kv_bps=40e9, fetch_bandwidth=10e9, fetch_share=0.1) for _ in range(10)]
PEAK = 250e9


def test_noisy_neighbour_raised_when_other_traffic_takes_the_path() -> None:
    # the seeds' test: 200 GB/s of unrelated traffic on the fabric, KV fetch slows down
    noisy = PathWindow(path_bps=240e9, kv_bps=30e9, fetch_bandwidth=6e9, fetch_share=0.2)
    verdict = assess_path(noisy, QUIET, PEAK)
    assert verdict.noisy_neighbour
    assert verdict.bandwidth_drop == pytest.approx(0.4)
    assert verdict.non_kv_share == pytest.approx(1 - 30 / 240)
    assert verdict.utilisation == pytest.approx(240 / 250)


def test_noisy_neighbour_silent_without_the_other_traffic() -> None:
    # KV itself fills the path and its bandwidth holds: busy, not contended
    busy = PathWindow(path_bps=240e9, kv_bps=230e9, fetch_bandwidth=10e9, fetch_share=0.1)
    assert not assess_path(busy, QUIET, PEAK).noisy_neighbour
    # bandwidth dropped, but the path is far from its peak: not a neighbour on the path
    slow_alone = PathWindow(path_bps=30e9, kv_bps=25e9, fetch_bandwidth=5e9, fetch_share=0.2)
    assert not assess_path(slow_alone, QUIET, PEAK).noisy_neighbour
    # other traffic but fetch unaffected
    harmless = PathWindow(path_bps=240e9, kv_bps=40e9, fetch_bandwidth=9.8e9, fetch_share=0.1)
    assert not assess_path(harmless, QUIET, PEAK).noisy_neighbour


def test_no_signal_before_a_baseline_exists() -> None:
    noisy = PathWindow(path_bps=240e9, kv_bps=30e9, fetch_bandwidth=6e9, fetch_share=0.2)
    verdict = assess_path(noisy, QUIET[:2], PEAK, Thresholds(min_baseline=5))
    assert not verdict.noisy_neighbour and verdict.bandwidth_drop == pytest.approx(0.4)


def test_saturation_needs_the_peak_and_a_growing_fetch_share() -> None:
    saturated = PathWindow(path_bps=245e9, kv_bps=240e9, fetch_bandwidth=9e9, fetch_share=0.3)
    assert assess_path(saturated, QUIET, PEAK).saturated
    steady = PathWindow(path_bps=245e9, kv_bps=240e9, fetch_bandwidth=9e9, fetch_share=0.1)
    assert not assess_path(steady, QUIET, PEAK).saturated
    below = PathWindow(path_bps=150e9, kv_bps=140e9, fetch_bandwidth=9e9, fetch_share=0.3)
    assert not assess_path(below, QUIET, PEAK).saturated


def test_idle_seconds_counts_only_what_the_samples_place_inside_the_interval() -> None:
    gpu = [(0.0, 1.0, 0.0),   # reaches in from before, idle throughout: its 0.5 s inside count
           (1.0, 2.0, 0.25),  # wholly inside: 0.75 s idle
           (2.0, 2.5, 1.0),   # busy
           (2.5, 4.0, 0.5)]   # reaches out, half busy: its busy time may be inside, so none counts
    assert idle_seconds([gpu], (0.5, 3.0)) == pytest.approx(0.5 + 0.75)
    busier = [(0.0, 4.0, 0.9)]
    assert idle_seconds([gpu, busier], (0.5, 3.0)) == 0.0  # tensor parallel: the least idle GPU bounds it
    assert idle_seconds([], (0.5, 3.0)) is None
    assert idle_seconds([[(5.0, 6.0, 0.0)]], (0.5, 3.0)) == 0.0


def test_a_sync_fetch_opens_the_measured_prefill_phase() -> None:
    record = RequestRecord("r", "vllm", "m", "0", arrival=100.0, ttft=3.0, queue=1.0, prefill=1.5,
                           prompt_tokens=2000, cached_tokens=1000, fetch_seconds=0.5)
    attribution = attribute_request(record, PrefillCostModel(), None, "prefill", prefill_idle=0.7)
    assert attribution.seconds("prefill") == pytest.approx(0.8)  # 1.5 − 0.5 fetch − 0.2 idle beyond it
    fetches, computes = phase_intervals(record, attribution, "prefill")
    assert fetches == [(pytest.approx(101.5), pytest.approx(102.0))]  # the phase starts at 103 − 1.5
    assert computes == [(pytest.approx(102.2), 103.0)]
