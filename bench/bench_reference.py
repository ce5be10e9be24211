"""Reference pipeline bandwidth against the machine's own ceilings, measured in the same run on the same files.

- G3/G4 block-file reads (the store's read path, timed per transfer as the engine reports them), buffered
  with a warm page cache and with O_DIRECT, against fio reading the same files with the same request size
  (psync, QD1; `--invalidate=0` for warm, `--direct=1` for O_DIRECT), or dd when fio is missing;
- G2 → G1 copies (the store's memory path) against a plain numpy copy streaming over pre-faulted pools of
  the same size and block size.
The reference for reads is the faster of fio and dd in each round (dd timed by its own report).
Goal (issue 4): ≥ 80 % of each reference. Also prints the whole fetch (read + copy into G1 + bookkeeping) beside
the read reference, without a verdict: it does a read and a copy, the reference a read alone.
Usage: .venv/bin/python bench/bench_reference.py [--dir DIR] [--blocks N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "lib"))  # testkit; kvscope itself is installed
sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import verdict as goal_verdict

from kvscope.agent.core.tiers import Tier
from kvscope.agent.tools.reference.blockfile import PAGE, direct_io_supported
from kvscope.agent.tools.reference.blocks import BlockId, chain_blocks
from kvscope.agent.tools.reference.geometry import preset
from kvscope.agent.tools.reference.pools import MemoryPool
from kvscope.agent.tools.reference.tierstore import BlockEvent, TieredStore, TierSpec, Transfer

BLOCK_TOKENS = 256
GOAL = 0.80


class Recorder:
    def __init__(self) -> None:
        self.transfers: list[Transfer] = []

    def transfer(self, t: Transfer) -> None:
        self.transfers.append(t)

    def block_event(self, e: BlockEvent) -> None:
        pass

    def error(self, tier: Tier, kind: str) -> None:
        raise RuntimeError(f"{tier}: {kind}")


def gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def store_for(directory: Path, n: int, block_bytes: int, direct: bool, g2: int) -> tuple[TieredStore, Recorder]:
    rec = Recorder()
    specs = {Tier.G1: TierSpec(n + 1, retain=False), Tier.G2: TierSpec(g2),
             Tier.G3: TierSpec(n + 1, path=directory, direct=direct)}
    return TieredStore(BLOCK_TOKENS, block_bytes, specs, rec), rec


def fill(store: TieredStore, n: int) -> list[BlockId]:
    blocks = chain_blocks(np.arange(n * BLOCK_TOKENS) % 50_000, BLOCK_TOKENS)
    for b in blocks:
        store.put_computed(b)
    store.release()
    return blocks


def pipeline_fetch(store: TieredStore, rec: Recorder, blocks: list[BlockId], src: Tier) -> tuple[float, float]:
    """(GB/s of the src → host hop per transfer timing, GB/s of the whole fetch wall time per block bytes)."""
    rec.transfers.clear()
    tiers = store.lookup(blocks)
    assert tiers == [src] * len(blocks), tiers[:3]
    t0 = time.perf_counter()
    result = store.fetch(blocks, tiers)
    wall = time.perf_counter() - t0
    assert result.loaded == len(blocks)
    store.release()
    hop = [t for t in rec.transfers if t.src is src]
    hop_bw = gbps(sum(t.bytes for t in hop), sum(t.seconds for t in hop))
    return hop_bw, gbps(len(blocks) * store.block_bytes, wall)


def fio_read(files: list[Path], bs: int, direct: bool) -> float | None:
    fio = shutil.which("fio")
    if fio is None:
        return None
    cmd = [fio, "--name=ref", "--rw=read", f"--bs={bs}", "--ioengine=psync", "--iodepth=1",
           f"--direct={int(direct)}", "--output-format=json", "--filename=" + ":".join(str(f) for f in files)]
    if not direct:
        cmd += ["--invalidate=0", "--loops=3"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out[out.index("{"):])["jobs"][0]["read"]["bw_bytes"]) / 1e9


def dd_read(files: list[Path], bs: int, direct: bool) -> float:
    """dd per file, timed by dd itself (its 'copied, S s' line), so process start-up is not counted."""
    total, seconds = 0, 0.0
    for f in files:
        cmd = ["dd", f"if={f}", "of=/dev/null", f"bs={bs}", *(["iflag=direct"] if direct else [])]
        err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
        seconds += float(err.strip().splitlines()[-1].split(" copied, ")[1].split(" s")[0])
        total += f.stat().st_size
    return gbps(total, seconds)


def best_reader(files: list[Path], bs: int, direct: bool) -> tuple[float, str]:
    """The faster of fio and dd on these files: the machine's ceiling for this read pattern."""
    mode = "O_DIRECT" if direct else "warm"
    found = [(dd_read(files, bs, direct), f"dd {mode}")]
    fio = fio_read(files, bs, direct)
    if fio is not None:
        found.append((fio, f"fio psync {mode}"))
    return max(found)


