"""Dynamo KVBM's /metrics → kvscope contract: the name table (data), one row per KVBM family.

Facts: shared/facts/engines.md §1.2 and its Dynamo 0.9.0 appendix; help texts and the object-storage byte
counters from Dynamo's `lib/llm/src/block_manager/metrics_kvbm.rs`. KVBM counts *blocks* and its counters
have no `_total` suffix (Rust `prometheus` crate). Directions are mapped by the full name, never by the
suffix: offload `h2d` is host→disk, onboard `h2d` is host→device, `d2d` is device↔disk, `o` is object
storage. "disk" is KVBM's one disk pool, placed in G3 or G4 at run time (collectors/sharedfs/placement.py).

- Transfers: blocks per link as KVBM counts them (`kvscope_kv_transfer_blocks_total`), and bytes = blocks
  × block_tokens × kv_bytes_per_token when the geometry is known. For object storage the engine's own
  byte counters (`offload_bytes_object`, `onboard_bytes_object`, newer builds) are used where present.
- Hits per tier: an onboarded block is a block KVBM found in that tier and brought to the GPU, so
  onboard `h2d` blocks × block_tokens are G2 hits, `d2d` disk hits, `o2d` object (G4) hits. G1 hits
  are vLLM's own prefix cache (the vLLM adapter). `matched_tokens` is KVBM's total over its tiers. Newer
  builds' `onboard_blocks_d2h` (disk hits staged on host memory, then counted again by `h2d`) are disk
  hits and come off G2's (collectors/engines/kvbm_staging.py).
- The sliding-window hit-rate gauges are exported as what they are (`kvscope_engine_hit_ratio`).
- Older builds emitted the same names as `dynamo_component_<name>{dynamo_namespace="kvbm_connector_leader"}`
  on the worker's system port; both forms are read.
"""

from __future__ import annotations

from kvscope.agent.core import contract as c
from kvscope.collectors.engines.contract_map import Dialect, Rule
from kvscope.collectors.scrape.exposition import Labels

PREFIX = "kvbm_"
LEGACY_PREFIX = "dynamo_component_"
LEGACY_NAMESPACE = "kvbm_connector_leader"
DISK = "disk"  # KVBM's disk pool: G3 or G4, decided per deployment

# full KVBM name → the link its blocks move along
LINKS: dict[str, tuple[str, str]] = {
    "offload_blocks_d2h": ("G1", "G2"),  # device → host
    "offload_blocks_h2d": ("G2", DISK),  # host → disk (not host → device)
    "offload_blocks_d2d": ("G1", DISK),  # device → disk, bypassing host memory
    "offload_blocks_d2o": ("G1", "G4"),  # device → object storage
    "onboard_blocks_h2d": ("G2", "G1"),  # host → device
    "onboard_blocks_d2d": (DISK, "G1"),  # disk → device (GDS possible)
    "onboard_blocks_o2d": ("G4", "G1"),  # object storage → device
    "onboard_blocks_d2h": (DISK, "G2"),  # disk → host staging (newer builds only, unsure)
}
# onboarded blocks are hits of the tier they came from
HIT_TIERS: dict[str, str] = {"onboard_blocks_h2d": "G2", "onboard_blocks_d2d": DISK, "onboard_blocks_o2d": "G4"}
# newer builds stage a disk hit on host memory before promoting it to the GPU: the staged block is a disk hit,
# and onboard_blocks_h2d counts it again when it is promoted, so it comes off G2's hits (kvbm_staging.py holds
# that difference monotone while a staged block waits for its promotion)
STAGED = "onboard_blocks_d2h"
HIT_RATES: dict[str, str] = {"host_cache_hit_rate": "G2", "disk_cache_hit_rate": DISK,
                             "object_cache_hit_rate": "G4"}
OBJECT_BYTES: dict[str, str] = {"offload_bytes_object": "offload_blocks_d2o",
                                "onboard_bytes_object": "onboard_blocks_o2d"}
FAILURES: dict[str, tuple[str, str]] = {"object_read_failures": ("G4", "G1"), "object_write_failures": ("G1", "G4")}


def dialect(disk_tier: str) -> Dialect:
    """The KVBM table with its disk pool placed in `disk_tier` (G3 or G4)."""
    def tier(t: str) -> str:
        return disk_tier if t == DISK else t

    counters: list[Rule] = []
    for name, (src, dst) in LINKS.items():
        link = (tier(src), tier(dst))
        counters.append(Rule(name, c.KV_TRANSFER_BLOCKS, link))
        group = next((f"object:{b}" for b, blocks in OBJECT_BYTES.items() if blocks == name), "")
        counters.append(Rule(name, c.KV_TRANSFER_BYTES, link, unit="block_bytes", group=group, rank=1))
    for name, blocks in OBJECT_BYTES.items():
        counters.append(Rule(name, c.KV_TRANSFER_BYTES, tuple(tier(t) for t in LINKS[blocks]),
                             group=f"object:{name}", rank=0))
    counters.extend(Rule(name, c.KV_HIT_TOKENS, (tier(t),), unit="block_tokens") for name, t in HIT_TIERS.items())
    counters.append(Rule(STAGED, c.KV_HIT_TOKENS, (disk_tier,), unit="block_tokens"))
    counters.append(Rule(STAGED, c.KV_HIT_TOKENS, ("G2",), unit="staged_block_tokens"))
    counters.append(Rule("matched_tokens", c.CONNECTOR_HIT_TOKENS))
    counters.extend(Rule(name, c.KV_TRANSFER_FAILED_BLOCKS, link) for name, link in FAILURES.items())
    gauges = tuple(Rule(name, c.ENGINE_HIT_RATIO, (tier(t), PREFIX + name)) for name, t in HIT_RATES.items())
    return Dialect((PREFIX, LEGACY_PREFIX), tuple(counters), gauges)


class KvbmLabels:
    """KVBM's native series carry no labels: the model comes from config, dp_rank is "0". Legacy
    `dynamo_component_*` series are KVBM's only in the `kvbm_connector_leader` namespace."""

    def __init__(self, model: str) -> None:
        self._base = (model, "0", "0")

    def __call__(self, labels: Labels) -> tuple[str, str, str] | None:
        namespace = labels.get("dynamo_namespace")
        if namespace is not None and namespace != LEGACY_NAMESPACE:
            return None
        return self._base
