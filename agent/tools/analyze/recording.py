"""The per-request figures of `kvscope analyze` from kvscope's JSON Lines recording (`[exporters.jsonl]`).

A recording is appended to for as long as the agent runs, so it usually holds more than one benchmark run:
only the requests that arrived inside the AIPerf run's time window are used (first request start to last
request end, client clock, widened by `SLACK_S` for the client → server delay and small clock offsets), and
the report says how many it kept. From those: the TTFT split with the methods behind it, each request's
split, and the counterfactuals the agent's cost model gave (prefill saved, TTFT without the cache) with the
model's confidence.
"""

from __future__ import annotations

from kvscope.agent.tools.analyze.inputs import COMPONENTS, RecordedRequest, Recording
from kvscope.agent.tools.analyze.report import Counterfactuals, Report, Split

SLACK_S = 1.0


def in_window(recording: Recording, start_ns: int, end_ns: int, slack_s: float = SLACK_S) -> list[RecordedRequest]:
    low, high = start_ns / 1e9 - slack_s, end_ns / 1e9 + slack_s
    return [r for r in recording.requests if low <= r.arrival <= high]


def recording_figures(report: Report, recording: Recording) -> None:
    if recording.bad_lines:
        report.notes.append(f"recording: {recording.bad_lines} unreadable lines skipped")
    kept = in_window(recording, report.start_ns, report.end_ns)
    report.recording_kept, report.recording_total = len(kept), len(recording.requests)
    report.notes.append(f"recording: kept {len(kept)} of {len(recording.requests)} recorded requests, those that "
                        f"arrived within the run's time window (±{SLACK_S:g} s)")
    if kept and len(kept) != report.requests:
        report.notes.append(f"recording: {len(kept)} requests in the window against {report.requests} in AIPerf's "
                            "export: another client used the engine meanwhile, or the agent missed some")
    if not kept:
        return
    components = {k: sum(r.components.get(k, 0.0) for r in kept) for k in COMPONENTS}
    methods = {k: "/".join(sorted({r.methods[k] for r in kept if k in r.methods})) for k in COMPONENTS}
    report.split = Split("recording", len(kept), sum(r.ttft for r in kept),
                         {k: v for k, v in components.items() if methods[k]}, {k: v for k, v in methods.items() if v})
    report.per_request = [{"request_id": r.request_id, "arrival": r.arrival, "prompt_tokens": r.prompt_tokens,
                           "cached_tokens": r.cached_tokens, "ttft": r.ttft,
                           **{k: r.components.get(k) for k in COMPONENTS}}
                          for r in sorted(kept, key=lambda r: r.arrival)]
    report.counterfactuals = counterfactuals(kept)


def counterfactuals(requests: list[RecordedRequest]) -> Counterfactuals | None:
    """Sums over the requests the agent gave a counterfactual; None when it gave none."""
    saved = [r for r in requests if r.prefill_saved is not None]
    without = [r for r in requests if r.ttft_without_cache is not None]
    judged = {r.request_id: r for r in (*saved, *without)}
    if not judged:
        return None
    low = sum(r.confidence == "low" for r in judged.values())
    confidence = "high" if low == 0 else "low" if low == len(judged) else "mixed"
    return Counterfactuals(len(judged), sum(r.prefill_saved or 0.0 for r in saved), sum(r.ttft for r in without),
                           sum(r.ttft_without_cache or 0.0 for r in without), confidence, low)
