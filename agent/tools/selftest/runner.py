"""Runs the selftest's scenarios with the agent attached and turns each engine run into checks."""

from __future__ import annotations

import platform
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvscope import __version__
from kvscope.agent.tools.selftest.checks import Check, check_run, confidence_checks, telemetry_checks
from kvscope.agent.tools.selftest.harness import Harness, RunCapture
from kvscope.agent.tools.selftest.kvbm_stack import STACK, KvbmStackHarness, KvbmStackPlan, stack_checks
from kvscope.agent.tools.selftest.noisy import NoisyPlan, noisy_checks
from kvscope.agent.tools.selftest.plans import EvictionPlan, NarrowPlan, SharedPromptsPlan, SweepPlan
from kvscope.agent.tools.selftest.whatif import WhatIfPlan, WhatIfResult, whatif_checks
from kvscope.collectors.host.inputs import block_device_of

Plan = SharedPromptsPlan | SweepPlan | NoisyPlan | EvictionPlan | NarrowPlan | KvbmStackPlan | WhatIfPlan
DEFAULT_PLANS: dict[str, Plan] = {
    # small geometry: real bytes, small files; queueing at concurrency 4 dominates TTFT
    "shared-prompts": SharedPromptsPlan(),
    # the seeds' G4 test with gpt-oss-120b's KV geometry (9 MiB blocks) and compute in real time
    "ttft-sweep": SweepPlan(lengths=(1024, 1536, 2048, 3072, 4096), block_tokens=128, time_scale=2.0,
                            model="gpt-oss-120b"),
    # the seeds' G4 test quiet, then with competing I/O on G4's disk (O_DIRECT block files)
    "noisy-neighbour": NoisyPlan(),
    # issue 12's repro at gpt-oss-120b's geometry: G1 keeps blocks and evicts them to G2 (offload)
    "g1-eviction": EvictionPlan(),
    # prompts of 1,650-1,800 tokens: the cost model must fall back to its prior and say so
    "narrow-prompts": NarrowPlan(),
    # one run predicts G1 twice as large and G2 removed; both are run and compared (gpt-oss-120b's geometry)
    "what-if": WhatIfPlan(),
}
# the other stacks `kvscope selftest --stack` runs; the plans above are the vLLM stack's
STACK_PLANS: dict[str, dict[str, Plan]] = {
    # the seeds' pod: vLLM 0.14.1 + Dynamo KVBM, gpt-oss-120b's KV geometry, the disk pool standing in for G4
    STACK: {STACK: KvbmStackPlan()},
}


class ScenarioUnavailable(Exception):
    """A chosen scenario cannot run on this machine; the message says why and what to do, in one line."""


def check_runnable(plans: dict[str, Plan], base: Path) -> None:
    """Before anything runs: the noisy-neighbour scenario loads G4's disk and reads that disk's counters, so
    its directory must be on a block device the disk collector sees (not tmpfs, overlay or NFS)."""
    if any(isinstance(plan, NoisyPlan) for plan in plans.values()) and block_device_of(base) is None:
        raise ScenarioUnavailable(f"noisy-neighbour needs its G4 directory on a local block device, and {base} "
                                  "is not on one (tmpfs, overlay or a network file system): give --workdir on "
                                  "a local disk, or run another --scenario")


def settle_check(run: RunCapture) -> Check:
    return Check(run.label, "agent settled (error: seconds waited)", 1.0, 1.0 if run.settled else 0.0,
                 run.settle_seconds, "totals stable before the deadline", run.settled)


def run_plans(plans: dict[str, Plan], workdir: Path | None = None, interval: float = 0.2
              ) -> tuple[list[tuple[str, Check]], dict[str, Any], dict[str, list[RunCapture]]]:
    """(scenario, check) rows, run metadata, and the captures per scenario."""
    rows: list[tuple[str, Check]] = []
    captures: dict[str, list[RunCapture]] = {}
    meta: dict[str, Any] = {"kvscope": __version__, "python": platform.python_version(), "scenarios": {}}
    with tempfile.TemporaryDirectory(prefix="kvscope-selftest-") as tmp:
        base = workdir or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        check_runnable(plans, base)
        for name, plan in plans.items():
            if isinstance(plan, NoisyPlan):
                start = time.monotonic()
                rows.extend((name, c) for c in noisy_checks(plan, base))
                meta["scenarios"][name] = {"plan": asdict(plan), "seconds": round(time.monotonic() - start, 2)}
                continue
            stack = isinstance(plan, KvbmStackPlan)
            harness = (KvbmStackHarness if stack else Harness)(base / name / "agent", interval=interval)
            if isinstance(plan, WhatIfPlan):  # every block sampled: the tiers are tens of blocks
                harness.reuse_sample_rate, harness.extra_config = 1.0, plan.agent_config()
            start = time.monotonic()
            try:
                result = plan.run(harness, base / name / "data")
            finally:
                harness.close()
            captures[name] = harness.runs
            meta["scenarios"][name] = {"plan": asdict(plan), "seconds": round(time.monotonic() - start, 2),
                                       "runs": {r.label: {"requests": len(r.truths), "disk": r.disk_device,
                                                          "settle_seconds": round(r.settle_seconds, 2)}
                                                for r in harness.runs}}
            for run in harness.runs:
                rows.append((name, settle_check(run)))
                checks = stack_checks if stack else telemetry_checks if isinstance(plan, WhatIfPlan) else check_run
                rows.extend((name, c) for c in checks(run))
                if isinstance(plan, NarrowPlan):
                    rows.extend((name, c) for c in confidence_checks(run))
            if isinstance(plan, WhatIfPlan):
                assert isinstance(result, WhatIfResult)
                rows.extend((name, c) for c in whatif_checks(result))
    return rows, meta, captures


def select(scenario: str, stack: str = "vllm") -> dict[str, Plan]:
    if stack != "vllm":
        return STACK_PLANS[stack]
    names: Sequence[str] = list(DEFAULT_PLANS) if scenario == "all" else [scenario]
    return {n: DEFAULT_PLANS[n] for n in names}
