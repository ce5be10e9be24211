"""The table of collectors the agent can run, by name. Config enables them by these names."""

from __future__ import annotations

from kvscope.agent.core.pipeline import CollectorSpec
from kvscope.collectors.engines import discovery as engine_discovery
from kvscope.collectors.engines import dynamo_frontend, dynamo_kvbm, lmcache, sglang, vllm_metrics
from kvscope.collectors.gpu.nvml import SPEC as NVML_SPEC
from kvscope.collectors.host import disk, network, process, rdma
from kvscope.collectors.kv_events import collector as vllm_kv_events
from kvscope.collectors.requests import otlp_traces, sglang_requests
from kvscope.collectors.sharedfs import gpfs, lustre, nfs

# Each collector module declares its own SPEC; this table lists them in data-flow order (host sources,
# GPU, engines, per-request sources), one a line. Analyses are not collectors: agent/app/wiring.py lists them.
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
    sglang_requests.SPEC,
]


def collector_specs() -> dict[str, CollectorSpec]:
    return {spec.name: spec for spec in _SPECS}
