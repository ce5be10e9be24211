"""`kvscope reference serve`: the agent configuration it prints or writes, and its recompute-baseline switch."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kvscope.agent.app.wiring import components
from kvscope.agent.config.settings import load_config
from kvscope.agent.tools.reference.agent_config import WatchedEngine, agent_config

SMALL = ["--layers", "4", "--kv-heads", "2", "--head-dim", "64", "--block-tokens", "16", "--g1", "1MiB",
         "--g4", "4MiB"]


def test_the_printed_configuration_is_one_the_agent_loads() -> None:
    watched = WatchedEngine("http://127.0.0.1:8000/metrics", "openai/gpt-oss-120b", 36_864, "tcp://127.0.0.1:5557",
                            "tcp://127.0.0.1:5558", "http://127.0.0.1:4318", "vda")
    config = load_config(agent_config(watched), components(), environ={})
    settings, vllm = config.collectors["vllm"]
    assert settings.enabled and vllm.urls == ["http://127.0.0.1:8000/metrics"]
    assert vllm.engine == "reference" and vllm.cache_hit_source_tiers["external_unspecified"] == "G4"
    settings, events = config.collectors["vllm_kv_events"]
    assert settings.enabled and events.kv_bytes_per_token == 36_864
    assert events.replay_endpoint == "tcp://127.0.0.1:5558"
    settings, otlp = config.collectors["otlp_traces"]
    assert settings.enabled and otlp.listen == "127.0.0.1:4318"  # where the engine sends its spans
    assert config.collectors["disk"][1].include == ["vda"]
    # the what-if analysis gets the sizes vLLM's /metrics does not give (G3, G4) and writes its recording
    whatif = load_config(agent_config(WatchedEngine("http://h:1/metrics", "m", 2048, "tcp://h:2", None, None, None,
                                                    {"G3": 0, "G4": 1 << 30}, True)), components(), environ={})
    assert whatif.analyses["whatif"][1].tier_sizes == {"G3": "0B", "G4": f"{1 << 30}B"}
    assert whatif.analyses["whatif"][1].recording == "kvscope_whatif.json"
    # without a span endpoint there is no receiver to configure, and no KV events section without events
    bare = load_config(agent_config(WatchedEngine("http://h:1/metrics", "m", 2048)), components(), environ={})
    assert not bare.collectors["otlp_traces"][0].enabled and not bare.collectors["vllm_kv_events"][0].enabled


def _serve(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], Path]:
    config = tmp_path / "kvscope.toml"
    proc = subprocess.Popen([sys.executable, "-m", "kvscope.agent.app.cli", "reference", "serve", "--port", "0",
                             "--kv-events", "tcp://127.0.0.1:0", "--kv-events-replay", "tcp://127.0.0.1:0",
                             "--data-dir", str(tmp_path / "data"), "--agent-config", str(config), *SMALL, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not config.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"serve did not write its agent configuration: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)
    return proc, config


@pytest.mark.integration
@pytest.mark.parametrize("recompute", [False, True])
def test_serve_writes_the_agent_configuration_that_watches_it(tmp_path: Path, recompute: bool) -> None:
    proc, path = _serve(tmp_path, *(["--recompute"] if recompute else []))
    try:
        config = load_config(path.read_text(), components(), environ={})
        (url,) = config.collectors["vllm"][1].urls
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10) as response:
            page = response.read().decode()
        # the URL in the configuration is this engine's /metrics; --recompute turns its cache off
        info = next(line for line in page.splitlines() if line.startswith("vllm:cache_config_info{"))
        assert f'enable_prefix_caching="{not recompute}"' in info
        assert config.collectors["vllm_kv_events"][1].kv_bytes_per_token == 2048
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
