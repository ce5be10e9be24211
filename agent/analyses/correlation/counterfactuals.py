"""What the cache changed: recompute avoided, break-even bandwidth, TTFT without the cache.

All three come from the fitted cost model (costmodel.py), so they are estimates and are only made
where the inputs pin them down: a request's reuse must be known (cached tokens), and the model must
have been fitted or configured.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from kvscope.agent.analyses.correlation.costmodel import PrefillCostModel
from kvscope.agent.core.records import Attribution, RequestRecord


def recompute_avoided(record: RequestRecord, attribution: Attribution, model: PrefillCostModel) -> float | None:
    """compute(prompt, 0) − (prefill actually spent + fetch): seconds saved, negative when the cache cost time.

    None for requests that reused nothing (there is nothing to compare; the difference would only be
    the model's error) or whose reuse is unknown.
    """
    if not model.known or record.prompt_tokens is None or not record.cached_tokens:
        return None
    spent = attribution.seconds("prefill") + attribution.seconds("fetch")
    return model.compute(record.prompt_tokens, 0) - spent


def ttft_without_cache(record: RequestRecord, attribution: Attribution, model: PrefillCostModel) -> float | None:
    """frontend + queue + compute(prompt, 0) + other: the same request with every prompt token recomputed.

    Queue excludes a fetch that sat in it (async loads): without the cache there is nothing to load.
    """
    if not model.known or record.prompt_tokens is None or record.cached_tokens is None:
        return None
    return (attribution.seconds("frontend") + attribution.seconds("queue") + model.compute(record.prompt_tokens, 0)
            + attribution.seconds("other"))


def breakeven_bandwidth(tokens: float, a: float, b: float, latency: float, bytes_per_token: float) -> float:
    """BW*(n) = n·B_tok / (a·n + b·n² − L): fetching a reused n-token prefix at BW* costs what recomputing it does.

    Below BW* reuse from that tier is slower than recompute. When the per-fetch latency alone is at least
    the recompute time, no bandwidth makes fetching pay: +Inf.
    """
    if tokens <= 0 or bytes_per_token <= 0:
        raise ValueError("tokens and bytes_per_token must be > 0")
    recompute = a * tokens + b * tokens * tokens - latency
    return math.inf if recompute <= 0 else tokens * bytes_per_token / recompute


def typical_reused_tokens(records: Iterable[RequestRecord]) -> float | None:
    """The median reused prefix (cached tokens) over records that reused anything; None if none did."""
    reused = [r.cached_tokens for r in records if r.cached_tokens]
    return float(statistics.median(reused)) if reused else None
