"""Memory of the KV-event collector against the blocks it tracks resident (issue 16, goal 4).

(a) RSS per resident block: a fresh process (this file with `--child N`) builds the collector with its
    default options (reuse tracker at 1/16 included), feeds it N distinct blocks through `handle()` (vLLM
    0.33 batches of 512 BlockStored, spread over G1, G2 (CPU), G3 (STORAGE, LOCAL) and G4 (STORAGE, REMOTE)),
    and reports its RSS growth divided by the resident blocks, at 1 M, 3 M and 5 M. Beside it, in the same
    run, the structure it replaces: the same hashes in Python sets (`--child-set N`). Goal: ≤ 32 B per
    block, so 3 M blocks fit in ≤ 150 MiB of RSS (the whole process).
(b) A flood given back: the whole agent under an unpaced publisher (bench/kv_live.py) for 3 s, its peak RSS,
    and its RSS 5 s after the flood.

Run: .venv/bin/python bench/bench_kv_memory.py   (about a minute)
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "lib"))  # testkit; kvscope itself is installed
sys.path.insert(0, str(ROOT / "bench"))

GOAL_BYTES = 32
GOAL_MIB_AT_3M = 150
MIB = 1 << 20
MEDIA = (("GPU", None), ("CPU", None), ("STORAGE", "LOCAL"), ("STORAGE", "REMOTE"))


def rss() -> int:
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def batches(blocks: int, per_batch: int = 512) -> Iterator[list[bytes]]:
    """Frames of vLLM 0.33 batches storing `blocks` distinct blocks, a quarter in each tier, made as they are
    taken (so that the process holds only the collector's memory)."""
    import msgspec

    from kvscope.agent.tools.reference.vllm_kv_wire import Vllm033Batch, Vllm033BlockStored
    for seq, first in enumerate(range(0, blocks, per_batch)):
        medium, locality = MEDIA[seq % len(MEDIA)]
        events = [Vllm033BlockStored([((first + j + 1) * 0x9E3779B97F4A7C15) % 2**64], None, [1] * 16, 16, None,
                                     medium, None, locality=locality)
                  for j in range(min(per_batch, blocks - first))]
        yield [b"", seq.to_bytes(8, "big"), msgspec.msgpack.encode(Vllm033Batch(0.0, events, 0))]


def child(blocks: int, plain_sets: bool) -> dict[str, float]:
    import zmq

    from kvscope.collectors.kv_events.collector import VllmKvEventsCollector, VllmKvEventsOptions
    collector = VllmKvEventsCollector(VllmKvEventsOptions(endpoint="tcp://127.0.0.1:1", model="m"), zmq.Context())
    stream = collector.streams[0]
    before = rss()
    if plain_sets:  # the structure BlockSet replaced: a Python set of int hashes per tier
        from kvscope.collectors.kv_events.schema import BatchDecoder
        decoder, tiers = BatchDecoder(), {}
        for f in batches(blocks):
            for event in decoder.decode(f[2]).events:
                tiers.setdefault((event.medium, event.locality), set()).update(event.block_hashes)
        resident = sum(map(len, tiers.values()))
    else:
        for f in batches(blocks):
            collector.handle(stream, f)
        resident = sum(len(t.resident) for t in stream.residency.tiers.values())
    after = rss()
    return {"blocks": resident, "growth": after - before, "rss": after}


def run_child(blocks: int, plain_sets: bool = False) -> dict[str, float]:
    mode = "--child-set" if plain_sets else "--child"
    done = subprocess.run([sys.executable, __file__, mode, str(blocks)], capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> int:
    import kv_live
    from goals import verdict
    from machine import Load, state
    load = Load()
    print(state(load), flush=True)
    print("(a) RSS growth per resident block, 512-event batches over G1..G4, default options (reuse tracker 1/16)")
    at_3m: dict[str, float] = {}
    for blocks in (1_000_000, 3_000_000, 5_000_000):
        ours, sets = run_child(blocks), run_child(blocks, plain_sets=True)
        print(f"    {blocks / 1e6:.0f} M blocks: kvscope {ours['growth'] / ours['blocks']:6.1f} B/block "
              f"(RSS {ours['rss'] / MIB:6.1f} MiB); Python sets of the same hashes "
              f"{sets['growth'] / sets['blocks']:6.1f} B/block (RSS {sets['rss'] / MIB:6.1f} MiB)")
        if blocks == 3_000_000:
            at_3m = {"ours": ours["growth"] / ours["blocks"], "sets": sets["growth"] / sets["blocks"],
                     "rss": ours["rss"] / MIB}
    verdict("4: memory per resident block (all tiers, reuse tracker included), 3 M blocks",
            f"{at_3m['ours']:.1f} B/block, RSS {at_3m['rss']:.0f} MiB",
            f"goal {GOAL_BYTES} B and {GOAL_MIB_AT_3M} MiB; Python sets {at_3m['sets']:.0f} B/block",
            f"x{at_3m['ours'] / GOAL_BYTES:.2f}", at_3m["ours"] <= GOAL_BYTES and at_3m["rss"] <= GOAL_MIB_AT_3M)
    flood = kv_live.run(0, 16, 3.0, settle=5.0)
    print(f"(b) unpaced flood, 16-event batches, 3 s: {flood.sent} batches sent, {flood.applied / 16:.0f} applied, "
          f"{flood.dropped:.0f} counted dropped ({flood.shed:.0f} shed by our queue), "
          f"{flood.sent - flood.applied / 16 - flood.dropped:.0f} unaccounted; RSS peak "
          f"{flood.hwm_mib:.0f} MiB, at the end {flood.rss_mib:.0f} MiB, 5 s later {flood.rss_after_mib:.0f} MiB")
    print(state(load))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--child", "--child-set"):
        print(json.dumps(child(int(sys.argv[2]), sys.argv[1] == "--child-set")))
        sys.exit(0)
    sys.exit(main())
