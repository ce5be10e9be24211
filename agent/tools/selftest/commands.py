"""`kvscope selftest` and `kvscope demo`, added to the main parser by `add_commands`.

Heavy modules (numpy, zmq, the engine, matplotlib) are imported in the handlers, so `kvscope --help`
stays fast and works without the `reference` extra.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from kvscope.agent.runtime.os_signals import SignalWaiter


def _selftest(args: argparse.Namespace) -> int:
    from kvscope.agent.tools.selftest.report import summary, table, write_json
    from kvscope.agent.tools.selftest.runner import ScenarioUnavailable, run_plans, select

    logging.getLogger().setLevel(logging.WARNING)  # the table is the output; warnings still show
    try:
        rows, meta, _ = run_plans(select(args.scenario, args.stack), args.workdir)
    except ScenarioUnavailable as exc:
        print(f"kvscope: selftest: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(table(rows))
    sys.stdout.write(summary(rows))
    if args.json:
        write_json(args.json, rows, meta)
    return 0 if all(c.passed for _, c in rows) else 1


def _demo(args: argparse.Namespace) -> int:
    from kvscope.agent.tools.selftest.demo import run_demo
    from kvscope.agent.tools.selftest.plans import DemoPlan

    logging.getLogger().setLevel(logging.WARNING)
    plan = DemoPlan(lengths=tuple(int(n) for n in args.lengths.split(",")), requests=args.requests,
                    prompts=args.prompts, concurrency=args.concurrency, prompt_tokens=args.prompt_tokens,
                    block_tokens=args.block_tokens, time_scale=args.time_scale, model=args.model, seed=args.seed)
    signals = SignalWaiter((signal.SIGINT, signal.SIGTERM))
    result = run_demo(plan, args.out, lambda line: print(line, flush=True), args.keep_serving, signals.wait)
    return 0 if result.passed else 1


def add_commands(sub: Any) -> None:
    st = sub.add_parser("selftest", help="run the reference engine with the agent attached; compare with truth")
    st.add_argument("--scenario", choices=("shared-prompts", "ttft-sweep", "noisy-neighbour", "g1-eviction",
                                           "narrow-prompts", "what-if", "all"),
                    default="shared-prompts",
                    help="which scenario (default shared-prompts)")
    st.add_argument("--stack", choices=("vllm", "dynamo-kvbm"), default="vllm",
                    help="which engine stack the reference engine plays: vllm (its current dialect; --scenario "
                    "picks the run) or dynamo-kvbm (the seeds' vLLM 0.14.1 + Dynamo KVBM, disk pool as G4)")
    st.add_argument("--json", type=Path, help="also write the checks as JSON here")
    st.add_argument("--workdir", type=Path, help="keep the agent configs, per-request JSONL and G3/G4 files here "
                    "(default: a temporary directory, removed)")
    st.set_defaults(func=_selftest)
    demo = sub.add_parser("demo", help="the seeds' two experiments at laptop scale with the agent attached: TTFT "
                          "against prompt length (recompute vs G4 fetch) and shared-prompts throughput; a "
                          "Markdown + PNG report")
    demo.add_argument("--out", type=Path, default=Path("kvscope-demo"),
                      help="output directory (default ./kvscope-demo)")
    demo.add_argument("--keep-serving", action="store_true",
                      help="leave the shared-prompts cache run's engine and agent serving until Ctrl-C")
    demo.add_argument("--lengths", default="1024,2048,4096,8192,16384",
                      help="prompt lengths of the TTFT sweep (default 1024,...,16384)")
    demo.add_argument("--requests", type=int, default=32, help="shared prompts: requests (default 32)")
    demo.add_argument("--prompts", type=int, default=4, help="shared prompts: distinct prompts (default 4)")
    demo.add_argument("--concurrency", type=int, default=4, help="shared prompts: clients (default 4)")
    demo.add_argument("--prompt-tokens", type=int, default=4096, help="shared prompts: tokens each (default 4096)")
    demo.add_argument("--block-tokens", type=int, default=256)
    demo.add_argument("--time-scale", type=float, default=1.0, help="multiplies compute time (default 1)")
    demo.add_argument("--model", default="gpt-oss-120b", help="KV geometry preset (default gpt-oss-120b, "
                      "36,864 B/token; '' for a small 2 KiB/token geometry)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
