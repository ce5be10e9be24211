"""The tenant cardinality cap: top N by recent traffic shown, the rest in `other`; a tenant that drops out
and comes back goes on from the totals it was last exported with, and nothing is counted twice or lost."""

from __future__ import annotations

from kvscope.agent.core.tenants import OTHER, TenantCap


def exported(cap: TenantCap) -> dict[str, float]:
    cap.rank()
    return {tenant: totals["n"] for tenant, totals in cap.shown()}


def test_a_tenant_that_drops_out_and_comes_back() -> None:
    cap = TenantCap(top_n=1, max_tracked=10)
    cap.add("a", 10, {"n": 10})  # a slot is free: "a" is shown at once
    cap.add("b", 1, {"n": 1})
    assert exported(cap) == {"a": 10, OTHER: 1}
    cap.add("a", 1, {"n": 1})  # counted for "a", but "b" is busier now: "a" drops out before it is exported
    cap.add("b", 40, {"n": 40})
    # a's unexported 1 moved to other, and b's traffic before it was shown stays there; b has counted
    # nothing yet, so it has no series yet
    assert exported(cap) == {OTHER: 1 + 1 + 40}
    cap.add("b", 1, {"n": 1})  # b's own now
    cap.add("a", 200, {"n": 200})  # while not shown: other
    last = exported(cap)
    assert last == {"a": 10, OTHER: 42 + 1 + 200}  # "a" goes on from 10; b, never exported, moved its 1 to other
    # every series only grew, and the last values of all of them add up to everything counted
    assert sum(last.values()) == 10 + 1 + 1 + 40 + 1 + 200


def test_memory_is_bounded_and_forgetting_is_counted() -> None:
    cap = TenantCap(top_n=5, max_tracked=50)
    for i in range(1000):
        cap.add(f"t{i}", 1000 - i, {"n": 1})
    shown = exported(cap)
    assert set(shown) == {"t0", "t1", "t2", "t3", "t4", OTHER}
    # 100 names taken in before the rank (twice max_tracked), 50 of them pruned at it; the 900 others'
    # traffic went to other without their names
    assert cap.forgotten == 50 and cap.folded == 45
    assert cap.unranked == sum(1000 - i for i in range(100, 1000))
    assert sum(shown.values()) == 1000


def test_a_flood_of_names_between_two_ranks_keeps_memory_bounded() -> None:
    cap = TenantCap(top_n=5, max_tracked=50)
    for i in range(100_000):
        cap.add(f"flood-{i}", 1, {"n": 1})
    assert cap.folded <= 2 * 50  # names remembered, whatever the flood
    shown = exported(cap)
    assert sum(shown.values()) == 100_000  # every unit still counted, in the 5 first names or in other
    assert cap.unranked == 100_000 - 2 * 50  # no room between two ranks: counted for other, names not kept
    assert cap.forgotten == 2 * 50 - 50  # pruned at the rank
