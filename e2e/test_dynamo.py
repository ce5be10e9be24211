"""kvscope beside a live NVIDIA Dynamo 1.6.1 (a frontend with the KV router and two mocker workers, on CPU; the
stack in tests/lib/testkit/live_dynamo.py): once configured, once by autodetection. Every check holds kvscope's
figure to the figure Dynamo itself serves at the same moment."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvscope.agent.analyses.whatif.commands import fetch
from kvscope.agent.analyses.whatif.profile import loads
from testkit.live_dynamo import (
    BLOCK_TOKENS,
    G1_BLOCKS,
    KV_BYTES_PER_TOKEN,
    WORKERS,
    Sidecar,
    Stack,
    chat,
    dynamo,
    kvscope,
)
from testkit.live_vllm import Page, prompts, scrape, total

REQUESTS = 24
HOST_OFF = "".join(f"[collectors.{name}]\nenabled = false\n" for name in
                   ("disk", "network", "rdma", "nfs", "lustre", "nvml"))


PRELUDE = """[agent]
proc_root = "/proc"
sys_root = "/sys"
[exporters.prometheus]
listen = "{listen}"
"""


def pages(stack: Stack) -> str:
    """The frontend's and the workers' /metrics, as a TOML list's items."""
    return ", ".join(f'"{u}/metrics"' for u in (stack.frontend_url, *stack.worker_urls))


def configured(stack: Stack, replay: bool = False) -> str:
    """The sidecar of a Dynamo pod, configured: the frontend's and workers' pages, worker 0's vLLM-named lines
    (one worker per pod, as a sidecar sees it), both workers' KV events as ranks 0 and 1 (`replay`: with their
    replay endpoints)."""
    replay_line = f'replay_endpoint = "tcp://127.0.0.1:{stack.replay_port}"' if replay else ""
    return f"""{PRELUDE}
[collectors.dynamo]
enabled = true
urls = [{pages(stack)}]
[collectors.vllm]
enabled = true
urls = ["{stack.worker_urls[0]}/metrics"]
[collectors.vllm_kv_events]
enabled = true
engine = "dynamo"
endpoint = "tcp://127.0.0.1:{stack.kv_events_port}"
data_parallel_size = {WORKERS}
{replay_line}
model = "{stack.model}"
default_medium = "GPU"
kv_bytes_per_token = {KV_BYTES_PER_TOKEN}
reuse_sample_rate = 1.0
[analyses.whatif]
tier_sizes = {{ G1 = "{G1_BLOCKS} blocks" }}  # each worker's; the frontend states it for one (rank 0's)
{HOST_OFF}"""


def autodetected(stack: Stack) -> str:
    """No engine adapter configured: autodetection over the stack's pages (a pod's default ports would be
    8000 and 8081), probing again every 2 s while a worker's page has no vLLM-named lines (they appear with its
    first request)."""
    return f"""{PRELUDE}
[collectors.engine_discovery]
candidates = [{pages(stack)}]
awaiting_engine_reprobe_seconds = 2.0
kv_bytes_per_token = {KV_BYTES_PER_TOKEN}
{HOST_OFF}"""


