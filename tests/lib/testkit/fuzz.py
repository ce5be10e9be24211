"""Fuzzing every parser and decoder of kvscope's inputs: `make fuzz` (python -m testkit.fuzz).

Feeds each target of tests/lib/testkit/fuzz_targets.py mutated real inputs, counts the inputs and the crashes (an
exception outside the target's contract, or a broken invariant) per target, and keeps one input per
distinct crash in fuzz-crashes/ to turn into a regression test (tests/test_fuzz.py).

    python -m testkit.fuzz                      # >= 100,000 inputs per target, both cores
    python -m testkit.fuzz --inputs 1000 --only kv_batch_decode --seed 7
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import multiprocessing
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from testkit.fuzz_mutations import check, inputs
from testkit.fuzz_targets import TARGETS


@dataclass
class Report:
    name: str
    inputs: int
    crashes: int
    unique: dict[str, str]  # crash signature -> a traceback
    seconds: float


def fuzz(name: str, count: int, seed: int, crash_dir: Path | None, seconds: float | None) -> Report:
    target = TARGETS[name]()
    rng = random.Random(f"{seed}:{name}")
    crashes, unique = 0, {}
    start = time.monotonic()
    done = 0
    while done < count and (seconds is None or time.monotonic() - start < seconds):
        data = inputs(target, rng)
        done += 1
        signature = check(target, data)
        if signature is None:
            continue
        crashes += 1
        if signature not in unique:
            unique[signature] = signature
            if crash_dir is not None:
                crash_dir.mkdir(parents=True, exist_ok=True)
                digest = hashlib.sha256(data).hexdigest()[:16]
                (crash_dir / f"{name}-{digest}.bin").write_bytes(data)
    return Report(name, done, crashes, unique, time.monotonic() - start)


def _fuzz_args(args: tuple[str, int, int, Path | None, float | None]) -> Report:
    return fuzz(*args)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=100_000, help="inputs per target (default 100,000)")
    ap.add_argument("--seconds", type=float, default=None, help="stop each target after this long")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--only", action="append", choices=sorted(TARGETS), help="run only these targets")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--crashes", type=Path, default=Path("fuzz-crashes"), help="where crashing inputs go")
    args = ap.parse_args(argv)
    logging.disable(logging.CRITICAL)  # the targets log what they skip (once each): not news here
    names = args.only or list(TARGETS)
    print(f"fuzzing {len(names)} targets, {args.inputs:,} inputs each, seed {args.seed}, {args.jobs} processes")
    work = [(n, args.inputs, args.seed, args.crashes, args.seconds) for n in names]
    start = time.monotonic()
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        reports = pool.map(_fuzz_args, work, chunksize=1)
    print(f"{'target':<22} {'inputs':>9} {'crashes':>8} {'unique':>7} {'seconds':>8}")
    for r in reports:
        print(f"{r.name:<22} {r.inputs:>9,} {r.crashes:>8} {len(r.unique):>7} {r.seconds:>8.1f}")
        for signature in r.unique:
            print(f"    {signature}")
    total = sum(r.crashes for r in reports)
    print(f"{sum(r.inputs for r in reports):,} inputs in {time.monotonic() - start:.0f} s, {total} crash(es)"
          + (f"; inputs in {args.crashes}/" if total else ""))
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

