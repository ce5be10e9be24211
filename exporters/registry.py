"""The table of sinks the agent can run, each configured by its `[exporters.NAME]` section."""

from __future__ import annotations

from typing import Any

from kvscope.agent.core.pipeline import SinkSpec
from kvscope.exporters import jsonl
from kvscope.exporters.otlp import settings as otlp
from kvscope.exporters.prometheus import server as prometheus

# in the order they start (and stop in reverse): the /metrics server last, once everything it serves is up
_SPECS: list[SinkSpec[Any]] = [jsonl.SPEC, otlp.SPEC, prometheus.SPEC]


def sink_specs() -> dict[str, SinkSpec[Any]]:
    return {spec.name: spec for spec in _SPECS}
