"""Property tests over every parser and decoder of kvscope's inputs (the targets of tests/lib/testkit/fuzz.py): for
any input each returns its result or raises its documented error type, and keeps its invariants.
Hypothesis draws mutations of the real fixtures, arbitrary bytes and, for msgpack, arbitrary nested
values; derandomized and bounded so that `make test` spends a few seconds here. `make fuzz` runs the
same targets on >= 100,000 inputs each. Inputs that crashed a target once are kept below as regressions."""

from __future__ import annotations

import random
import struct

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testkit.fuzz_mutations import Target, check, mutate
from testkit.fuzz_targets import TARGETS

EXAMPLES = 100
_targets: dict[str, Target] = {}


def target(name: str) -> Target:
    if name not in _targets:
        _targets[name] = TARGETS[name]()
    return _targets[name]


def mutated(t: Target) -> st.SearchStrategy[bytes]:
    return st.builds(lambda seed, rng: mutate(rng, seed, t.seeds, t.tokens),
                     st.sampled_from(t.seeds), st.randoms(use_true_random=False))


_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
            | st.text(max_size=12) | st.binary(max_size=12)
            | st.sampled_from(["GPU", "CPU", "STORAGE", "LOCAL", "REMOTE", "BlockStored", "BlockRemoved",
                               "AllBlocksCleared"]))
_msgpack_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
        st.sampled_from(["type", "block_hashes", "medium", "locality", "block_size", "ts", "events",
                         "data_parallel_rank", "token_ids", "x"]), inner, max_size=5),
    max_leaves=30)


def _batches() -> st.SearchStrategy[bytes]:
    """Batch-shaped msgpack: [ts, [events...], rank] or arbitrary values in its place."""
    event = st.dictionaries(st.sampled_from(["type", "block_hashes", "medium", "locality", "block_size"]),
                            _msgpack_values, max_size=5) | _msgpack_values
    batch = st.tuples(_scalars, st.lists(event, max_size=4), _scalars).map(list) | _msgpack_values
    return batch.map(msgspec.msgpack.encode)


FAST = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_target_keeps_its_contract(name: str) -> None:
    t = target(name)
    strategy = mutated(t) | st.binary(max_size=512)
    if name in ("kv_batch_decode", "kv_subscriber_handle"):
        strategy = strategy | _batches().map(lambda b: b"\x01" + b if name == "kv_subscriber_handle" else b)

    @FAST
    @given(strategy)
    def holds(data: bytes) -> None:
        assert check(t, data) is None, check(t, data)

    holds()


def test_the_seeds_themselves_pass() -> None:
    for name in TARGETS:
        t = target(name)
        for seed in t.seeds:
            assert check(t, seed) is None, (name, check(t, seed))


# -- regressions: inputs that crashed a target, found by tests/lib/testkit/fuzz.py ------------------------------------


def _pack(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


REGRESSIONS: list[tuple[str, bytes]] = [
    # msgspec's RecursionError on 1,000 nested arrays ended the KV-event socket thread
    ("kv_batch_decode", b"\x93" + b"\x91" * 1000 + b"\x01\x90\x00"),
    ("kv_subscriber_handle", b"\x01\x93" + b"\x91" * 1000 + b"\x01\x90\x00"),
    # json.loads' RecursionError, and an int past float's range (OverflowError), escaped the AIPerf parsers
    ("aiperf_exports", b"[" * 5000),
    ("aiperf_exports", b'{"metadata": {"request_start_ns": 1}, "metrics": {"input_sequence_length": {"value": 1'
                       + b"0" * 400 + b"}}}"),
    ("aiperf_exports", b'{"timestamp_ns": 1, "metrics": {"m": {"value": 1' + b"0" * 400 + b"}}}"),
    # an LMCache worker_id of 5,000 digits: int() past its limit failed the whole collection (engine_map)
    ("engine_pages", b"\x01" + b'lmcache:num_requested_tokens_total{model_name="m",role="worker",worker_id="'
                     + b"7" * 5000 + b'"} 500000.0\n' + b'lmcache:num_hit_tokens_total{model_name="m",role="worker",'
                     + b'worker_id="\xc2\xb2"} 5.0\n'),
    # a counter whose last value (taken without a wrap modulus) lay past the modulus it now has: the
    # "wrap" took the total from 1.8e139 down to 0
    ("store_ingest", _pack(1, 1.85e139, 0.5, -1, 1, 5, 0.5, 1)),
    # totals past the largest float became +Inf
    ("store_ingest", _pack(1e308, 1, 0.5, -1, 1, 1, 0.5, -1, 1e308, 1, 0.5, -1, 1, 1, 0.5, -1, 1e308, 1, 0.5, -1)),
]


@pytest.mark.parametrize(("name", "data"), REGRESSIONS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(REGRESSIONS)])
def test_inputs_that_once_crashed_a_target(name: str, data: bytes) -> None:
    assert check(TARGETS[name](), data) is None


def test_the_mutator_is_deterministic_for_a_seeded_rng() -> None:
    t = target("diskstats")
    a = [mutate(random.Random(5), s, t.seeds, t.tokens) for s in t.seeds]
    b = [mutate(random.Random(5), s, t.seeds, t.tokens) for s in t.seeds]
    assert a == b

