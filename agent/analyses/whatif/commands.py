"""`kvscope what-if`: what other tier sizes would serve, and what TTFT they would give.

    kvscope what-if --url http://127.0.0.1:9474 --g1 2x --g2 64GiB --g3 0 [--chart whatif.png] [--json F]
    kvscope what-if --recording /var/lib/kvscope/whatif.json --scenario big-g4:G4=1PB

It reads the what-if profile of a running agent (GET /whatif/profile on its /metrics port) or one the
agent wrote (`[analyses.whatif] recording`), replays its sampled access trace at today's sizes and at the
asked ones (predict.py), and prints a table, then the marginal value of each tier's size (marginal.py: the
GPU-seconds its next step, 2x, would save and its last step, today's against half, saves, per request and
per hour at the requests' rate); `--chart` also sweeps one tier through sizes. Charts need
the `reference` extra (matplotlib).
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import sys
import urllib.parse
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvscope.agent.analyses.whatif import report
from kvscope.agent.analyses.whatif.hierarchy import TIERS
from kvscope.agent.analyses.whatif.marginal import marginal_text, marginals
from kvscope.agent.analyses.whatif.predict import Prediction, replay
from kvscope.agent.analyses.whatif.profile import StreamProfile, dumps, loads
from kvscope.agent.analyses.whatif.sizes import Scenario, Size, scenario
from kvscope.agent.config import extras

PROFILE_PATH = "/whatif/profile"


def fetch(url: str, timeout: float = 30.0) -> bytes:
    """The profile of a running agent; `url` is its address, with or without /metrics, and with user:password@
    when its web config asks for basic auth."""
    base = url.rstrip("/").removesuffix("/metrics").removesuffix(PROFILE_PATH)
    if "://" not in base:
        base = "http://" + base
    parts = urllib.parse.urlsplit(base)
    headers = {"Accept-Encoding": "gzip"}
    if parts.username is not None:
        credentials = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
        base = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(base + PROFILE_PATH, headers=headers)
    with opener.open(request, timeout=timeout) as response:
        body = bytes(response.read())
        return gzip.decompress(body) if response.headers.get("Content-Encoding") == "gzip" else body


def asked_scenarios(args: argparse.Namespace) -> list[Scenario]:
    out = []
    sizes = {t: getattr(args, t.lower()) for t in TIERS if getattr(args, t.lower()) is not None}
    if sizes:
        out.append(scenario(",".join(f"{t}={v}" for t, v in sizes.items()), sizes))
    for text in args.scenario:
        name, sep, body = text.partition(":")
        if not sep or not name or not body:
            raise ValueError(f"--scenario {text!r}: expected NAME:TIER=SIZE[,TIER=SIZE...]")
        pairs = dict(item.split("=", 1) for item in body.split(",") if "=" in item)
        out.append(scenario(name, pairs))
    for s in out:
        for _, size in s.sizes:
            if size.value < 0:
                raise ValueError(f"{s.name}: a size cannot be negative")
    return out


def sweep(profile: StreamProfile, tier: str) -> list[Prediction]:
    """The tier at each multiple of today's size in chart.SWEEP (others at today's)."""
    from kvscope.agent.analyses.whatif.chart import SWEEP

    points = [Scenario(f"{tier}x{s:g}", ((tier, Size(s, "x")),)) for s in SWEEP]
    return replay(profile, points)[1:]


def _select(profiles: list[StreamProfile], args: argparse.Namespace) -> list[StreamProfile]:
    return [p for p in profiles
            if (args.engine is None or p.engine == args.engine) and (args.model is None or p.model == args.model)
            and (args.dp_rank is None or p.dp_rank == args.dp_rank)]


def _what_if(args: argparse.Namespace) -> int:
    try:
        scenarios = asked_scenarios(args)
        data = fetch(args.url) if args.url else args.recording.read_bytes()
        profiles = _select(loads(data), args)
    except (OSError, ValueError) as exc:
        print(f"kvscope what-if: {exc}", file=sys.stderr)
        return 2
    if args.save:
        args.save.write_bytes(dumps(profiles))
    if not profiles:
        print("kvscope what-if: no stream to predict for (is the KV-event collector on, and has the engine "
              "published anything?)", file=sys.stderr)
        return 1
    if args.chart:
        extras.require("reference", "kvscope what-if --chart")
    out: list[dict[str, Any]] = []
    for n, profile in enumerate(profiles):
        try:
            predictions = replay(profile, scenarios)
        except ValueError as exc:  # a size the profile cannot convert (bytes without bytes per token)
            print(f"kvscope what-if: {exc}", file=sys.stderr)
            return 2
        sys.stdout.write(report.header(profile))
        sys.stdout.write(report.table(profile, predictions))
        sys.stdout.write(report.notes(predictions))
        steps = marginals(profile, args.gpus_per_engine)
        sys.stdout.write(marginal_text(steps))
        out.append({**report.as_json(profile, predictions), "marginal": [asdict(m) for m in steps]})
        if args.chart:
            from kvscope.agent.analyses.whatif.chart import draw

            tier = args.curve or next((t for t in TIERS if getattr(args, t.lower()) is not None), "G1")
            path = args.chart if len(profiles) == 1 else args.chart.with_stem(f"{args.chart.stem}-{n}")
            draw(profile, tier, sweep(profile, tier), predictions[1] if len(predictions) > 1 else None, path)
            print(f"chart: {path}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


def add_commands(sub: Any) -> None:
    p = sub.add_parser("what-if", help="predicted hit shares and TTFT at other tier sizes, from a running agent or "
                       "a recording", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--url", help="a running agent, e.g. http://127.0.0.1:9474 (its GET /whatif/profile)")
    source.add_argument("--recording", type=Path, help="a profile the agent wrote ([analyses.whatif] recording)")
    for tier in TIERS:
        p.add_argument(f"--{tier.lower()}", metavar="SIZE",
                       help=f"{tier} size: 2x (of today's), 64GiB, 0 (off), 4096blocks, 1.2Mtokens")
    p.add_argument("--scenario", action="append", default=[], metavar="NAME:TIER=SIZE,...",
                   help="another scenario, e.g. no-g2:G2=0 (repeatable)")
    p.add_argument("--chart", type=Path, help="draw hit shares and TTFT against one tier's size to this PNG")
    p.add_argument("--curve", choices=TIERS, help="the tier the chart sweeps (default: the first --gN given, else G1)")
    p.add_argument("--json", type=Path, help="also write the predictions as JSON here")
    p.add_argument("--save", type=Path, help="also save the profile read (a recording for later)")
    p.add_argument("--gpus-per-engine", type=float, default=1.0, metavar="N",
                   help="GPUs one engine's prefill occupies: the marginal values are its prefill seconds x N")
    p.add_argument("--engine", help="only this engine label")
    p.add_argument("--model", help="only this model label")
    p.add_argument("--dp-rank", help="only this data-parallel rank")
    p.set_defaults(func=_what_if)

