"""`kvscope selftest --stack dynamo-kvbm`: the seeds' stack — vLLM 0.14.1 under Dynamo's KV Block Manager,
its disk pool on a shared file system (G4) — against the agent's ordinary adapters.

The reference engine speaks vLLM 0.14.1 on its /metrics (agent/tools/reference/vllm_dialect.py: no by-source hits,
no offload families) and KVBM 0.9.0 on a second port (agent/tools/reference/kvbm_dialect.py); G2 is KVBM's host
pool and the engine's G4 directory its disk pool. The agent reads them with `vllm` and `dynamo_kvbm` as an
operator would configure them: KVBM's block size learned from vLLM's `cache_config_info`, bytes per token from
the model's geometry, and the disk pool's file system declared network-backed (`network_fstypes`, standing in
for the seeds' IBM Storage Scale), so the placement is decided from the mount table as in production.

Truth is what the engine's store did, in KVBM's accounting: a block reaching G1 from the disk pool is one
disk → G1 move (the engine reads the file through host memory; KVBM 0.9 counts no host step), every other
move is its own link; bytes are blocks × the engine's block bytes. Checks: those of every selftest run
(checks.compare: hits per tier and bytes per link exact, lookups, computed tokens, TTFT count and sum, spans,
prefill saved, fetch stall) except the TTFT shares and per-request prefill (see UNSEEN_IN_THIS_STACK), plus
the connector's matched tokens and the disk pool's placement in G4. The net saved seconds per tier are
reported, not checked (SPLIT_UNSEEN_IN_THIS_STACK).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from kvscope.agent.app.wiring import Agent, build_agent, components
from kvscope.agent.config.settings import load_config
from kvscope.agent.core.tiers import Tier
from kvscope.agent.tools.reference.device import DeviceSamples
from kvscope.agent.tools.reference.engine import Engine, EngineConfig
from kvscope.agent.tools.reference.geometry import preset
from kvscope.agent.tools.reference.kvbm_dialect import DISK_TIERS, KvbmServer
from kvscope.agent.tools.reference.openai_server import ReferenceServer
from kvscope.agent.tools.reference.scenarios import LoadResult, shared_prompts
from kvscope.agent.tools.reference.tierstore import Transfer
from kvscope.agent.tools.reference.tracing import RequestTracer
from kvscope.agent.tools.selftest.checks import Check, _exact, check_run, engine_samples
from kvscope.agent.tools.selftest.harness import (
    ENGINE_KIND,
    Harness,
    RunCapture,
    TallyingEngine,
    _get,
    _read_jsonl,
    _toml_str,
    agent_config_head,
    agent_config_tail,
)
from kvscope.agent.tools.selftest.plans import SMALL
from kvscope.collectors.sharedfs.common import parse_mountinfo
from kvscope.collectors.sharedfs.placement import mount_of

STACK = "dynamo-kvbm"


@dataclass(frozen=True, slots=True)
class KvbmStackPlan:
    requests: int = 24
    prompts: int = 6
    concurrency: int = 2
    prompt_tokens: int = 2048
    block_tokens: int = 128
    model: str = "gpt-oss-120b"  # "" = the small selftest geometry
    time_scale: float = 1.0
    seed: int = 0

    def base(self, data_dir: Path) -> EngineConfig:
        per_prompt = -(-self.prompt_tokens // self.block_tokens) + 1
        geometry = preset(self.model) if self.model else SMALL
        return EngineConfig(data_dir=data_dir, geometry=geometry, block_tokens=self.block_tokens,
                            g1_blocks=2 * per_prompt, g2_blocks=2 * per_prompt, g3_blocks=0,
                            g4_blocks=self.prompts * per_prompt, time_scale=self.time_scale, default_max_tokens=4,
                            vllm_version=(0, 14), kvbm=True)

    def run(self, harness: Harness, data_dir: Path) -> tuple[LoadResult, LoadResult]:
        return shared_prompts(self.base(data_dir), self.requests, self.prompts, self.concurrency,
                              self.prompt_tokens, self.seed, engine_factory=harness.attached)


class KvbmTallyingEngine(TallyingEngine):
    """Also counts block moves as KVBM accounts them: into G1 by the tier the block came from; a disk pool's
    read into host memory on the way to G1 is part of that move."""

    def __init__(self, config: EngineConfig) -> None:
        self.kvbm_blocks: dict[str, int] = {}
        super().__init__(config)

    def transfer(self, t: Transfer) -> None:
        if t.dst is Tier.G1:
            link = f"{t.origin or t.src}->{t.dst}"
        elif t.dst is Tier.G2 and t.src in DISK_TIERS:
            link = ""
        else:
            link = f"{t.src}->{t.dst}"
        if link:
            with self._tally_lock:
                self.kvbm_blocks[link] = self.kvbm_blocks.get(link, 0) + 1
        super().transfer(t)


def fstype_of(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> str:
    entry = mount_of(str(path.resolve()), parse_mountinfo(mountinfo.read_text()))
    return entry.fstype if entry else ""


def stack_config_text(vllm_url: str, kvbm_url: str, model: str, disk_dir: Path, requests_jsonl: Path,
                      interval: float, kv_bytes_per_token: int) -> str:
    """The agent's configuration for the seeds' pod, as an operator would write it."""
    fstype = fstype_of(disk_dir.parent)
    return agent_config_head(interval) + f"""\
