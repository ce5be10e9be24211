"""`kvscope analyze DIR [--recording FILE.jsonl] [--baseline DIR] [--whatif PROFILE] [--out OUT]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _analyze(args: argparse.Namespace) -> int:
    from kvscope.agent.tools.analyze.build import build_report
    from kvscope.agent.tools.analyze.charts import write_charts
    from kvscope.agent.tools.analyze.render import to_json, to_markdown

    try:
        report = build_report(args.dir, args.recording, args.baseline, engine=args.engine, whatif=args.whatif,
                              gpus=args.gpus_per_engine)
        baseline = build_report(args.baseline, engine=args.engine) if args.baseline else None
    except (OSError, ValueError) as exc:
        print(f"kvscope analyze: {exc}", file=sys.stderr)
        return 2
    out: Path = args.out or Path(args.dir) / "kvscope-analysis"
    out.mkdir(parents=True, exist_ok=True)
    charts = write_charts(report, out, baseline)
    if not charts:
        report.notes.append("no charts: matplotlib is not installed (pip install 'kvscope[reference]')")
    markdown = to_markdown(report, charts)
    (out / "report.md").write_text(markdown, encoding="utf-8")
    (out / "report.json").write_text(to_json(report), encoding="utf-8")
    sys.stdout.write(markdown)
    print(f"\nwritten: {out}/report.md, report.json" + "".join(f", {c}" for c in charts))
    return 0


def add_commands(sub: Any) -> None:
    p = sub.add_parser("analyze", help="offline report from an AIPerf output directory (Markdown, JSON, PNG)")
    p.add_argument("dir", help="AIPerf --output-artifact-dir (profile_export.jsonl; server_metrics_export.jsonl "
                   "or .json)")
    p.add_argument("--recording", type=Path, help="kvscope per-request JSONL (the [exporters.jsonl] file)")
    p.add_argument("--baseline", type=Path, help="AIPerf directory of a recompute run, for the speed-up")
    p.add_argument("--whatif", type=Path, help="the agent's what-if profile of the run (GET /whatif/profile, or its "
                   "[analyses.whatif] recording): adds the marginal value of each tier's size")
    p.add_argument("--gpus-per-engine", type=float, default=1.0, metavar="N",
                   help="GPUs one engine's prefill occupies: GPU-seconds = its prefill seconds x N (default 1)")
    p.add_argument("--out", type=Path, help="output directory (default DIR/kvscope-analysis)")
    p.add_argument("--engine", default="reference",
                   help="engine kind of the scraped server: 'reference' (fetch inside prefill, G4 hits reported as "
                        "external_unspecified) or 'vllm' (default: reference)")
    p.set_defaults(func=_analyze)
