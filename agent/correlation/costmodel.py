"""The cost model: prefill compute as a function of new and reused tokens, fetch per tier.

    compute(new, ctx) = a·new + b·new·(2·ctx + new)      (attention: b per token pair, summed)
    fetch(bytes_t)    = Σ_t bytes_t / BW_t + L_t

a and b are fitted by NNLS over a sliding window of recent pure-compute samples (requests whose fetch
is known or zero), so the model follows the workload as it drifts. BW_t is the tier's achieved
bandwidth over the last window that moved bytes (transfer bytes / transfer seconds from the store);
L_t is the per-fetch latency, the intercept of an NNLS fit of seconds on [bytes, 1] over per-fetch
samples where a source measured individual fetches (0 until there are enough of them).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvscope.agent.correlation.nnls import Fit, nnls


def compute_features(new: float, ctx: float) -> tuple[float, float]:
    return new, new * (2.0 * ctx + new)


@dataclass
class PrefillCostModel:
    """a, b fitted online; `prior_a`/`prior_b` (from config) stand in until the first fit."""

    window: int = 512
    min_samples: int = 8
    prior_a: float = 0.0
    prior_b: float = 0.0
    _samples: deque[tuple[float, float, float]] = field(init=False)
    _dirty: bool = field(init=False, default=False)
    fit: Fit | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self._samples = deque(maxlen=self.window)

    def add(self, new: float, ctx: float, seconds: float) -> None:
        """One pure-compute observation: `seconds` of GPU prefill for `new` tokens after `ctx` reused."""
        if new > 0 and ctx >= 0 and seconds > 0:
            self._samples.append((new, ctx, seconds))
            self._dirty = True

    def refit(self) -> Fit | None:
        if self._dirty and len(self._samples) >= self.min_samples:
            rows = [compute_features(n, c) for n, c, _ in self._samples]
            self.fit = nnls(rows, [s for _, _, s in self._samples])
        self._dirty = False
        return self.fit

    @property
    def a(self) -> float:
        return self.fit.coefficients[0] if self.fit else self.prior_a

    @property
    def b(self) -> float:
        return self.fit.coefficients[1] if self.fit else self.prior_b

    @property
    def known(self) -> bool:
        return self.a > 0 or self.b > 0

    def compute(self, new: float, ctx: float = 0.0) -> float:
        x1, x2 = compute_features(new, ctx)
        return self.a * x1 + self.b * x2

    def __len__(self) -> int:
        return len(self._samples)


@dataclass
class TierFetchModel:
    """Achieved bandwidth and per-fetch latency of one tier's read path."""

    window: int = 256
    min_samples: int = 8
    bandwidth: float | None = None  # bytes/s over the last window that moved bytes
    _fetches: deque[tuple[float, float]] = field(init=False)
    _dirty: bool = field(init=False, default=False)
    fit: Fit | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self._fetches = deque(maxlen=self.window)

    def observe_window(self, moved_bytes: float, seconds: float) -> float | None:
        """A window's transfer totals; returns the window's achieved bandwidth (None if nothing moved)."""
        if moved_bytes > 0 and seconds > 0:
            self.bandwidth = moved_bytes / seconds
            return self.bandwidth
        return None

    def add_fetch(self, moved_bytes: float, seconds: float) -> None:
        if moved_bytes > 0 and seconds > 0:
            self._fetches.append((moved_bytes, seconds))
            self._dirty = True

    def refit(self) -> Fit | None:
        if self._dirty and len(self._fetches) >= self.min_samples:
            self.fit = nnls([(b, 1.0) for b, _ in self._fetches], [s for _, s in self._fetches])
        self._dirty = False
        return self.fit

    @property
    def latency(self) -> float:
        return self.fit.coefficients[1] if self.fit else 0.0

    @property
    def effective_bandwidth(self) -> float | None:
        """The store's window bandwidth; else the per-fetch fit's slope; else unknown."""
        if self.bandwidth:
            return self.bandwidth
        if self.fit and self.fit.coefficients[0] > 0:
            return 1.0 / self.fit.coefficients[0]
        return None

    def seconds(self, moved_bytes: float) -> float | None:
        bw = self.effective_bandwidth
        if moved_bytes <= 0:
            return 0.0
        return None if bw is None else moved_bytes / bw + self.latency
