"""Newer KVBM builds stage disk hits on host memory (`onboard_blocks_d2h`) before promoting them (`onboard_blocks_h2d`):
the staged blocks are disk hits, off G2's, and G2's count never goes backwards while a staged block is in flight.

The pages are constructed (no newer KVBM page exists in public repositories): the 0.9.0 names and form of
tests/fixtures/dynamo, plus `onboard_blocks_d2h` with the help text of KVBM's `CompatMetrics`."""

from __future__ import annotations

from kvscope.agent.app.wiring import build_catalogue
from kvscope.agent.core import contract as c
from kvscope.agent.core.store import Store
from kvscope.collectors.engines.dynamo_kvbm import KvbmCollector, KvbmOptions
from testkit.engine_pages import FIXTURES, as_dict, fixture_module, series, value

PAGES = fixture_module("dynamo")
NODE = str(FIXTURES / "dynamo" / "node" / "proc")
BT, MODEL = PAGES.BLOCK_TOKENS, PAGES.MODEL
KEY = ("dynamo", MODEL, "0")


def kvbm_page(h2d: int | None, d2d: int, d2h: int | None) -> bytes:
    lines = []
    for name, help_text, n in (
            ("onboard_blocks_h2d", "The number of onboard blocks from host to device", h2d),
            ("onboard_blocks_d2d", "The number of onboard blocks from disk to device", d2d),
            ("onboard_blocks_d2h", "The number of onboard blocks from disk to host (G3→G2 staging step)", d2h)):
        if n is not None:
            lines += [f"# HELP kvbm_{name} {help_text}", f"# TYPE kvbm_{name} counter", f"kvbm_{name} {n}"]
    return ("\n".join(lines) + "\n").encode()


class Scrapes:
    """A KVBM collector on the local-NVMe pool (G3) whose page is whatever was set last."""

    def __init__(self) -> None:
        self.body = b""
        options = KvbmOptions(urls=["http://kvbm/metrics"], model=MODEL, disk_cache_dir="/mnt/nvme0/kvbm",
                              block_tokens=BT)
        self.collector = KvbmCollector(options, NODE, environ={}, fetch=lambda *_: self.body)

    def hits(self, h2d: int | None, d2d: int, d2h: int | None) -> dict[str, float]:
        self.body = kvbm_page(h2d, d2d, d2h)
        readings = as_dict(self.collector.collect())
        return {labels[3]: value(readings, c.KV_HIT_TOKENS, *labels)
                for labels in series(readings, c.KV_HIT_TOKENS)}


def test_staged_disk_hits_count_once_as_disk_hits() -> None:
    kvbm = Scrapes()
    assert kvbm.hits(h2d=100, d2d=20, d2h=10) == {"G2": 90 * BT, "G3": 30 * BT}


def test_g2_is_held_while_a_staged_block_waits_for_its_promotion() -> None:
    kvbm = Scrapes()
    kvbm.hits(h2d=100, d2d=20, d2h=10)
    assert kvbm.hits(h2d=100, d2d=20, d2h=15) == {"G2": 90 * BT, "G3": 35 * BT}  # 5 staged, not yet promoted
    assert kvbm.hits(h2d=112, d2d=20, d2h=15) == {"G2": 97 * BT, "G3": 35 * BT}  # promoted, and 7 of G2's own
    assert kvbm.hits(h2d=3, d2d=0, d2h=1) == {"G2": 2 * BT, "G3": 1 * BT}  # KVBM restarted: counting starts again


def test_the_store_sees_no_reset_while_blocks_are_in_flight() -> None:
    kvbm, store = Scrapes(), Store(build_catalogue())
    totals = []
    for now, (h2d, d2h) in enumerate([(100, 10), (100, 15), (104, 19), (112, 19)]):
        kvbm.body = kvbm_page(h2d, 20, d2h)
        store.ingest("dynamo_kvbm", kvbm.collector.collect(), float(now))
        totals.append(store.value(c.KV_HIT_TOKENS, (*KEY, "G2")))
    assert totals == [90 * BT, 90 * BT, 90 * BT, 93 * BT]


def test_a_build_without_the_staging_counter_is_read_as_before() -> None:
    assert Scrapes().hits(h2d=100, d2d=20, d2h=None) == {"G2": 100 * BT, "G3": 20 * BT}


def test_a_page_with_only_the_staging_counter_has_no_g2_hits() -> None:
    assert Scrapes().hits(h2d=None, d2d=20, d2h=10) == {"G3": 30 * BT}
