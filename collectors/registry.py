"""The table of collectors the agent can run, by name. Config enables them by these names."""

from __future__ import annotations

from kvscope.agent.correlation.engine import SPEC as CORRELATION_SPEC
from kvscope.collectors import (
    agent_self,
    disk,
    gpfs,
    lustre,
    network,
    nfs,
    otlp_traces,
    rdma,
    vllm_kv_events,
    vllm_metrics,
)
from kvscope.collectors.base import CollectorSpec
from kvscope.collectors.gpu_nvml import SPEC as NVML_SPEC

# Each collector module declares its own SPEC; this table lists them in data-flow order (host sources,
# GPU, engines, per-request sources, then the correlation engine that reads them all), one a line.
_SPECS: list[CollectorSpec] = [
    disk.SPEC,
    network.SPEC,
    rdma.SPEC,
    nfs.SPEC,
    lustre.SPEC,
    gpfs.SPEC,
    agent_self.SPEC,
    NVML_SPEC,
    vllm_metrics.SPEC,
    vllm_kv_events.SPEC,
    otlp_traces.SPEC,
    CORRELATION_SPEC,
]


def collector_specs() -> dict[str, CollectorSpec]:
    return {spec.name: spec for spec in _SPECS}
