"""The whole agent on a real GPU: `kvscope run`'s wiring, scraped over HTTP, against a known load.

    PYTHONPATH=. python3 scripts/gpu_agent_check.py [--seconds 20]

Builds the agent exactly as `kvscope run` does on the embedded defaults (every default collector,
the NVML one included), serves /metrics on a loopback port, runs a GPU load of known duty cycle
with host<->device copies (scripts/gpu_check.run_load), scrapes /metrics over HTTP before and after,
and prints busy/idle seconds against the ON/OFF time, PCIe bytes against the bytes copied, memory and
collector health. Exits 1 on gross disagreement, 2 when there is no GPU or torch.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

from gpu_check import run_load  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from kvscope.agent.app.wiring import build_agent, components  # noqa: E402
from kvscope.agent.config.settings import load_config  # noqa: E402


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def gpu_value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, gpu: str = "0") -> float:
    return next((v for (n, labels), v in samples.items() if n == name and ("gpu", gpu) in labels), float("nan"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("no torch here: cannot make a GPU load")
        return 2
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    config = load_config("[exporters.prometheus]\nlisten = '127.0.0.1:0'\n", components(), environ={})
    agent = build_agent(config)
    agent.start()
    assert agent.server is not None
    time.sleep(2.5)  # first collections, PCIe poll thread warm
    before = scrape(agent.server.port)
    load = run_load(torch, torch.device("cuda:0"), args.seconds, 1.0, 1.0, 256, time.time() + args.seconds + 5)
    time.sleep(2.5)  # the driver's last samples reach the collector
    after = scrape(agent.server.port)
    agent.stop()

    def d(name: str) -> float:
        return gpu_value(after, name) - gpu_value(before, name)

    on = sum(b - a for a, b in load.on)
    off = sum(b - a for a, b in load.off)
    busy, idle = d("kvscope_gpu_busy_seconds_total"), d("kvscope_gpu_idle_seconds_total")
    rx, tx = d("kvscope_gpu_pcie_receive_bytes_total"), d("kvscope_gpu_pcie_transmit_bytes_total")
    up = {dict(labels)["collector"]: v for (n, labels), v in after.items() if n == "kvscope_collector_up"}
    print(f"collectors up: {up}")
    print(f"load: ON {on:.2f} s, OFF {off:.2f} s (+ ~5 s idle around it); copied {load.h2d_bytes / 2**30:.1f} GiB "
          f"each way")
    print(f"agent: busy {busy:.2f} s, idle {idle:.2f} s (busy/ON = {busy / on:.3f})")
    print(f"agent: PCIe rx {rx / 2**30:.1f} GiB ({rx / load.h2d_bytes:.3f} x copied), "
          f"tx {tx / 2**30:.1f} GiB ({tx / load.d2h_bytes:.3f} x copied)")
    print(f"memory used {gpu_value(after, 'kvscope_gpu_memory_used_bytes') / 2**30:.2f} GiB of "
          f"{gpu_value(after, 'kvscope_gpu_memory_total_bytes') / 2**30:.1f} GiB")
    ok = (all(v == 1.0 for v in up.values()) and 0.85 <= busy / on <= 1.15
          and 0.9 <= rx / load.h2d_bytes <= 1.5 and idle > 0.5 * off)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
