"""The agent configuration that watches a running reference engine, as `kvscope reference serve` prints it.

What an operator would otherwise assemble from three documents: the `vllm` scraper on the engine's /metrics
with the reference engine's tier mapping (its G4 hits arrive as vLLM's `external_unspecified` source), the
KV-event subscriber with the model's bytes per token (for used bytes per tier), the OTLP receiver the engine's
spans go to (per-request attribution), the disk holding G3/G4, and the correlation analysis writing its
per-request JSON Lines. `kvscope run --config FILE` runs it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlsplit

# the reference engine's dialect (vllm_dialect.py): G4 hits are vLLM's "external_unspecified" source, the
# tiering labels are 1:fs (G3) and 2:fs (G4)
SOURCE_TIERS = {"device": "G1", "host": "G2", "disk": "G3", "external_unspecified": "G4"}
TIERING_TIERS = {"1:fs": "G3", "2:fs": "G4"}


def _s(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid TOML basic string


def _table(d: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{_s(k)} = {_s(v)}" for k, v in d.items()) + " }"


@dataclass(frozen=True, slots=True)
class WatchedEngine:
    """Where a reference engine serves what the agent reads."""

    metrics_url: str  # http://host:port/metrics
    model: str
    kv_bytes_per_token: int
    kv_events: str | None = None  # the PUB endpoint; None: KV events off
    kv_events_replay: str | None = None
    otlp_traces_endpoint: str | None = None  # where the engine sends its spans (the agent's receiver)
    disk_device: str | None = None  # the whole disk holding G3/G4, when they are on a block device
    # tiers /metrics does not size (vLLM reports G1 and G2), in bytes: the what-if analysis' today
    file_tier_bytes: dict[str, int] | None = None
    reports_reuse: bool = False  # KV events announce G1 reuses (--kv-cache-report-mode full)


def _otlp_listen(endpoint: str) -> str | None:
    """host:port the agent's receiver must listen on for spans sent to `endpoint` (None: not a plain URL)."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return f"{parts.hostname}:{parts.port or 4318}"


def agent_config(engine: WatchedEngine, listen: str = "0.0.0.0:9474",
                 requests_jsonl: str = "kvscope_requests.jsonl") -> str:
    """The TOML text of an agent that watches `engine`, with a comment on every choice."""
    lines = [
        "# kvscope agent for `kvscope reference serve` (kvscope run --config THIS_FILE)",
        "[exporters.prometheus]",
        f"listen = {_s(listen)}",
        "",
        "[collectors.vllm]",
        "enabled = true",
        f"urls = [{_s(engine.metrics_url)}]",
        'engine = "reference"',
        "# the reference engine reports G4 hits as vLLM's external_unspecified source (vLLM leaves it unattributed)",
        f"cache_hit_source_tiers = {_table(SOURCE_TIERS)}",
        f"tiering_tiers = {_table(TIERING_TIERS)}",
        "",
    ]
    if engine.kv_events:
        lines += ["[collectors.vllm_kv_events]", "enabled = true", f"endpoint = {_s(engine.kv_events)}"]
        if engine.kv_events_replay:
            lines.append(f"replay_endpoint = {_s(engine.kv_events_replay)}")
        lines += ['engine = "reference"', f"model = {_s(engine.model)}",
                  f"kv_bytes_per_token = {engine.kv_bytes_per_token}  # the engine's KV geometry", ""]
    listen_otlp = _otlp_listen(engine.otlp_traces_endpoint) if engine.otlp_traces_endpoint else None
    if listen_otlp:
        lines += ["[collectors.otlp_traces]  # the engine's llm_request spans: per-request attribution",
                  "enabled = true", f"listen = {_s(listen_otlp)}", 'engine = "reference"',
                  f"model = {_s(engine.model)}", ""]
    else:
        lines += ["# per-request attribution: start serve with --otlp-traces-endpoint http://127.0.0.1:4318 and",
                  "# add [collectors.otlp_traces] enabled = true, engine = \"reference\"", ""]
    lines += ["[exporters.jsonl]  # every attributed request as a line, for kvscope analyze --recording",
              "enabled = true", f"path = {_s(requests_jsonl)}", ""]
    if engine.disk_device:
        lines += ["[collectors.disk]  # the whole disk holding G3/G4", f"include = [{_s(engine.disk_device)}]", ""]
    if engine.kv_events:
        sizes = {t: f"{n}B" for t, n in (engine.file_tier_bytes or {}).items()}
        lines += ["[analyses.whatif]  # hit shares and TTFT at other tier sizes (kvscope what-if)",
                  f"tier_sizes = {_table(sizes)}  # G3/G4 (vLLM's /metrics sizes only G1 and G2)",
                  'recording = "kvscope_whatif.json"  # kvscope what-if --recording reads it']
        if not engine.reports_reuse:
            lines.append("# G1 hits are not in the KV events: start serve with --kv-cache-report-mode full")
        lines.append("")
    return "\n".join(lines)
