"""Noisy neighbour: the competing-I/O injector, the agent's configuration, and the scenario with the agent
attached — TTFT grows through fetch, and the contention signal is raised with noise and never without.

The scenario needs G4 on a block device whose counters show only its own traffic. As root (make test and
CI are) it makes one: ext4 on a loop device of its own (tests/lib/testkit/block_devices.py), which no other process
uses, so other test runs loading the machine's disk cannot put a neighbour on its path. Otherwise it runs
on the temp dir's disk when that is a block device, and a run it cannot judge (no block device, foreign
traffic in the quiet run) is a skip — a failure under KVSCOPE_REQUIRE_TOOLS=1.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from kvscope.agent.app.wiring import components
from kvscope.agent.config.settings import load_config
from kvscope.agent.tools.reference.attached_agent import agent_toml
from kvscope.agent.tools.reference.engine import EngineConfig
from kvscope.agent.tools.reference.noise import NoiseInjector, NoiseSpec
from kvscope.agent.tools.reference.noisy_neighbour import run_noisy_neighbour
from kvscope.collectors.host.inputs import block_device_of
from testkit.block_devices import LoopUnavailable, loop_filesystem
from testkit.environment import missing_environment

MIB = 1 << 20


@pytest.mark.parametrize("mode", ["read", "write", "mixed"])
def test_injector_moves_bytes_and_stops(tmp_path: Path, mode: str) -> None:
    spec = NoiseSpec(threads=2, mode=mode, io_bytes=MIB, file_bytes=8 * MIB)  # type: ignore[arg-type]
    injector = NoiseInjector(tmp_path, spec)
    with injector:
        time.sleep(0.2)
    assert injector.errors == []
    moved = injector.bytes_moved
    assert moved > 0 and moved % MIB == 0
    assert (injector.bytes_read > 0) == (mode != "write")
    assert (injector.bytes_written > 0) == (mode != "read")
    time.sleep(0.05)
    assert injector.bytes_moved == moved  # the threads are gone
    assert injector.path.stat().st_size == 8 * MIB  # writes stay inside the file


def test_injector_respects_its_cap(tmp_path: Path) -> None:
    cap = 8 * MIB  # bytes/s over both threads
    injector = NoiseInjector(tmp_path, NoiseSpec(threads=2, io_bytes=MIB, file_bytes=8 * MIB, bytes_per_second=cap))
    injector.prepare()
    with injector:
        time.sleep(0.5)
    elapsed = (injector.stopped_at or 0) - (injector.started_at or 0)
    # each thread may be one I/O ahead of its pace when stopped
    assert 0 < injector.bytes_moved <= cap * elapsed + 2 * MIB


def test_spec_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        NoiseSpec(io_bytes=1000)
    with pytest.raises(ValueError):
        NoiseSpec(threads=4, io_bytes=MIB, file_bytes=2 * MIB)


def test_agent_config_binds() -> None:
    config = load_config(agent_toml("http://127.0.0.1:1/metrics", "vda"), components(), environ={})
    enabled = {name for name, (settings, _) in config.collectors.items() if settings.enabled}
    assert enabled == {"vllm", "disk"} and config.analyses["correlation"][0].enabled
    vllm, disk = (config.collectors[n][1] for n in ("vllm", "disk"))
    corr = config.analyses["correlation"][1]
    assert vllm.engine == "reference" and vllm.cache_hit_source_tiers["external_unspecified"] == "G4"
    assert disk.include == ["vda"] and disk.exclude == []  # G4's device is watched even when it is a loop device
    assert corr.paths == {"G4": ['kvscope_disk_read_bytes_total{device="vda"}',
                                 'kvscope_disk_written_bytes_total{device="vda"}']}


@contextmanager
def g4_directory(tmp_path: Path) -> Iterator[tuple[Path, bool]]:
    """(directory for the engine, whether its device is the test's own)."""
    with ExitStack() as stack:
        try:
            directory, private = stack.enter_context(loop_filesystem(tmp_path))[0], True
        except LoopUnavailable as exc:
            if block_device_of(tmp_path) is None:
                missing_environment(f"{tmp_path} is not on a block device the disk collector can see, and {exc}")
            directory, private = tmp_path, False
        yield directory, private


def test_noise_slows_fetch_and_raises_the_signal_only_with_noise(tmp_path: Path) -> None:
    with g4_directory(tmp_path) as (directory, private):
        check_noisy_neighbour(directory, private)


def check_noisy_neighbour(directory: Path, private: bool) -> None:
    base = EngineConfig.seeds_g4(directory / "engine", g1_blocks=1, g4_blocks=0, default_max_tokens=4)
    # Concurrency 1: the engine has one device slot, so with more clients the slower fetch of one request
    # also shows as queue time of the next; alone, the TTFT increase is the fetch's own.
    r = run_noisy_neighbour(base, requests=16, prompts=4, concurrency=1, prompt_tokens=2048,
                            noise=NoiseSpec(threads=4, file_bytes=512 * MIB))
    quiet, noisy = r.quiet_view, r.noisy_view
    assert quiet.requests == noisy.requests == 16  # the agent saw every request of each run
    # and attributed all of each run's TTFT before it was read: read as the last client got its last token,
    # the aggregate still held the window whose queue and prefill times the engine had not yet observed, and
    # under load a run's fetch read 0.005 s a request of a TTFT of 0.079 s (its components missing, not small)
    for view in (quiet, noisy):
        assert view.settled and sum(view.components.values()) == pytest.approx(view.ttft, rel=1e-6), view
    assert r.noise_bytes > 0
    # The build VM's disk is shared with other processes (other test runs): when they load it during the
    # quiet run, there IS a neighbour then and the agent rightly says so (seen: quiet windows at 0.5-0.7
    # non-KV share, signal raised); neither "silent without noise" nor quiet-vs-noisy can be shown then.
    # On the test's own device there is no one else, and such windows are the run's own (file system
    # metadata, scrape timing): the checks below hold regardless.
    neighbours = [w for w in quiet.windows if (w.non_kv_share or 0) >= 0.25 and (w.utilisation or 0) >= 0.8]
    if neighbours and not private:
        missing_environment(f"foreign traffic on {r.device} during the quiet run (non-KV share up to "
                            f"{max(w.non_kv_share or 0 for w in neighbours):.2f} near the path's peak): quiet vs "
                            "noisy needs a disk nobody else is using")
    # the agent puts the TTFT increase on fetch
    d_ttft = noisy.ttft / noisy.requests - quiet.ttft / quiet.requests
    d_fetch = (noisy.components["fetch"] - quiet.components["fetch"]) / 16
    # where each run's seconds went, for a failure to say (once, in a clean-clone run, d_fetch was 0.48 of
    # d_ttft where 10 probes gave 0.98-1.00: the rest of the increase is not known yet)
    split = {label: {c: round(v / 16, 4) for c, v in view.components.items()} | {"ttft": round(view.ttft / 16, 4)}
             for label, view in (("quiet", quiet), ("noisy", noisy))}
    assert d_ttft > 0, split
    assert d_fetch >= 0.7 * d_ttft, split
    assert noisy.fetch_share > quiet.fetch_share
    assert noisy.g4_bytes / noisy.g4_seconds < 0.8 * quiet.g4_bytes / quiet.g4_seconds
    assert r.noisy.rps < r.quiet.rps
    # the contention signal: silent in the quiet run, raised with noise
    assert len(quiet.windows) >= 5 and quiet.raised == 0
    assert noisy.raised >= 3  # measured 11-21 of ~20 windows; depends on the path staying near its peak
    fetching = [w for w in noisy.windows if w.fetch_bps is not None]
    assert statistics.median(w.bandwidth_drop or 0.0 for w in fetching) >= 0.2
    assert statistics.median(w.non_kv_share or 0.0 for w in fetching) >= 0.25
    for w in noisy.windows:
        if w.noisy_neighbour == 1.0:
            assert w.bandwidth_drop is not None and w.bandwidth_drop >= 0.2
            assert w.non_kv_share is not None and w.non_kv_share > 0.25