def numpy_copy(n: int, block_bytes: int) -> float:
    """np.copyto block by block across two pre-faulted pools of n blocks (perf-baselines §4's method)."""
    src, dst = MemoryPool(n, block_bytes), MemoryPool(n, block_bytes)
    t0 = time.perf_counter()
    for i in range(n):
        np.copyto(dst.block(i), src.block(i))
    return gbps(n * block_bytes, time.perf_counter() - t0)


def row(name: str, ours: list[float], ref: list[float], ref_name: str, goal: bool = True) -> str:
    """One figure beside its reference; `goal`: judged against GOAL and recorded for make bench's table."""
    o, r = statistics.median(ours), statistics.median(ref)
    if goal:
        met = goal_verdict(f"reference pipeline: {name.strip()}", f"{o:.2f} GB/s", f"{ref_name} {r:.2f} GB/s; goal "
                           f"{GOAL:.0%} of it", f"x{o / r:.2f}", o >= GOAL * r)
        verdict = "MET" if met else "MISSED"
    else:
        verdict = "(no goal)"
    return (f"{name:<30} {o:>6.2f} GB/s  vs {ref_name:<30} {r:>6.2f} GB/s   {100 * o / r:>5.0f} %  "
            f"{verdict}  (runs: {', '.join(f'{x:.2f}' for x in ours)} / {', '.join(f'{x:.2f}' for x in ref)})")


def read_rows(where: Path, n: int, block_bytes: int, rounds: int, direct: bool, label: str) -> list[str]:
    """G3 reads by the pipeline (the hop, and the whole fetch to G1) vs the best plain reader of the same files."""
    store, rec = store_for(where, n, block_bytes, direct=direct, g2=0)
    blocks = fill(store, n)
    files = [store.files[Tier.G3].path(b.key) for b in blocks]
    file_bytes = files[0].stat().st_size
    assert PAGE + block_bytes == file_bytes  # a block file is one header page + the block
    ours, whole, ref, names = [], [], [], set()
    for _ in range(rounds):
        hop, fetch = pipeline_fetch(store, rec, blocks, Tier.G3)
        ours.append(hop)
        whole.append(fetch)
        bw, ref_name = best_reader(files, file_bytes, direct=direct)
        ref.append(bw)
        names.add(ref_name)
    ref_name = " / ".join(sorted(names))
    # the whole fetch reads and then copies into G1: against a read alone it is shown, not judged (from the
    # page cache both are memory copies, so a read plus a copy runs near half a read's rate by construction)
    return [row(f"G3/G4 read, {label}", ours, ref, ref_name),
            row(f"  whole fetch to G1, {label.split()[0]}", whole, ref, ref_name, goal=False)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, help="directory for the block files (default: a temp dir)")
    ap.add_argument("--blocks", type=int, default=48, help="blocks per round (9 MiB each for gpt-oss-120b)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    block_bytes = preset("gpt-oss-120b").block_bytes(BLOCK_TOKENS)
    n = args.blocks
    base = Path(tempfile.mkdtemp(prefix="bench-reference-", dir=args.dir))
    print(f"reference pipeline bench: {n} blocks of {block_bytes:,} B (gpt-oss-120b, {BLOCK_TOKENS} tokens) "
          f"in {base}; {args.rounds} rounds; median shown")
    lines = []
    try:
        # buffered, warm page cache: the files were just written
        lines += read_rows(base / "buffered", n, block_bytes, args.rounds, direct=False, label="buffered (warm)")
        # O_DIRECT, where the filesystem allows it
        ok, why = direct_io_supported(base)
        if ok:
            lines += read_rows(base / "direct", n, block_bytes, args.rounds, direct=True, label="O_DIRECT")
        else:
            lines.append(f"G3/G4 read, O_DIRECT: skipped ({why})")
        # G2 -> G1: blocks kept in G2, fetched into G1
        store, rec = store_for(base / "g2", n, block_bytes, direct=False, g2=n + 1)
        blocks = fill(store, n)
        ours, ref = [], []
        for _ in range(args.rounds):
            ours.append(pipeline_fetch(store, rec, blocks, Tier.G2)[0])
            ref.append(numpy_copy(n, block_bytes))
        lines.append(row("G2 -> G1 copy", ours, ref, "numpy copyto, pools"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
