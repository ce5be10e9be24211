"""The kvscope agent attached to a running reference engine, stepped by the caller.

`AttachedAgent` is the agent built by `agent.wiring.build_agent` from TOML text — the `vllm` scraper on
the engine's /metrics (`engine = "reference"`), `disk` on G4's device and `correlation` with `paths`
mapping G4 to that disk's read and written bytes — clocked by the caller: each `step()` runs the three
collectors in that order and ingests their readings, so a correlation window always sees the engine's
and the disk's counters of the same instant (the scheduler's threads would let the two drift by up to
one interval, which blurs the KV share of the path's traffic). Each step records a `Window`: what the
correlation engine concluded for G4.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvscope.agent.app.wiring import Agent, build_agent, components
from kvscope.agent.config.settings import load_config
from kvscope.agent.core import contract

ORDER = ("vllm", "disk", "correlation")  # engine and disk counters first, then the window over them


def agent_toml(metrics_url: str, device: str, interval: float = 0.25, requests_jsonl: str = "") -> str:
    """The agent's configuration: vLLM scraper on the engine, disk on G4's device, correlation with G4's path."""
    path = [f'kvscope_disk_read_bytes_total{{device="{device}"}}',
            f'kvscope_disk_written_bytes_total{{device="{device}"}}']
    lines = ["[exporters.prometheus]", "enabled = false", ""]
    if requests_jsonl:
        lines += ["[exporters.jsonl]", "enabled = true", f"path = {json.dumps(requests_jsonl)}", ""]
    lines += ["[analyses.correlation]", f"interval = {interval}",
              "paths = { G4 = [" + ", ".join(f"'{p}'" for p in path) + "] }", ""]
    for name in components().collectors:
        lines.append(f"[collectors.{name}]")
        lines.append(f"enabled = {'true' if name in ORDER else 'false'}")
        if name in ORDER:
            lines.append(f"interval = {interval}")
        if name == "vllm":
            lines += [f"urls = [{json.dumps(metrics_url)}]", 'engine = "reference"',
                      # the reference engine reports G4 hits as vLLM's "external_unspecified" source
                      'cache_hit_source_tiers = { external_unspecified = "G4" }']
        elif name == "disk":  # exactly G4's device, whatever its name (the default exclude drops loop*)
            lines += [f"include = [{json.dumps(device)}]", "exclude = []"]
        lines.append("")
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Window:
    """What the correlation engine concluded for G4 at the end of one window."""

    phase: str
    wall: float
    noisy_neighbour: float | None
    bandwidth_drop: float | None
    non_kv_share: float | None
    utilisation: float | None
    path_bps: float  # the device's read + written bytes/s over the window (what the agent's disk series say)
    fetch_bps: float | None  # G4 -> G2 bytes / seconds over the window (None: no fetch ended in it)


@dataclass
class AttachedAgent:
    """The agent, stepped by the caller (see the module docstring) and optionally by a ticker thread."""

    agent: Agent
    wall: Callable[[], float] = time.time
    windows: list[Window] = field(default_factory=list)
    phase: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _ticker: threading.Thread | None = None
    _last: tuple[float, tuple[float, float, float]] | None = None

    @classmethod
    def build(cls, metrics_url: str, device: str, requests_jsonl: str = "") -> AttachedAgent:
        config = load_config(agent_toml(metrics_url, device, requests_jsonl=requests_jsonl), components(),
                             environ={})
        return cls(build_agent(config))

    def step(self) -> None:
        with self._lock:
            for name in ORDER:
                collector = self.agent.collectors.get(name)
                readings = list(collector.collect() if collector is not None else self.agent.analyses[name].run())
                self.agent.store.ingest(name, readings, self.wall())
            now, totals = self.wall(), self._path_totals()
            last, self._last = self._last, (now, totals)
            if last is None or now <= last[0]:
                return
            dt = now - last[0]
            moved, spent = totals[1] - last[1][1], totals[2] - last[1][2]
            self.windows.append(Window(
                self.phase, now, self.gauge("kvscope_tier_noisy_neighbour"),
                self.gauge("kvscope_tier_fetch_bandwidth_drop_ratio"),
                self.gauge("kvscope_tier_path_non_kv_share_ratio"), self.gauge("kvscope_tier_path_utilisation_ratio"),
                (totals[0] - last[1][0]) / dt, moved / spent if spent > 0 else None))

    def _path_totals(self) -> tuple[float, float, float]:
        """(disk bytes read + written, G4 -> G2 bytes, G4 -> G2 seconds) as the store holds them now."""
        store = self.agent.store
        disk = sum(sum(store.values(n).values()) for n in
                   ("kvscope_disk_read_bytes_total", "kvscope_disk_written_bytes_total"))
        moved = sum(v for k, v in store.values(contract.KV_TRANSFER_BYTES).items() if k[3:] == ("G4", "G2"))
        spent = sum(v for k, v in store.values(contract.KV_TRANSFER_SECONDS).items() if k[3:] == ("G4", "G2"))
        return disk, moved, spent

    def gauge(self, name: str, tier: str = "G4") -> float | None:
        return self.agent.store.values(name).get((tier,))

    def totals(self, name: str) -> dict[tuple[str, ...], float]:
        return dict(self.agent.store.values(name))

    def start_ticking(self, interval: float) -> None:
        def tick() -> None:
            while not self._stop.wait(interval):
                self.step()

        self._stop.clear()
        self._ticker = threading.Thread(target=tick, name="agent-ticker", daemon=True)
        self._ticker.start()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=10)
        for job in self.agent.scheduler.jobs:
            if job.close is not None:
                job.close()