[collectors.vllm]
enabled = true
urls = [{_toml_str(vllm_url)}]
engine = "{ENGINE_KIND}"
# the hits vLLM 0.14 cannot place are KVBM's: its adapter counts them per tier
cache_hit_source_tiers = {{ "external_unspecified" = "connector" }}

[collectors.dynamo_kvbm]
enabled = true
urls = [{_toml_str(kvbm_url)}]
engine = "{ENGINE_KIND}"
model = {_toml_str(model)}
disk_cache_dir = {_toml_str(str(disk_dir))}
network_fstypes = [{_toml_str(fstype)}]  # a local stand-in for the seeds' Storage Scale (gpfs)
geometry_url = {_toml_str(vllm_url)}  # KVBM's block size, learned from vLLM's cache_config_info
kv_bytes_per_token = {kv_bytes_per_token}

""" + agent_config_tail(model, requests_jsonl, "enabled = false")


class KvbmStackHarness(Harness):
    """Harness.attached for the seeds' stack: a KVBM /metrics server beside the engine's, the stack's config."""

    @contextmanager
    def attached(self, config: EngineConfig) -> Iterator[Engine]:
        label = self.label_of(config)
        run_dir = self.workdir / f"{len(self.runs)}-{label}"
        run_dir.mkdir(parents=True, exist_ok=True)
        engine = KvbmTallyingEngine(config)
        assert engine.kvbm is not None
        servers = (ReferenceServer(engine), KvbmServer(engine.kvbm))
        agent: Agent | None = None
        with contextlib.ExitStack() as stack:
            engine.start()
            stack.callback(engine.stop)
            for server in servers:
                server.start()
                stack.callback(server.stop)
            vllm_url, kvbm_url = f"{servers[0].url}/metrics", servers[1].url
            disk_dir = config.g4_path or config.data_dir / "g4"
            text = stack_config_text(vllm_url, kvbm_url, config.served_model_name, disk_dir,
                                     run_dir / "requests.jsonl", self.interval, config.geometry.bytes_per_token)
            (run_dir / "kvscope.toml").write_text(text)
            device_slot = DeviceSamples(lambda: list(engine.device_intervals), engine.wall_at(engine.clock()),
                                        time.time)
            agent = build_agent(load_config(text, components(), environ={}, origin="selftest"),
                                gpu_intervals=device_slot)
            agent.start()
            stack.callback(agent.stop)
            engine.tracer = RequestTracer(f"http://127.0.0.1:{self._receiver_port(agent)}")
            assert agent.server is not None
            yield engine
            engine.store.flush()
            engine.tracer.provider.force_flush()
            settled, waited = self._settle(agent, len(engine.truth.records))
            block_bytes = engine.block_bytes
            self.runs.append(RunCapture(
                label, list(engine.truth.records), {k: n * block_bytes for k, n in engine.kvbm_blocks.items()}, {},
                _get(f"http://127.0.0.1:{agent.server.port}/metrics"), _read_jsonl(run_dir / "requests.jsonl"),
                settled, waited, None, config.block_tokens, config))


# Neither vLLM 0.14.1 nor KVBM 0.9.0 reports transfer seconds, so from /metrics the agent cannot split a
# request's prefill phase into fetch and compute: the aggregate TTFT shares and the per-request prefill are
# not checked for this stack (fetch per request, fetch stall and prefill saved come from the spans and are).
UNSEEN_IN_THIS_STACK = ("TTFT share ", "requests with prefill ")
# A request's net saved seconds by tier are its avoided compute split by the tiers its hits came from, less its
# fetch seconds split by the tiers it read (correlation/tiermix.py). Spans give a request's reused tokens and
# fetch seconds but not their tiers, and without link seconds the counters cannot tell which of two requests in
# one scrape window read the slow tier: with two requests at a time, a G4 read of 6.3 ms beside a G2 read of
# 0.2 ms is shared between G2 and G4 by their hits. So the split per tier is reported here (its total, the
# request's own net saved seconds, stays checked): checked, it failed 3 runs in 12 on a loaded 2-core machine
# (G4 13-65 % over the truth, the G4 reads slowing; 25 % in the CI run it failed) and passed 15 of 15 on an
# idle one.
SPLIT_UNSEEN_IN_THIS_STACK = "prefill saved s (net) "
SPLIT_REPORTED = "reported (no transfer seconds in this stack: concurrent requests' reads not told apart by tier)"


def stack_checks(run: RunCapture) -> list[Check]:
    """The selftest's checks of the run that this stack's telemetry can answer, plus KVBM's matched tokens and
    its disk pool in G4."""
    checks = [_reported(c) if c.quantity.startswith(SPLIT_UNSEEN_IN_THIS_STACK) else c
              for c in check_run(run) if not c.quantity.startswith(UNSEEN_IN_THIS_STACK)]
    connector_truth = float(sum(v for t in run.truths for tier, v in t.tokens_by_tier.items() if tier != "G1"))
    matched = placed = 0.0
    for name, labels, value in engine_samples(run.exposition):
        if name == "kvscope_connector_hit_tokens_total":
            matched += value
        elif name == "kvscope_tier_placement_info" and labels.get("pool") == "kvbm_disk" and labels["tier"] == "G4":
            placed = value
    checks.append(_exact(run.label, "connector matched tokens (KVBM)", connector_truth, matched))
    checks.append(_exact(run.label, "KVBM disk pool placed in G4 (info metric)", 1.0, placed))
    return checks


def _reported(check: Check) -> Check:
    return replace(check, tolerance=SPLIT_REPORTED, passed=True)