@pytest.fixture(scope="module")
def stack(dynamo_venv: Path, dynamo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with dynamo(dynamo_venv, dynamo_model, tmp_path_factory.mktemp("dynamo")) as running:
        yield running


@pytest.fixture(scope="module")
def sidecar(stack: Stack) -> Iterator[Sidecar]:
    """The configured sidecar, started before any request (it sees every KV event from seq 0); the workload
    driven once for all tests of this module."""
    with kvscope(configured(stack), stack.folder, "kvscope-configured") as running:
        for prompt in prompts(seed=5, count=REQUESTS):
            chat(stack, prompt)
        yield running


def settled(agent_url: str, stack: Stack, ready: Callable[[Page, Page], bool]) -> tuple[Page, Page]:
    """The frontend's page and kvscope's once `ready(frontend, agent)` (two scrape intervals at most)."""
    deadline = time.monotonic() + 20
    while True:
        frontend, agent = scrape(stack.frontend_url), scrape(agent_url)
        if ready(frontend, agent) or time.monotonic() > deadline:
            return frontend, agent
        time.sleep(0.5)


def same_ttft_count(frontend: Page, agent: Page) -> bool:
    return total(agent, "kvscope_ttft_seconds_count", engine="dynamo") == total(
        frontend, "dynamo_frontend_time_to_first_token_seconds_count")


def check_pairs(frontend: Page, agent: Page) -> None:
    """kvscope's engine="dynamo" figures against the frontend's own page. Counts exactly; the TTFT sum to 1e-12:
    kvscope totals a counter from its increments, and the frontend prints its own float (0.5280910230000001
    against 0.528091023 in one run)."""
    pairs = [
        ("kvscope_ttft_seconds_count", "dynamo_frontend_time_to_first_token_seconds_count"),
        ("kvscope_prompt_tokens_total", "dynamo_frontend_input_sequence_tokens_sum"),
        ("kvscope_kv_cached_tokens_total", "dynamo_frontend_cached_tokens_sum"),
    ]
    for ours, theirs in pairs:
        assert total(agent, ours, engine="dynamo") == total(frontend, theirs), (ours, theirs)
    ttft = total(frontend, "dynamo_frontend_time_to_first_token_seconds_sum")
    assert math.isclose(total(agent, "kvscope_ttft_seconds_sum", engine="dynamo"), ttft, rel_tol=1e-12), ttft
    assert total(agent, "kvscope_requests_finished_total", engine="dynamo", reason="success") == total(
        frontend, "dynamo_frontend_requests_total", status="success")


def check_frontend(frontend: Page, agent: Page) -> None:
    check_pairs(frontend, agent)
    # every request sent was counted, and its TTFT too (chat completions: see live_dynamo.chat)
    assert total(frontend, "dynamo_frontend_requests_total", status="success") == REQUESTS
    assert total(frontend, "dynamo_frontend_time_to_first_token_seconds_count") == REQUESTS
    # the router's predicted overlap, as the frontend counts it, is its router's selected cached prefix tokens
    assert total(frontend, "dynamo_frontend_cached_tokens_sum") == total(
        frontend, "dynamo_component_router_kv_selected_cached_prefix_tokens_total") > 0


def test_frontend_figures_equal_the_frontends_own(stack: Stack, sidecar: Sidecar) -> None:
    check_frontend(*settled(sidecar.url, stack, same_ttft_count))


def test_worker_and_router_kv_figures_read_as_what_they_are(stack: Stack, sidecar: Sidecar) -> None:
    frontend, agent = settled(sidecar.url, stack, same_ttft_count)
    # G1's size: the frontend's total blocks × block size are one worker's (each has 64 blocks of 32)
    blocks = total(frontend, "dynamo_frontend_model_total_kv_blocks")
    size = total(frontend, "dynamo_frontend_model_kv_cache_block_size")
    assert (blocks, size) == (G1_BLOCKS, BLOCK_TOKENS)
    assert total(agent, "kvscope_tier_capacity_tokens", engine="dynamo", tier="G1") == blocks * size
    # Dynamo 1.6.1's workers serve no dynamo_component_*cache_usage*: their KV usage is the mocker's
    # vLLM-named line, the vLLM adapter's (worker 0's page)
    worker = scrape(stack.worker_urls[0])
    assert not [n for n, _ in worker if "cache_usage" in n and n.startswith("dynamo_")]
    assert total(agent, "kvscope_kv_cache_usage_ratio", engine="vllm") == total(worker, "vllm:kv_cache_usage_perc")
    assert not [n for n, lab in agent if n == "kvscope_kv_cache_usage_ratio" and ("engine", "dynamo") in lab]
    # the router predicted no G1 hits of its own (frontend_kv_hit_rate is not served): nothing is made up
    assert "dynamo_frontend_kv_hit_rate" not in {n for n, _ in frontend}
    assert not [n for n, lab in agent if n == "kvscope_engine_hit_ratio" and ("engine", "dynamo") in lab]


def test_kv_events_feed_residency_and_the_what_if(stack: Stack, sidecar: Sidecar) -> None:
    workers = [scrape(url) for url in stack.worker_urls]

    def caught_up(_: Page, agent: Page) -> bool:
        return all(total(agent, "kvscope_kv_events_total", dp_rank=str(r), type="BlockStored") == total(
            w, "dynamo_component_kv_publisher_zmq_events_total", event_type="stored", stage="accepted")
            for r, w in enumerate(workers))

    _, agent = settled(sidecar.url, stack, caught_up)
    for rank, worker in enumerate(workers):
        r = str(rank)
        for kind, theirs in (("BlockStored", "stored"), ("BlockRemoved", "removed")):
            theirs_total = total(worker, "dynamo_component_kv_publisher_zmq_events_total", event_type=theirs,
                                 stage="accepted")
            assert total(agent, "kvscope_kv_events_total", dp_rank=r, type=kind) == theirs_total, (r, kind)
        for fault in ("missed", "malformed", "dropped"):
            assert total(agent, f"kvscope_kv_events_{fault}_total", dp_rank=r) == 0, (r, fault)
        resident = total(agent, "kvscope_kv_resident_blocks", dp_rank=r, tier="G1")
        stored = total(agent, "kvscope_kv_blocks_stored_total", dp_rank=r, tier="G1")
        removed = total(agent, "kvscope_kv_blocks_removed_total", dp_rank=r, tier="G1")
        assert 0 <= resident == stored - removed <= G1_BLOCKS, (r, resident, stored, removed)
        assert total(agent, "kvscope_kv_blocks_removed_unknown_total", dp_rank=r, tier="G1") == 0
        assert total(agent, "kvscope_tier_used_bytes", dp_rank=r, tier="G1") == (
            resident * BLOCK_TOKENS * KV_BYTES_PER_TOKEN)
        assert total(agent, "kvscope_kv_resident_blocks", dp_rank=r, tier="unattributed") == 0
    # the what-if analysis: a profile per worker, its trace the G1 blocks the worker stored (sampled at rate 1)
    # and today's G1 the worker's. Its shares stay NaN: they are of looked-up tokens, and Dynamo 1.6.1's pages
    # count no lookups (no prefix_cache_queries; the frontend's input tokens are not a lookup count)
    # (a worker the router sent nothing has stored nothing: it has no profile)
    stored_by = {str(r): total(agent, "kvscope_kv_blocks_stored_total", dp_rank=str(r), tier="G1")
                 for r in range(WORKERS)}
    assert sum(stored_by.values()) > 0
    profiles = sorted(loads(fetch(sidecar.url)), key=lambda p: p.dp_rank)
    assert [p.dp_rank for p in profiles] == [r for r, n in stored_by.items() if n > 0]
    for profile in profiles:
        stored = total(agent, "kvscope_kv_blocks_stored_total", dp_rank=profile.dp_rank, tier="G1")
        print(f"what-if worker {profile.dp_rank}: {len(profile.trace)} G1 accesses, {profile.distinct_sampled} "
              f"distinct blocks, {stored:.0f} blocks stored")
        assert profile.sample_rate == 1.0 and profile.today[0] == G1_BLOCKS
        assert profile.block_tokens == BLOCK_TOKENS and profile.bytes_per_token == KV_BYTES_PER_TOKEN
        assert len(profile.trace) >= stored > 0


def test_autodetection_finds_the_frontend_and_workers_by_their_names(stack: Stack, sidecar: Sidecar) -> None:
    urls = [f"{u}/metrics" for u in stack.worker_urls]
    # a worker's page serves the mocker's vLLM-named lines only once it has served a request
    served = [u for u, w in zip(urls, stack.worker_urls, strict=True) if any(
        n.startswith("vllm:") for n, _ in scrape(w))]
    assert served
    with kvscope(autodetected(stack), stack.folder, "kvscope-autodetected") as auto:
        def found(_: Page, agent: Page) -> bool:
            return total(agent, "kvscope_engine_discovered_info", engine="vllm") == len(served)

        frontend, agent = settled(auto.url, stack, found)
        discovered = {(dict(lab)["engine"], dict(lab)["url"]) for n, lab in agent
                      if n == "kvscope_engine_discovered_info"}
        assert discovered == {("dynamo", f"{stack.frontend_url}/metrics"), *(("dynamo", u) for u in urls),
                              *(("vllm", u) for u in served)}, discovered
        for prompt in prompts(seed=6, count=4):
            chat(stack, prompt)
        frontend, agent = settled(auto.url, stack, same_ttft_count)
        check_pairs(frontend, agent)
        assert total(frontend, "dynamo_frontend_requests_total", status="success") == REQUESTS + 4
        # a worker that served its first request since: found as vLLM by the probe soon after
        now_served = [u for u, w in zip(urls, stack.worker_urls, strict=True) if any(
            n.startswith("vllm:") for n, _ in scrape(w))]
        _, agent = settled(auto.url, stack, lambda _, agent: total(
            agent, "kvscope_engine_discovered_info", engine="vllm") == len(now_served))
        assert {dict(lab)["url"] for n, lab in agent if n == "kvscope_engine_discovered_info"
                and ("engine", "vllm") in lab} == set(now_served)


def test_a_sidecar_started_late_replays_the_workers_events_from_seq_0(stack: Stack, sidecar: Sidecar) -> None:
    """The workers' replay ROUTERs (--zmq-replay-ports) answer kvscope's replay requests in vLLM's protocol: a
    sidecar started after the workload recovers, for each worker that publishes a batch after it subscribed
    (what shows it how far behind it is), every event that worker published before."""
    def stored(page: Page) -> float:
        return total(page, "dynamo_component_kv_publisher_zmq_events_total", event_type="stored", stage="accepted")

    before = [stored(scrape(url)) for url in stack.worker_urls]
    with kvscope(configured(stack, replay=True), stack.folder, "kvscope-late") as late:
        for prompt in prompts(seed=7, count=4):
            chat(stack, prompt)
        workers = [scrape(url) for url in stack.worker_urls]
        ranks = [str(r) for r, w in enumerate(workers) if stored(w) > before[r] > 0]
        assert ranks, (before, [stored(w) for w in workers])
        _, agent = settled(late.url, stack, lambda _, agent: all(total(
            agent, "kvscope_kv_events_total", dp_rank=r, type="BlockStored") == stored(workers[int(r)])
            for r in ranks))
        for r in ranks:
            for kind, theirs in (("BlockStored", "stored"), ("BlockRemoved", "removed")):
                counted = total(workers[int(r)], "dynamo_component_kv_publisher_zmq_events_total",
                                event_type=theirs, stage="accepted")
                assert total(agent, "kvscope_kv_events_total", dp_rank=r, type=kind) == counted, (r, kind)
            assert total(agent, "kvscope_kv_events_missed_total", dp_rank=r) == 0, r
            assert total(agent, "kvscope_kv_events_replayed_total", dp_rank=r) > 0, r
