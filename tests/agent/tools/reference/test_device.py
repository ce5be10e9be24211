"""The reference device slot as GPU busy/idle samples, and what the fetch-stall arithmetic makes of them."""

from __future__ import annotations

from kvscope.agent.analyses.correlation import cross_layer as signals
from kvscope.agent.tools.reference.device import DeviceSamples


def test_busy_intervals_and_gaps_tile_the_timeline() -> None:
    device = DeviceSamples(lambda: [(12.0, 13.0), (10.5, 11.0), (9.0, 9.5)], since=10.0, wall=lambda: 14.0)
    assert device.gpus() == {"reference0": "reference-device-0"}
    assert device.recent_samples("reference0") == [
        (10.0, 10.5, 0.0), (10.5, 11.0, 1.0), (11.0, 12.0, 0.0), (12.0, 13.0, 1.0), (13.0, 14.0, 0.0)]
    assert device.recent_samples("other") == []


def test_fetch_stall_is_the_idle_part_of_fetch_only_time() -> None:
    device = DeviceSamples(lambda: [(11.0, 12.0)], since=10.0, wall=lambda: 13.0)
    fetch_only = [(10.5, 11.5)]  # half of it overlaps compute
    assert signals.stall_seconds(device.recent_samples("reference0"), fetch_only) == 0.5
