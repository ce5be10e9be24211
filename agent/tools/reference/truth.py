"""Ground truth per request, one JSON object per line (what `kvscope selftest` compares the agent with).

Times: `*_ts` are wall-clock seconds (time.time(), comparable with KV-event and span timestamps);
durations are seconds measured on the engine's monotonic clock. The decomposition holds exactly:

    ttft_s = frontend_s + queue_s + sum(fetch_s.values()) + offload_s + prefill_compute_s + other_s,   other_s ≥ 0

- frontend_s: arrival → queued: tokenising (OpenAI server) and hashing the prompt (vLLM's TTFT − queue −
  prefill time, as the engine emits the first token where it stamps it);
- queue_s: queued → first scheduled (vLLM's request_queue_time; queued once the prompt is hashed);
- fetch_s[tier]: reading that tier's reused blocks into G1 (G3/G4 include their hop through host memory),
  with fetch_bytes[tier] the bytes moved off that tier (a G3/G4 block file includes its 4 KiB header);
- offload_s: eviction and store work between the first schedule and the first token: making room in
  G1/G2 (cascades down), storing computed blocks down when G1 keeps nothing, waiting for a write-behind
  buffer;
- prefill_compute_s: the device slot's busy time for the new tokens (cost model × time_scale, slept);
- other_s: inside the prefill phase, what is none of the above: lookup, publishing events, scheduling
  gaps, an engine thread the OS did not run (the device slot idle).
`prefill_s` = first token − first scheduled, vLLM's request_prefill_time (it contains the fetch and the
offload, both synchronous in this engine). `recompute_s` is the cost model's t(prompt, 0)
× time_scale: what the whole prompt would cost without the cache. `device_busy` lists [start, end]
wall-clock intervals of compute for this request (prefill, then decode steps).
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any


@dataclass
class RequestTruth:
    request_id: str
    arrival_ts: float
    prompt_tokens: int
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    finished_ts: float = 0.0
    queue_s: float = 0.0
    fetch_s: dict[str, float] = field(default_factory=dict)
    fetch_bytes: dict[str, int] = field(default_factory=dict)
    offload_s: float = 0.0
    prefill_compute_s: float = 0.0
    prefill_model_s: float = 0.0  # the cost model's unscaled seconds for the new tokens
    prefill_s: float = 0.0
    frontend_s: float = 0.0
    other_s: float = 0.0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    e2e_s: float = 0.0
    tokens_by_tier: dict[str, int] = field(default_factory=dict)  # reused tokens per tier
    computed_tokens: int = 0
    completion_tokens: int = 0
    bytes_by_link: dict[str, int] = field(default_factory=dict)  # "G4->G2": bytes, every hop incl. stores
    seconds_by_link: dict[str, float] = field(default_factory=dict)
    recompute_s: float = 0.0
    time_scale: float = 1.0
    block_errors: int = 0
    finish_reason: str = "length"
    device_busy: list[list[float]] = field(default_factory=list)

    @property
    def fetch_total_s(self) -> float:
        return sum(self.fetch_s.values())

    def components(self) -> dict[str, float]:
        """Seconds per TTFT component, in the order of agent.core.records.COMPONENTS."""
        return {"frontend": self.frontend_s, "queue": self.queue_s, "fetch": self.fetch_total_s,
                "offload": self.offload_s, "prefill": self.prefill_compute_s, "other": self.other_s}

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


class TruthLog:
    """Appends records to a JSONL file (or keeps them in memory only when path is None). Thread-safe."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.records: list[RequestTruth] = []
        self._lock = threading.Lock()
        self._file: IO[str] | None = path.open("a", encoding="utf-8") if path else None

    def write(self, record: RequestTruth) -> None:
        with self._lock:
            self.records.append(record)
            if self._file is not None:
                self._file.write(record.to_json() + "\n")
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_truth(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
