"""Tier paths: series selectors naming a tier's path in the store, e.g. `kvscope_fs_read_bytes_total{mount="/gpfs"}`.

The PromQL subset: a catalogued metric name and optional `label="value"` equality matchers. Every
series of the metric whose labels match is summed as traffic on the path, and `PathWatch` compares
that traffic with the KV bytes the engine moved on the tier.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvscope.agent.analyses.correlation import cross_layer as signals
from kvscope.agent.analyses.correlation import metrics as m
from kvscope.agent.core.catalogue import Catalogue
from kvscope.agent.core.reader import Window

if TYPE_CHECKING:
    from kvscope.agent.analyses.correlation.aggregate import WindowSummary
    from kvscope.agent.analyses.correlation.options import CorrelationOptions
    from kvscope.agent.analyses.correlation.state import Outputs

log = logging.getLogger("kvscope.analyses.correlation")
PATH_GAUGES = (m.PATH_UTILISATION, m.BANDWIDTH_DROP, m.NON_KV_SHARE, m.NOISY_NEIGHBOUR, m.SATURATED)
_SELECTOR = re.compile(r'^\s*([a-z_][a-z0-9_]*)\s*(?:\{(.*)\})?\s*$')
_MATCHER = re.compile(r'\s*([a-z_][a-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


@dataclass(frozen=True, slots=True)
class PathSelector:
    name: str
    matchers: tuple[tuple[str, str], ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.matchers)


def parse_selector(text: str) -> PathSelector:
    match = _SELECTOR.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a series selector like kvscope_fs_read_bytes_total{{mount=\"/gpfs\"}}")
    body, matchers = (match.group(2) or "").strip(), []
    pos = 0
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        if m is None:
            raise ValueError(f"{text!r}: expected label=\"value\" at {body[pos:]!r}")
        matchers.append((m.group(1), re.sub(r'\\(.)', r'\1', m.group(2))))
        pos = m.end()
    return PathSelector(match.group(1), tuple(matchers))


class PathWatch:
    """Noisy neighbour and saturation per tier path (correlation.md §5): each window's traffic on the
    path's series against the KV bytes the engine moved on that tier, compared with a quiet baseline."""

    def __init__(self, options: CorrelationOptions, outputs: Outputs) -> None:
        self._o, self._out = options, outputs
        self._selectors = {t: [parse_selector(s) for s in sel] for t, sel in options.paths.items()}
        self._baselines: dict[str, deque[signals.PathWindow]] = defaultdict(
            lambda: deque(maxlen=options.baseline_windows))
        self._peaks: dict[str, float] = defaultdict(float)
        self._thresholds = signals.Thresholds(options.near_peak, options.bandwidth_drop, options.kv_share_fall,
                                              options.saturated)
        self._unseen: set[str] = set()  # tiers whose selectors match no series: said once, no signals

    def metrics(self, catalogue: Catalogue) -> list[str]:
        """The series the paths name that the agent can hold (what the reader must read)."""
        return [s.name for sel in self._selectors.values() for s in sel if catalogue.get(s.name) is not None]

    def step(self, snapshot: Window, window: WindowSummary, dt: float) -> None:
        for tier, selectors in self._selectors.items():
            total, matched = 0.0, False
            for selector in selectors:
                if not snapshot.reads(selector.name):  # not a metric the agent holds
                    continue
                for point in snapshot.series(selector.name):
                    if selector.matches(point.labels):
                        total += point.rate_growth
                        matched = True
            if not self._seen(tier, matched):
                continue
            seconds = window.onboard_seconds.get(tier, 0.0)
            current = signals.PathWindow(
                total / dt, window.tier_bytes.get(tier, 0.0) / dt,
                window.onboard_bytes.get(tier, 0.0) / seconds if seconds > 0 else None,
                window.fetch / window.ttft if window.ttft > 0 else None)
            self._peaks[tier] = max(self._peaks[tier], current.path_bps)
            peak = self._o.path_capacity_bytes_per_second.get(tier) or self._peaks[tier]
            verdict = signals.assess_path(current, self._baselines[tier], peak, self._thresholds)
            if not (verdict.noisy_neighbour or verdict.saturated) and current.path_bps > 0:
                self._baselines[tier].append(current)
            gauges = self._out.gauges
            for name, ratio in ((m.PATH_UTILISATION, verdict.utilisation),
                                (m.BANDWIDTH_DROP, verdict.bandwidth_drop),
                                (m.NON_KV_SHARE, verdict.non_kv_share)):
                if ratio is not None:
                    gauges[(name, (tier,))] = ratio
            gauges[(m.NOISY_NEIGHBOUR, (tier,))] = float(verdict.noisy_neighbour)
            gauges[(m.SATURATED, (tier,))] = float(verdict.saturated)

    def _seen(self, tier: str, matched: bool) -> bool:
        """Whether the tier's path has a series this window. A path the agent cannot see (its collector off,
        e.g. in a sidecar whose node agent reads the host) exports no verdict rather than a 0 that reads as
        "quiet": its gauges are removed, and the operator is told once."""
        if matched:
            if tier in self._unseen:
                self._unseen.discard(tier)
                log.info("correlation paths.%s: its path's series are here again", tier)
            return True
        if tier not in self._unseen:
            self._unseen.add(tier)
            log.warning("correlation paths.%s: none of its selectors (%s) matches a series this agent holds; no "
                        "noisy-neighbour or saturation verdict for %s until one does (is the collector enabled?)",
                        tier, ", ".join(s.name for s in self._selectors[tier]), tier)
        for name in PATH_GAUGES:
            self._out.gauges.pop((name, (tier,)), None)
        return False
