"""The cost model: prefill compute as a function of new and reused tokens, fetch per tier.

    compute(new, ctx) = a·new + b·new·(2·ctx + new)      (attention: b per token pair, summed)
    fetch(bytes_t)    = Σ_t bytes_t / BW_t + L_t

a and b are fitted by NNLS over a sliding window of recent pure-compute samples (requests whose fetch
is known or zero), so the model follows the workload as it drifts. BW_t is the tier's achieved
bandwidth over the last window that moved bytes (transfer bytes / transfer seconds from the store);
L_t is the per-fetch latency, the intercept of an NNLS fit of seconds on [bytes, 1] over per-fetch
samples where a source measured individual fetches (0 until there are enough of them).

The model knows when it does not know. a and b are told apart by how compute grows with the prompt;
samples of prompts of nearly one length cannot tell a linear cost from a quadratic one, and the fit then
trades one coefficient for the other (prompts of 1,650-1,800 tokens gave a = 4.2e-6, b = 2.5e-8 against
the engine's 4.136e-5, 1.584e-9): right at that length, far off anywhere else. So a fit is trusted only
when (1) the prompt lengths in its window span at least a factor `min_spread` (2) and (2) the standard
errors of its coefficients are small: at the longest prompt in the window, neither term may move the
recompute estimate compute(P, 0) by more than `max_relative_error` (10 %). A fit that fails keeps the
*prior's shape* — the configured a, b, else the seeds' two published recompute points — and fits only
its scale to the samples (one parameter, which samples of one length do determine); so does a model with
fewer than `min_samples` samples. Everything built on such a model is marked low-confidence: the prior's
shape is only as right for this engine as its source.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from kvscope.agent.analyses.correlation.nnls import Fit, nnls

# The seeds' recompute points (gpt-oss-120b on one RTX PRO 6000, shared/seeds/summary.md): 0.572 s at 10k
# tokens, 32.14 s at 130k. Through both, t(n) = a·n + b·n² gives the prior's shape when none is configured.
SEED_POINTS = ((10_000, 0.572), (130_000, 32.14))


def fit_two_points(p1: tuple[float, float], p2: tuple[float, float]) -> tuple[float, float]:
    """a, b of t(n) = a·n + b·n² through two (tokens, seconds) points."""
    (n1, t1), (n2, t2) = p1, p2
    b = (t2 / n2 - t1 / n1) / (n2 - n1)
    return t1 / n1 - b * n1, b


SEED_A, SEED_B = fit_two_points(*SEED_POINTS)


def compute_features(new: float, ctx: float) -> tuple[float, float]:
    return new, new * (2.0 * ctx + new)


def term_uncertainty(rows: list[tuple[float, float]], y: list[float], fit: Fit, prompt: float) -> float:
    """max over the two terms of SE(coefficient) × its feature at compute(prompt, 0), / that estimate.

    Standard errors from σ²·(XᵀX)⁻¹ with σ² = RSS/(n − 2), computed on unit-norm columns. +Inf when the
    columns are collinear, the estimate is not positive or there are too few samples to have an error.
    """
    n = len(rows)
    estimate = fit.coefficients[0] * prompt + fit.coefficients[1] * prompt * prompt
    if n <= 2 or estimate <= 0:
        return math.inf
    norms = [math.sqrt(math.fsum(r[k] * r[k] for r in rows)) for k in (0, 1)]
    if min(norms) == 0:
        return math.inf
    # with unit-norm columns XᵀX = [[1, c], [c, 1]], c the cosine between them: its inverse's diagonal is
    # 1 / (1 − c²) for both, which blows up as the columns become collinear (prompts of one length)
    cosine = math.fsum(r[0] * r[1] for r in rows) / (norms[0] * norms[1])
    if 1.0 - cosine * cosine <= 1e-15:
        return math.inf
    a, b = fit.coefficients
    sigma2 = math.fsum((yi - a * r[0] - b * r[1]) ** 2 for r, yi in zip(rows, y, strict=True)) / (n - 2)
    features = (prompt, prompt * prompt)
    return max(math.sqrt(sigma2 / (1.0 - cosine * cosine)) / norms[k] * features[k] / estimate for k in (0, 1))


@dataclass
class PrefillCostModel:
    """a, b fitted online; `prior_a`/`prior_b` (from config) stand in until the first fit, and give the shape
    a fit without enough spread falls back to (the seeds' shape when they are 0)."""

    window: int = 512
    min_samples: int = 8
    prior_a: float = 0.0
    prior_b: float = 0.0
    max_relative_error: float = 0.1
    min_spread: float = 2.0
    _samples: deque[tuple[float, float, float]] = field(init=False)
    _dirty: bool = field(init=False, default=False)
    fit: Fit | None = field(init=False, default=None)  # the last two-coefficient fit, confident or not
    uncertainty: float = field(init=False, default=math.inf)  # term_uncertainty of that fit
    spread: float = field(init=False, default=0.0)  # longest / shortest prompt (new + ctx) in the window
    prior_scale: float | None = field(init=False, default=None)  # the prior's fitted scale, when it is used

    def __post_init__(self) -> None:
        self._samples = deque(maxlen=self.window)

    def add(self, new: float, ctx: float, seconds: float) -> None:
        """One pure-compute observation: `seconds` of GPU prefill for `new` tokens after `ctx` reused."""
        if new > 0 and ctx >= 0 and seconds > 0:
            self._samples.append((new, ctx, seconds))
            self._dirty = True

    def refit(self) -> Fit | None:
        """Refits after new samples: a and b once there are `min_samples`, the prior's scale before that (and
        whenever the fit is not trusted)."""
        if self._dirty and self._samples:
            rows = [compute_features(n, c) for n, c, _ in self._samples]
            y = [s for _, _, s in self._samples]
            longest = max(n + c for n, c, _ in self._samples)
            self.spread = longest / min(n + c for n, c, _ in self._samples)
            if len(self._samples) >= self.min_samples:
                self.fit = nnls(rows, y)
                self.uncertainty = term_uncertainty(rows, y, self.fit, longest)
            self.prior_scale = None if self.confident else self._scale(rows, y)
        self._dirty = False
        return self.fit

    def _scale(self, rows: list[tuple[float, float]], y: list[float]) -> float | None:
        """Least-squares s ≥ 0 of y ≈ s·(a0·x1 + b0·x2) with the prior's shape (a0, b0)."""
        a0, b0 = self.prior_shape
        shape = [a0 * x1 + b0 * x2 for x1, x2 in rows]
        denominator = math.fsum(v * v for v in shape)
        if denominator <= 0:
            return None
        return max(0.0, math.fsum(v * t for v, t in zip(shape, y, strict=True)) / denominator)

    @property
    def prior_shape(self) -> tuple[float, float]:
        return (self.prior_a, self.prior_b) if self.prior_a > 0 or self.prior_b > 0 else (SEED_A, SEED_B)

    @property
    def confident(self) -> bool:
        """The fit's coefficients are pinned down (see the module docstring)."""
        return (self.fit is not None and self.spread >= self.min_spread
                and self.uncertainty <= self.max_relative_error)

    @property
    def basis(self) -> str:
        """Where a and b come from: fit, prior_scaled (too few samples, or a fit not trusted), prior (configured,
        no samples yet), none."""
        if self.confident:
            return "fit"
        if self.prior_scale is not None:
            return "prior_scaled"
        return "prior" if self.prior_a > 0 or self.prior_b > 0 else "none"

    @property
    def coefficients(self) -> tuple[float, float]:
        """(a, b) in use: the fit's, the prior's shape × its fitted scale, the configured prior, or zeros."""
        basis = self.basis
        if basis == "fit":
            assert self.fit is not None
            return self.fit.coefficients[0], self.fit.coefficients[1]
        if basis == "prior_scaled":
            a0, b0 = self.prior_shape
            return a0 * (self.prior_scale or 0.0), b0 * (self.prior_scale or 0.0)
        return self.prior_a, self.prior_b

    @property
    def a(self) -> float:
        return self.coefficients[0]

    @property
    def b(self) -> float:
        return self.coefficients[1]

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
