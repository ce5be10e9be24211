"""Golden end-to-end test of the host collectors: fixture kernel tree -> agent -> HTTP /metrics.

The agent is built by `agent.wiring.build_agent` with only the disk, network, rdma and process
collectors, `agent.proc_root`/`agent.sys_root` pointing at tests/fixtures/host/gpu-node, and the
exporter on an ephemeral port. One collection cycle runs (the interval is an hour, so exactly one),
then `/metrics` is fetched over real HTTP and compared, whole, with tests/fixtures/host/golden.prom.
Only what legitimately varies between runs is masked: the values of the agent's own
`process_*` gauges/counters, the collectors' durations, the store's series counts (they depend on
when the scrape lands among the collectors' health updates), and the version in build_info.

When a change to the output is intended, regenerate the file and review its diff:

    .venv/bin/python scripts/regen_golden.py
"""

from __future__ import annotations

import http.client
import re
import subprocess
import time
from pathlib import Path

from kvscope.agent.app.wiring import build_agent
from kvscope.agent.config.settings import load_config
from kvscope.agent.core.pipeline import Components
from kvscope.collectors.registry import collector_specs
from kvscope.exporters.registry import sink_specs
from testkit.environment import require_tool
from testkit.paths import FIXTURES

HOST = FIXTURES / "host"
GOLDEN = HOST / "golden.prom"
ROOT = HOST / "gpu-node"
HOST_COLLECTORS = ("disk", "network", "rdma", "process")
MASKED = "<masked>"
_VARYING = re.compile(r"^(process_\w+|kvscope_collector_duration_seconds|kvscope_store_series)((?:\{[^}]*\})?) \S+$",
                      re.M)
_VERSION = re.compile(r'(kvscope_build_info\{version=")[^"]*(")')


def host_components() -> Components:
    specs = collector_specs()
    return Components({name: specs[name] for name in HOST_COLLECTORS}, {}, sink_specs())


def scrape_fixture_agent(root: Path = ROOT, timeout: float = 20.0) -> str:
    """Run one cycle of the host collectors over `root` and return the /metrics body."""
    toml = (
        f"[agent]\nproc_root = '{root / 'proc'}'\nsys_root = '{root / 'sys'}'\ninterval = 3600.0\n"
        "[exporters.prometheus]\nlisten = '127.0.0.1:0'\n"
    )
    parts = host_components()
    agent = build_agent(load_config(toml, parts, environ={}), parts)
    assert agent.server is not None
    agent.start()
    try:
        deadline = time.monotonic() + timeout
        while any(agent.store.value("kvscope_collector_runs_total", (n,)) != 1.0 for n in HOST_COLLECTORS):
            if time.monotonic() > deadline:
                raise TimeoutError("the host collectors did not complete one cycle")
            time.sleep(0.01)
        conn = http.client.HTTPConnection("127.0.0.1", agent.server.port, timeout=10)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read().decode("utf-8")
        conn.close()
        assert response.status == 200, body
        return body
    finally:
        agent.stop()


def mask(exposition: str) -> str:
    return _VERSION.sub(rf"\g<1>{MASKED}\g<2>", _VARYING.sub(rf"\g<1>\g<2> {MASKED}", exposition))


def test_host_exposition_matches_golden() -> None:
    body = scrape_fixture_agent()
    assert mask(body) == GOLDEN.read_text(), "regenerate with scripts/regen_golden.py if the change is intended"


def test_masking_hides_only_varying_values() -> None:
    masked = mask(scrape_fixture_agent())
    masked_lines = [ln for ln in masked.splitlines() if MASKED in ln]
    assert sorted(ln.split("{")[0].split(" ")[0] for ln in masked_lines) == [
        "kvscope_build_info", *["kvscope_collector_duration_seconds"] * len(HOST_COLLECTORS),
        "kvscope_store_series", "kvscope_store_series",
        "process_cpu_seconds_total", "process_max_fds", "process_open_fds", "process_resident_memory_bytes",
        "process_start_time_seconds", "process_virtual_memory_bytes",
    ]


def test_promtool_finds_the_real_exposition_clean() -> None:
    promtool = require_tool("promtool")
    body = scrape_fixture_agent()
    proc = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), proc.stdout + proc.stderr
