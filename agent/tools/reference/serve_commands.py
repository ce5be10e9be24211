"""`kvscope reference serve` and `kvscope reference scenario ttft-sweep|shared-prompts`."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvscope.agent.runtime.os_signals import SignalWaiter
from kvscope.agent.tools.reference.geometry import parse_size

log = logging.getLogger("kvscope.reference")


def _engine_args(p: argparse.ArgumentParser, g1: str, g4: str) -> None:
    from kvscope.agent.tools.reference.commands import add_geometry_args

    add_geometry_args(p)
    t = p.add_argument_group("tiers (capacities like 2GiB; 0 turns a tier off)")
    t.add_argument("--block-tokens", type=int, default=256, help="tokens per block (default 256)")
    t.add_argument("--g1", default=g1, help=f"G1 capacity (default {g1}); also caps the prompt length"
                   + ("; 0: just enough for the longest prompt" if g1 == "0" else ""))
    t.add_argument("--g2", default="0", help="G2 capacity (default 0: staging only)")
    t.add_argument("--g3", default="0", help="G3 capacity (default 0: off)")
    t.add_argument("--g4", default=g4, help=f"G4 capacity (default {g4}"
                   + (": enough for every prompt)" if g4 == "0" else ")"))
    t.add_argument("--g1-retain", action=argparse.BooleanOptionalAction, default=False,
                   help="G1 keeps blocks between requests (default: no, as in the seeds' G4 test)")
    t.add_argument("--data-dir", type=Path, help="where G3/G4 live (default: a temporary directory)")
    t.add_argument("--g3-path", type=Path, help="G3 directory (default DATA_DIR/g3)")
    t.add_argument("--g4-path", type=Path, help="G4 directory, e.g. on a shared mount (default DATA_DIR/g4)")
    t.add_argument("--direct-io", action="store_true", help="O_DIRECT block-file I/O (where the FS allows it)")
    t.add_argument("--time-scale", type=float, default=1.0, help="multiplies compute time (default 1)")


def _config(args: argparse.Namespace, data_dir: Path, **extra: Any) -> Any:
    from kvscope.agent.tools.reference.commands import geometry_from_args
    from kvscope.agent.tools.reference.engine import EngineConfig

    geo = geometry_from_args(args)
    block_bytes = geo.block_bytes(args.block_tokens)

    def blocks(size: str) -> int:
        return parse_size(size) // block_bytes

    return EngineConfig(data_dir=data_dir, geometry=geo, block_tokens=args.block_tokens,
                        g1_blocks=max(1, blocks(args.g1)), g1_retain=args.g1_retain, g2_blocks=blocks(args.g2),
                        g3_blocks=blocks(args.g3), g4_blocks=blocks(args.g4), g3_path=args.g3_path,
                        g4_path=args.g4_path, direct_io=args.direct_io, time_scale=args.time_scale, **extra)


def _serve(args: argparse.Namespace) -> int:
    from kvscope.agent.tools.reference.engine import Engine
    from kvscope.agent.tools.reference.openai_server import ReferenceServer
    from kvscope.agent.tools.reference.scenarios import data_dir, recompute_config

    with data_dir(args.data_dir) as d:
        config = _config(args, d, served_model_name=args.served_model_name, truth_path=args.truth,
                         kv_events_endpoint=args.kv_events or None,
                         kv_events_replay_endpoint=args.kv_events_replay or None,
                         otlp_traces_endpoint=args.otlp_traces_endpoint, default_max_tokens=args.max_tokens,
                         kv_cache_report_full=args.kv_cache_report_mode == "full")
        if args.recompute:
            config = recompute_config(config)
        engine = Engine(config)
        server = ReferenceServer(engine, args.host, args.port)
        signals = SignalWaiter((signal.SIGTERM, signal.SIGINT))
        engine.start()
        server.start()
        pub = engine.publisher
        log.info("reference engine on %s (/v1, /metrics); KV events %s, replay %s; G4 in %s; max prompt %d tokens%s",
                 server.url, pub.endpoint if pub else "off", pub.replay_endpoint if pub else "off",
                 config.g4_path or d / "g4", engine.max_prompt_tokens,
                 " (recompute baseline: no prefix caching, no tier keeps anything)" if args.recompute else "")
        _announce_agent_config(args, engine, server.url, d)
        signals.wait()
        server.stop()
        engine.stop()
    return 0


def _announce_agent_config(args: argparse.Namespace, engine: Any, url: str, d: Path) -> None:
    """Prints the agent configuration that watches this engine, or writes it where --agent-config says."""
    from kvscope.agent.tools.reference.agent_config import WatchedEngine, agent_config
    from kvscope.collectors.host.inputs import block_device_of

    pub = engine.publisher
    g4 = engine.config.g4_path or d / "g4"
    watched = WatchedEngine(f"{url}/metrics", engine.config.served_model_name,
                            engine.config.geometry.bytes_per_token, pub.endpoint if pub else None,
                            pub.replay_endpoint if pub else None, args.otlp_traces_endpoint,
                            block_device_of(g4) if g4.exists() else None,
                            {t: blocks * engine.block_bytes for t, blocks in (("G3", engine.config.g3_blocks),
                                                                              ("G4", engine.config.g4_blocks))},
                            engine.config.kv_cache_report_full)
    text = agent_config(watched)
    if args.agent_config is None:
        print("# the agent configuration that watches this engine (save it, then: kvscope run --config FILE)")
        print(text, flush=True)
    else:
        args.agent_config.write_text(text, encoding="utf-8")
        log.info("agent configuration written to %s (kvscope run --config %s)", args.agent_config, args.agent_config)


def _scenario_base(args: argparse.Namespace, d: Path) -> Any:
    return _config(args, d, kv_events_endpoint=None, kv_events_replay_endpoint=None, default_max_tokens=4)


def _ttft_sweep(args: argparse.Namespace) -> int:
    from kvscope.agent.tools.reference.scenarios import data_dir, format_sweep, ttft_sweep

    lengths = [int(x) for x in args.lengths.split(",")]
    with data_dir(args.data_dir) as d:
        rows = ttft_sweep(_scenario_base(args, d), lengths, args.seed)
    sys.stdout.write(format_sweep(rows))
    if args.json:
        args.json.write_text(json.dumps([{"prompt_tokens": r.prompt_tokens, "cold": asdict(r.cold),
                                          "warm": asdict(r.warm)} for r in rows], indent=1))
    return 0


def _shared_prompts(args: argparse.Namespace) -> int:
    from kvscope.agent.tools.reference.scenarios import data_dir, format_load, shared_prompts

    with data_dir(args.data_dir) as d:
        cache, recompute = shared_prompts(_scenario_base(args, d), args.requests, args.prompts, args.concurrency,
                                          args.prompt_tokens, args.seed)
    sys.stdout.write(format_load(cache, recompute))
    if args.json:
        args.json.write_text(json.dumps({r.label: {"requests": r.requests, "seconds": r.seconds, "rps": r.rps,
                                                   "truth": [asdict(t) for t in r.truths]}
                                         for r in (cache, recompute)}, indent=1))
    return 0


def _noisy_neighbour(args: argparse.Namespace) -> int:
    from kvscope.agent.tools.reference.noise import NoiseSpec
    from kvscope.agent.tools.reference.noisy_neighbour import format_noisy, run_noisy_neighbour
    from kvscope.agent.tools.reference.scenarios import data_dir

    spec = NoiseSpec(threads=args.noise_threads, mode=args.noise_mode, io_bytes=parse_size(args.noise_io),
                     file_bytes=parse_size(args.noise_file), bytes_per_second=parse_size(args.noise_rate))
    with data_dir(args.data_dir) as d:
        result = run_noisy_neighbour(_scenario_base(args, d), args.requests, args.prompts, args.concurrency,
                                     args.prompt_tokens, spec, args.seed)
    sys.stdout.write(format_noisy(result))
    return 0


def add_reference_commands(sub: Any) -> None:
    ref = sub.add_parser("reference", help="the reference tier pipeline (engine, scenarios)")
    ref_sub = ref.add_subparsers(dest="reference_command", required=True)
    serve = ref_sub.add_parser("serve", help="run the engine: OpenAI API + /metrics, KV events, truth")
    _engine_args(serve, g1="2GiB", g4="20GiB")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", default="openai/gpt-oss-120b")
    serve.add_argument("--max-tokens", type=int, default=16, help="output tokens when a request gives none")
    serve.add_argument("--truth", type=Path, help="append ground truth (JSON Lines) to this file")
    serve.add_argument("--kv-events", default="tcp://127.0.0.1:5557", help="PUB endpoint ('' = off)")
    serve.add_argument("--kv-events-replay", default="tcp://127.0.0.1:5558", help="replay ROUTER ('' = off)")
    serve.add_argument("--otlp-traces-endpoint", help="OTLP/HTTP collector, e.g. http://127.0.0.1:4318")
    serve.add_argument("--kv-cache-report-mode", choices=("default", "full"), default="default",
                       help="full: announce every block a request reuses from G1 in the KV events, as vLLM does for "
                       "a request with kv_cache_report_mode=full (the what-if analysis needs it)")
    serve.add_argument("--recompute", action="store_true",
                       help="a recompute baseline: no prefix caching, no tier keeps anything (every prompt computed)")
    serve.add_argument("--agent-config", type=Path, metavar="FILE",
                       help="write the agent configuration that watches this engine here (default: print it)")
    serve.set_defaults(func=_serve)
    scen = ref_sub.add_parser("scenario", help="the seeds' experiments at laptop scale")
    scen_sub = scen.add_subparsers(dest="scenario", required=True)
    sweep = scen_sub.add_parser("ttft-sweep", help="TTFT cold vs warm across prompt lengths")
    _engine_args(sweep, g1="0", g4="0")
    sweep.add_argument("--lengths", default="1024,2048,4096,8192,16384", help="prompt lengths in tokens")
    sweep.add_argument("--seed", type=int, default=0)
    sweep.add_argument("--json", type=Path, help="write the rows with their truth records here")
    sweep.set_defaults(func=_ttft_sweep)
    shared = scen_sub.add_parser("shared-prompts", help="N requests from M prompts at concurrency C")
    _engine_args(shared, g1="0", g4="0")
    shared.add_argument("--requests", type=int, default=40)
    shared.add_argument("--prompts", type=int, default=20)
    shared.add_argument("--concurrency", type=int, default=4)
    shared.add_argument("--prompt-tokens", type=int, default=4096)
    shared.add_argument("--seed", type=int, default=0)
    shared.add_argument("--json", type=Path, help="write both runs with their truth records here")
    shared.set_defaults(func=_shared_prompts)
    noisy = scen_sub.add_parser("noisy-neighbour", help="shared prompts quiet, then with competing I/O on G4's "
                                "device, the agent attached (docs/analyze.md)")
    _engine_args(noisy, g1="0", g4="0")
    noisy.add_argument("--requests", type=int, default=24)
    noisy.add_argument("--prompts", type=int, default=6)
    noisy.add_argument("--concurrency", type=int, default=2)
    noisy.add_argument("--prompt-tokens", type=int, default=2048)
    noisy.add_argument("--seed", type=int, default=0)
    noisy.add_argument("--noise-threads", type=int, default=4, help="competing I/O streams (default 4)")
    noisy.add_argument("--noise-mode", choices=("read", "write", "mixed"), default="read")
    noisy.add_argument("--noise-io", default="4MiB", help="bytes per competing I/O (default 4MiB)")
    noisy.add_argument("--noise-file", default="512MiB", help="size of the competing file beside G4")
    noisy.add_argument("--noise-rate", default="0", help="cap on the competing traffic per second (0: none)")
    noisy.set_defaults(func=_noisy_neighbour)
