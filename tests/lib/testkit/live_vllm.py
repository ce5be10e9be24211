"""What the e2e tests (e2e/) share about a live vLLM: scraping as Prometheus does, the seeded prompts, a
streaming client, and the check that kvscope's page equals the engine's."""

from __future__ import annotations

import json
import random
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Page = dict[tuple[str, tuple[tuple[str, str], ...]], float]
# G1 forced small: 2,048 tokens, so the shared prefixes and their continuations do not all stay. vLLM wants
# the max model length to fit in one block less than G1 ("estimated maximum model length is 2016").
SMALL_G1_BLOCKS = 64
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
                     "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;q=0.4,"
                     "text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


def scrape(url: str, kinds: tuple[str, ...] = ()) -> Page:
    """The page at `url`/metrics, read as Prometheus asks for it; `kinds`: only families of these types
    (counter, histogram, ...), without their _created samples."""
    request = urllib.request.Request(f"{url}/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text.replace("# EOF\n", "")):
        if kinds and family.type not in kinds:
            continue
        for s in family.samples:
            if not (kinds and s.name.endswith("_created")):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(page: Page, name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in page.items() if n == name and all((k, x) in lab for k, x in labels.items()))


def log_tail(live: Any, chars: int = 3000) -> str:
    """The end of the sidecar's log (e2e/conftest.py writes it into the launch's folder)."""
    log = live.folder / "kvscope.log"
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


def prompts(seed: int, count: int) -> list[str]:
    """Histories continued: each prompt extends one of a few shared prefixes, so prefix caching hits."""
    rng = random.Random(seed)
    stems = [" ".join(f"word{rng.randrange(2000)} alpha" for _ in range(150)) for _ in range(3)]
    return [rng.choice(stems) + " " + " ".join(f"word{rng.randrange(2000)}" for _ in range(rng.randrange(5, 60)))
            for _ in range(count)]


def stream(live: Any, prompt: str, full_report: bool = False) -> float:
    """One streaming completion, as a benchmark client sends it; returns the client's TTFT. `full_report`:
    ask vLLM to re-announce the cached blocks it reuses (kv_cache_report_mode=full)."""
    body: dict[str, Any] = {"model": live.model, "prompt": prompt, "max_tokens": 4, "stream": True,
                            "ignore_eos": True}
    if full_report:
        body["vllm_xargs"] = {"kv_cache_report_mode": "full"}
    return first_chunk_seconds(f"{live.engine_url}/v1/completions", body)


def first_chunk_seconds(url: str, body: dict[str, Any]) -> float:
    """POSTs a streaming OpenAI request and reads its whole answer; the seconds to its first data chunk."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    start = time.monotonic()
    first = None
    with urllib.request.urlopen(request, timeout=60) as response:
        for line in response:
            if first is None and line.startswith(b"data: {"):
                first = time.monotonic() - start
    assert first is not None
    return first


def settled(live: Any, name: str, engine_name: str) -> tuple[Page, Page]:
    """Both pages once the agent has caught up with the engine's counter (two scrape intervals at most)."""
    deadline = time.monotonic() + 15
    while True:
        engine, agent = scrape(live.engine_url), scrape(live.agent_url)
        if total(agent, name) == total(engine, engine_name) or time.monotonic() > deadline:
            return engine, agent
        time.sleep(0.5)


def check_counters(live: Any, seed: int, count: int) -> tuple[Page, Page]:
    """Drives `count` requests one at a time and holds kvscope's page to the engine's; returns both pages."""
    for prompt in prompts(seed=seed, count=count):
        stream(live, prompt)
    engine, agent = settled(live, "kvscope_ttft_seconds_count", "vllm:time_to_first_token_seconds_count")
    assert total(engine, "vllm:time_to_first_token_seconds_count") == count
    compare_counters(live, engine, agent)
    return engine, agent


def compare_counters(live: Any, engine: Page, agent: Page) -> None:
    """kvscope's page against the engine's, counter by counter, and its KV-event view of G1 against the
    engine's size: none lost, resident = stored − removed within num_gpu_blocks, used bytes from them."""
    pairs = [
        ("kvscope_kv_lookup_tokens_total", "vllm:prefix_cache_queries_total"),
        ("kvscope_prompt_tokens_total", "vllm:prompt_tokens_total"),
        ("kvscope_ttft_seconds_count", "vllm:time_to_first_token_seconds_count"),
        ("kvscope_ttft_seconds_sum", "vllm:time_to_first_token_seconds_sum"),
        ("kvscope_queue_time_seconds_count", "vllm:request_queue_time_seconds_count"),
        ("kvscope_queue_time_seconds_sum", "vllm:request_queue_time_seconds_sum"),
        ("kvscope_prefill_time_seconds_count", "vllm:request_prefill_time_seconds_count"),
        ("kvscope_prefill_time_seconds_sum", "vllm:request_prefill_time_seconds_sum"),
    ]
    for ours, theirs in pairs:
        assert total(agent, ours) == total(engine, theirs), (ours, total(agent, ours), theirs, total(engine, theirs))
    # computed (recomputed) prompt tokens: vLLM's local_compute source, and its per-request histogram's sum
    computed = total(engine, "vllm:prompt_tokens_by_source_total", source="local_compute")
    assert computed == total(engine, "vllm:request_prefill_kv_computed_tokens_sum") > 0
    assert total(agent, "kvscope_kv_computed_tokens_total") == computed
    assert total(engine, "vllm:prefix_cache_hits_total") > 0  # the prompts share prefixes
    assert total(agent, "kvscope_kv_hit_tokens_total", tier="G1") == total(engine, "vllm:prefix_cache_hits_total")
    # KV events: none lost, malformed or dropped; resident G1 blocks as stored − removed, used bytes from them
    for fault in ("missed", "malformed", "dropped"):
        assert total(agent, f"kvscope_kv_events_{fault}_total") == 0, fault
    resident = total(agent, "kvscope_kv_resident_blocks", tier="G1")
    stored = total(agent, "kvscope_kv_events_total", type="BlockStored")
    gpu_blocks = float(next(dict(lab)["num_gpu_blocks"] for (n, lab) in engine if n == "vllm:cache_config_info"))
    assert stored > 0, "no BlockStored event reached kvscope"
    removed = total(agent, "kvscope_kv_events_total", type="BlockRemoved")
    assert 0 < resident <= gpu_blocks, (
        f"G1 resident {resident} of {gpu_blocks} blocks (stored {stored}, removed {removed}, residency known "
        f"{total(agent, 'kvscope_kv_residency_known', tier='G1')}, replayed "
        f"{total(agent, 'kvscope_kv_events_replayed_total')}); the sidecar's log ends:\n{log_tail(live)}")
    became = total(agent, "kvscope_kv_blocks_stored_total", tier="G1")
    left = total(agent, "kvscope_kv_blocks_removed_total", tier="G1")
    assert resident == became - left and total(agent, "kvscope_kv_blocks_removed_unknown_total", tier="G1") == 0
    assert total(agent, "kvscope_tier_used_bytes", tier="G1") == resident * live.block_tokens * live.kv_bytes_per_token


def tokenizer_home(model: Path, home: Path, repo: str) -> Path:
    """An HF_HOME whose hub cache holds the model's tokenizer as repo `repo`: AIPerf then loads it offline
    (HF_HUB_OFFLINE=1) by name, the layout of shared/facts/clients.md §2, option B."""
    commit = "0" * 40
    cache = home / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = cache / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (cache / "refs").mkdir(exist_ok=True)
    (cache / "refs" / "main").write_text(commit)
    for item in model.iterdir():
        if item.suffix != ".safetensors":  # the tokenizer and config files, not the weights
            (snapshot / item.name).write_bytes(item.read_bytes())
    return home
