"""Exact non-negative least squares for a handful of parameters, in pure Python.

min ||X·β − y||² subject to β ≥ 0 is a convex problem whose optimum is the unconstrained least-squares
solution on some subset of the columns (the "passive set") with the rest held at zero. With 2-3
parameters there are at most 8 subsets, so enumerating them and keeping the feasible one with the
smallest residual is exact and cheaper than an iterative solver, and needs no scipy (the sidecar's
runtime set has numpy only, for the KV-event block sets). Columns are scaled to unit norm and solved
by modified Gram-Schmidt, because the columns of the prefill model differ by ~10⁶ in magnitude (tokens
vs tokens²) and normal equations would square that condition number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

MAX_PARAMS = 4


@dataclass(frozen=True, slots=True)
class Fit:
    coefficients: tuple[float, ...]
    n: int  # samples used
    r2: float  # 1 − SS_res/SS_tot (NaN when y has no spread)
    rmse: float  # root-mean-square residual, in y's unit
    max_abs_residual: float


def _least_squares(columns: list[list[float]], y: Sequence[float]) -> list[float] | None:
    """Unconstrained LS by modified Gram-Schmidt on unit-norm columns; None when rank-deficient."""
    scales = [math.sqrt(math.fsum(v * v for v in col)) for col in columns]
    if any(s == 0.0 for s in scales):
        return None
    q = [[v / s for v in col] for col, s in zip(columns, scales, strict=True)]
    k = len(q)
    r = [[0.0] * k for _ in range(k)]
    for j in range(k):
        for i in range(j):
            r[i][j] = math.fsum(a * b for a, b in zip(q[i], q[j], strict=True))
            q[j] = [b - r[i][j] * a for a, b in zip(q[i], q[j], strict=True)]
        norm = math.sqrt(math.fsum(v * v for v in q[j]))
        if norm < 1e-12:  # this column is (numerically) a combination of the earlier ones
            return None
        r[j][j] = norm
        q[j] = [v / norm for v in q[j]]
    qty = [math.fsum(a * b for a, b in zip(qj, y, strict=True)) for qj in q]
    beta = [0.0] * k
    for i in reversed(range(k)):
        beta[i] = (qty[i] - math.fsum(r[i][j] * beta[j] for j in range(i + 1, k))) / r[i][i]
    return [b / s for b, s in zip(beta, scales, strict=True)]


def _residuals(rows: Sequence[Sequence[float]], y: Sequence[float], beta: Sequence[float]) -> list[float]:
    return [yi - sum(x * b for x, b in zip(row, beta, strict=True)) for row, yi in zip(rows, y, strict=True)]


def nnls(rows: Sequence[Sequence[float]], y: Sequence[float]) -> Fit:
    """Fit y ≈ rows·β with β ≥ 0. `rows` are samples, each with the same 1..4 features."""
    if len(rows) != len(y):
        raise ValueError("rows and y differ in length")
    if not rows:
        raise ValueError("no samples")
    k = len(rows[0])
    if not 1 <= k <= MAX_PARAMS or any(len(row) != k for row in rows):
        raise ValueError(f"every row needs the same 1..{MAX_PARAMS} features")
    best: tuple[float, list[float]] | None = None
    for size in range(k, -1, -1):
        for passive in combinations(range(k), size):
            beta = [0.0] * k
            if passive:
                solved = _least_squares([[row[j] for row in rows] for j in passive], y)
                if solved is None or any(b < 0 for b in solved):
                    continue
                for j, b in zip(passive, solved, strict=True):
                    beta[j] = b
            ss = sum(r * r for r in _residuals(rows, y, beta))
            if best is None or ss < best[0]:
                best = (ss, beta)
    assert best is not None  # the empty passive set is always feasible
    ss_res, beta = best
    residuals = _residuals(rows, y, beta)
    mean = math.fsum(y) / len(y)
    ss_tot = math.fsum((v - mean) ** 2 for v in y)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan
    return Fit(tuple(beta), len(y), r2, math.sqrt(ss_res / len(y)), max(abs(r) for r in residuals))
