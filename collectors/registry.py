"""The table of collectors the agent can run, by name. Config enables them by these names."""

from __future__ import annotations

from kvscope.agent.pipeline import CollectorSpec
from kvscope.collectors import (
    disk,
    dynamo_frontend,
    dynamo_kvbm,
    engine_discovery,
    gpfs,
    lmcache,
    lustre,
    network,
    nfs,
    otlp_traces,
    process,
    rdma,
    sglang,
    vllm_kv_events,
    vllm_metrics,
)
from kvscope.collectors.gpu_nvml import SPEC as NVML_SPEC

# Each collector module declares its own SPEC; this table lists them in data-flow order (host sources,
# GPU, engines, per-request sources), one a line. Analyses are not collectors: agent/wiring.py lists them.
_SPECS: list[CollectorSpec] = [
    disk.SPEC,
    network.SPEC,
    rdma.SPEC,
    nfs.SPEC,
    lustre.SPEC,
    gpfs.SPEC,
    process.SPEC,
    NVML_SPEC,
    vllm_metrics.SPEC,
    vllm_kv_events.SPEC,
    dynamo_kvbm.SPEC,
    dynamo_frontend.SPEC,
    sglang.SPEC,
    lmcache.SPEC,
    engine_discovery.SPEC,
    otlp_traces.SPEC,
]


def collector_specs() -> dict[str, CollectorSpec]:
    return {spec.name: spec for spec in _SPECS}
