"""Prefill cost model (correlation.md §3): compute(new, ctx) = a·new + b·new·(2·ctx + new).

b·n² summed over positions: each new token attends to the ctx reused tokens and the new ones before it.
The defaults go exactly through the seeds' two recompute points (0.572 s at 10k tokens and 32.14 s at
130k tokens, gpt-oss-120b on one RTX PRO 6000): a ≈ 4.136e-5 s/token, b ≈ 1.584e-9 s/token².
"""

from __future__ import annotations

from dataclasses import dataclass

SEED_POINTS = ((10_000, 0.572), (130_000, 32.14))


def fit_two_points(p1: tuple[int, float], p2: tuple[int, float]) -> tuple[float, float]:
    """a, b of t(n) = a·n + b·n² through two (tokens, seconds) points."""
    (n1, t1), (n2, t2) = p1, p2
    b = (t2 / n2 - t1 / n1) / (n2 - n1)
    a = t1 / n1 - b * n1
    return a, b


_A, _B = fit_two_points(*SEED_POINTS)


@dataclass(frozen=True, slots=True)
class CostModel:
    a: float = _A  # s/token
    b: float = _B  # s/token²
    decode_step: float = 0.02  # s per output token at batch 1 (order of a 120B MoE step; not from the seeds)

    def compute(self, new: int, ctx: int = 0) -> float:
        return self.a * new + self.b * new * (2 * ctx + new)

    def recompute(self, prompt: int) -> float:
        return self.compute(prompt, 0)
