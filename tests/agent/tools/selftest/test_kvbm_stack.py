"""`kvscope selftest --stack dynamo-kvbm`: the reference engine as vLLM 0.14.1 + Dynamo KVBM, the agent's
ordinary `vllm` and `dynamo_kvbm` adapters attached, hits per tier and bytes per link against the truth."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvscope.agent.tools.reference.engine import Engine
from kvscope.agent.tools.reference.kvbm_dialect import KvbmServer
from kvscope.agent.tools.reference.scenarios import running_engine
from kvscope.agent.tools.selftest.checks import Check
from kvscope.agent.tools.selftest.harness import RunCapture
from kvscope.agent.tools.selftest.kvbm_stack import KvbmStackPlan, stack_checks
from kvscope.agent.tools.selftest.runner import run_plans

pytestmark = pytest.mark.integration
# small and quick: the selftest geometry (2 KiB/token); `kvscope selftest --stack dynamo-kvbm` runs gpt-oss-120b's
PLAN = KvbmStackPlan(requests=12, prompts=4, concurrency=2, prompt_tokens=1024, block_tokens=64, model="")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Check], list[RunCapture]]]:
    rows, _, captures = run_plans({"dynamo-kvbm": PLAN}, tmp_path_factory.mktemp("stack"))
    yield [c for _, c in rows], captures["dynamo-kvbm"]


def _misses(checks: list[Check]) -> list[str]:
    return [f"{c.run}: {c.quantity} truth {c.truth} measured {c.measured}" for c in checks if not c.passed]


def test_the_stack_passes(stack: tuple[list[Check], list[RunCapture]]) -> None:
    """Once the vLLM adapter leaves connector hits to the connector's adapter (docs/engines.md, "no double
    counting"), every check passes."""
    assert not _misses(stack[0])


def test_every_tier_and_link_was_exercised(stack: tuple[list[Check], list[RunCapture]]) -> None:
    checks, _ = stack
    exact = {c.quantity for c in checks if c.run == "cache" and c.passed and c.truth > 0}
    assert {"hit tokens G1", "hit tokens G2", "hit tokens G4", "bytes G1->G2", "bytes G2->G1", "bytes G2->G4",
            "bytes G4->G1", "connector matched tokens (KVBM)", "KVBM disk pool placed in G4 (info metric)"} <= exact


def test_a_wrong_truth_fails(stack: tuple[list[Check], list[RunCapture]]) -> None:
    """The checks can fail: one block more in the truth's disk → G1 link is a miss."""
    run = next(r for r in stack[1] if r.label == "cache")
    link = dict(run.link_bytes)
    link["G4->G1"] += run.config.geometry.block_bytes(run.block_tokens)
    doctored = RunCapture(run.label, run.truths, link, run.resident, run.exposition, run.requests, run.settled,
                          run.settle_seconds, run.disk_device, run.block_tokens, run.config)
    assert [c.quantity for c in stack_checks(doctored) if not c.passed and c.quantity.startswith("bytes")] == [
        "bytes G4->G1"]


def test_kvbm_page_is_kvbm_0_9_0s(tmp_path: Path) -> None:
    """The reference's KVBM page: the 13 families of KVBM 0.9.0, counters without `_total`, no labels."""
    with running_engine(PLAN.base(tmp_path)) as engine:
        assert isinstance(engine, Engine) and engine.kvbm is not None
        server = KvbmServer(engine.kvbm)
        server.start()
        try:
            engine.generate(list(range(300)))
            engine.store.flush()
            engine.generate(list(range(300)))
            with urllib.request.urlopen(server.url, timeout=5) as response:
                text = response.read().decode()
        finally:
            server.stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert len(families) == 13 and all(name.startswith("kvbm_") for name in families)
    assert "_total" not in text
    assert all(not s.labels for f in families.values() for s in f.samples)
    values = {f.name: f.samples[0].value for f in families.values()}
    # 300 tokens in 64-token blocks: the second request hits the 4 full blocks, kept in G1
    assert values["kvbm_matched_tokens"] == 0 and values["kvbm_offload_blocks_d2h"] == 0
