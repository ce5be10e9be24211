"""The noisy-neighbour scenario as selftest checks (correlation.md §5-§6).

The same shared-prompts load runs twice against the seeds' G4 configuration (O_DIRECT block files,
so fetches reach the device), once quiet and once with competing I/O on G4's disk
(agent/tools/reference/noise.py). The agent must attribute TTFT like the truth in both runs, put the TTFT
increase on fetch, and raise its contention signal with noise and not without. A disk that someone
else loads during the quiet run fails the "silent without noise" check: that run did have a neighbour.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvscope.agent.core.records import COMPONENTS
from kvscope.agent.tools.reference.engine import EngineConfig
from kvscope.agent.tools.reference.noise import NoiseSpec
from kvscope.agent.tools.reference.noisy_neighbour import PhaseView, run_noisy_neighbour
from kvscope.agent.tools.reference.scenarios import LoadResult
from kvscope.agent.tools.selftest.checks import SHARE_PP, Check, shares

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class NoisyPlan:
    requests: int = 16
    prompts: int = 4
    concurrency: int = 1  # one device slot: alone, a request's TTFT increase is its own fetch's
    # Long enough that the engine's own per-request bookkeeping inside the prefill phase (~2-3 ms, which
    # the truth calls "other" and vLLM's phases cannot separate from prefill) stays well inside ±5 pp.
    prompt_tokens: int = 4096
    noise_threads: int = 4
    min_raised_windows: int = 3


def _truth_components(load: LoadResult) -> dict[str, float]:
    out = dict.fromkeys(COMPONENTS, 0.0)
    for t in load.truths:
        for c, seconds in t.components().items():
            out[c] += seconds
    return out


def _phase_checks(label: str, load: LoadResult, view: PhaseView) -> list[Check]:
    checks = [Check(label, "requests (TTFT count)", len(load.truths), view.requests,
                    view.requests - len(load.truths), "exact", view.requests == len(load.truths))]
    truth, measured = shares(_truth_components(load)), shares(view.components)
    for c in COMPONENTS:
        err = measured[c] - truth[c]
        checks.append(Check(label, f"TTFT share {c} %", truth[c], measured[c], err, f"±{SHARE_PP:g} pp",
                            abs(err) <= SHARE_PP))
    return checks


def noisy_checks(plan: NoisyPlan, workdir: Path | None = None) -> list[Check]:
    with tempfile.TemporaryDirectory(prefix="kvscope-selftest-noisy-") as tmp:
        base_dir = (workdir or Path(tmp)) / "noisy-neighbour"
        base = EngineConfig.seeds_g4(base_dir, g1_blocks=1, g4_blocks=0, default_max_tokens=4)
        r = run_noisy_neighbour(base, plan.requests, plan.prompts, plan.concurrency, plan.prompt_tokens,
                                NoiseSpec(threads=plan.noise_threads, file_bytes=512 * MIB))
    checks = _phase_checks("noisy-neighbour, quiet", r.quiet, r.quiet_view)
    checks += _phase_checks("noisy-neighbour, noise", r.noisy, r.noisy_view)
    quiet, noisy = r.quiet_view, r.noisy_view
    run = "noisy-neighbour"
    for view in (quiet, noisy):  # the figures below are read from a wholly attributed run
        parts = sum(view.components.values())
        checks.append(Check(run, f"{view.label} run attributed whole at its end (component seconds)", view.ttft,
                            parts, parts - view.ttft, "= TTFT sum", view.settled))
    checks.append(Check(run, "contention signal, quiet run (windows raised)", 0, quiet.raised, quiet.raised,
                        "0", quiet.raised == 0))
    checks.append(Check(run, "contention signal, noisy run (windows raised)", len(noisy.windows), noisy.raised,
                        noisy.raised - len(noisy.windows), f">= {plan.min_raised_windows}",
                        noisy.raised >= plan.min_raised_windows))
    d_ttft = noisy.ttft / max(noisy.requests, 1) - quiet.ttft / max(quiet.requests, 1)
    d_fetch = (noisy.components.get("fetch", 0.0) / max(noisy.requests, 1)
               - quiet.components.get("fetch", 0.0) / max(quiet.requests, 1))
    truth_d_ttft = (sum(t.ttft_s for t in r.noisy.truths) / len(r.noisy.truths)
                    - sum(t.ttft_s for t in r.quiet.truths) / len(r.quiet.truths))
    checks.append(Check(run, "TTFT increase put on fetch (s per request)", truth_d_ttft, d_fetch,
                        d_fetch - d_ttft, ">= 70 % of the TTFT increase", d_ttft > 0 and d_fetch >= 0.7 * d_ttft))
    return checks
