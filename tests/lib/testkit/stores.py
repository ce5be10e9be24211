"""A store filled with the awkward cases of the exposition: escapes in label values and HELP, no labels, a
histogram with an infinite bucket. The exposition, HTTP and auth tests render it."""

from __future__ import annotations

import math

from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue, counter, gauge, histogram
from kvscope.agent.core.readings import HistogramSample, Sample
from kvscope.agent.core.store import Store

SPECS = [
    *AGENT_METRICS,
    counter("kvscope_x_bytes_total", "bytes", ("zeta", "alpha"), "Bytes with a \\ backslash\nand newline.", "t"),
    gauge("kvscope_y_blocks", "blocks", (), "No labels.", "t"),
    histogram("kvscope_z_seconds", "seconds", ("model", "engine"), "A histogram.", "t"),
]


def filled_store() -> Store:
    store = Store(Catalogue(SPECS))
    store.ingest("t", [
        Sample("kvscope_x_bytes_total", ("a\"b", "x\\y\nz"), 1.5e12),
        Sample("kvscope_x_bytes_total", ("plain", "v"), 3.0),
        Sample("kvscope_y_blocks", (), 12345678.0),
        HistogramSample("kvscope_z_seconds", ("m/1", "vllm"),
                        ((0.001, 0.0), (0.5, 3.0), (2.5, 7.0), (1e4, 8.0), (math.inf, 9.0)), 12.25, 9.0),
    ], now=0.0)
    store.set_gauge("kvscope_build_info", ("0.1.0",), 1.0, 0.0)
    return store
