"""G1 lookups and hits per tenant (vLLM's LoRA adapter, `lora_name` on BlockStored) from the KV events.

With `kv_cache_report_mode=full` vLLM announces every full block a request uses as a BlockStored: the
blocks it reuses from G1 again, the others once they are computed or loaded. So per tenant, a GPU store of
a block already resident in G1 is a G1 hit and every GPU store is a block looked up; G1's served share per
tenant is hits / lookups, in blocks (a prompt's last, partial block is never announced). Without it vLLM
announces only new blocks: the lookups are then the misses and the hits stay 0. Requests without an
adapter have `lora_name` nil: tenant `base`.

The tenants go through a TenantCap (kvscope.agent.core.tenants): the top N by lookups have series of their
own, the rest share `other`.

Decoding: in tenant mode the subscriber decodes every batch with TenantBatchDecoder, which reads
`lora_name` as well (map form, vLLM >= 0.24, and array form from 0.20 on, where it is the eighth field);
batches it cannot read fall back to BatchDecoder and count for `base`. It skips BatchDecoder's fast path
for batches of GPU stores only, so tenant mode costs the subscriber more per event (docs/vllm-kv-events.md).
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from kvscope.agent.core.catalogue import counter, gauge
from kvscope.agent.core.contract import ENGINE_LABELS
from kvscope.agent.core.readings import Reading, Sample
from kvscope.agent.core.tenants import OTHER, TenantCap
from kvscope.agent.core.tiers import Tier
from kvscope.collectors.kv_events.residency import TierState, tier_of
from kvscope.collectors.kv_events.schema import (
    CLEARED,
    STORED,
    BatchDecoder,
    ClearedEvent,
    DecodedBatch,
    LegacyClearedEvent,
    LegacyRemovedEventAnyMedium,
    LegacyStoredEventAnyMedium,
    RemovedEventAnyMedium,
    StoredEventAnyMedium,
    _Batch,
)

BASE_TENANT = "base"  # requests without a LoRA adapter
LOOKUPS, HITS = "lookups", "hits"
MAX_TENANT_CHARS = 128  # a longer name counts for `other`: a label value is no place for a document


class TenantStoredEvent(StoredEventAnyMedium, tag="BlockStored"):
    lora_name: str | None = None


class TenantLegacyStoredEvent(LegacyStoredEventAnyMedium, tag="BlockStored"):
    lora_name: str | None = None  # vLLM >= 0.20: the eighth field


class TenantMapBatch(_Batch):
    events: list[TenantStoredEvent | RemovedEventAnyMedium | ClearedEvent]


class TenantLegacyBatch(_Batch):
    wire_format: ClassVar[str] = "array"
    events: list[TenantLegacyStoredEvent | LegacyRemovedEventAnyMedium | LegacyClearedEvent]


class TenantBatchDecoder(BatchDecoder):
    def __init__(self) -> None:
        super().__init__()
        self._tenant = (msgspec.msgpack.Decoder(TenantMapBatch).decode,
                        msgspec.msgpack.Decoder(TenantLegacyBatch).decode)

    def _decode(self, payload: bytes | memoryview) -> DecodedBatch:
        for decode in self._tenant:
            try:
                return decode(payload)
            except msgspec.DecodeError:
                continue
        return super()._decode(payload)


def tenant_of(event: Any) -> str:
    name = getattr(event, "lora_name", None)
    if name is None:
        return BASE_TENANT
    return name if 0 < len(name) <= MAX_TENANT_CHARS else ""


class TenantAccounting:
    """Counts one batch's G1 stores per tenant before residency applies it (Residency.tenants)."""

    def __init__(self, cap: TenantCap, medium_when_absent: str | None = None) -> None:
        self.cap = cap
        self._medium_when_absent = medium_when_absent  # as Residency's (the default_medium option)
        self.odd_names = 0  # stores whose lora_name was empty or too long: counted for `other`

    def account(self, g1: TierState | None, events: list[Any]) -> None:
        absent = self._medium_when_absent
        in_g1 = [tier_of(e.medium if e.medium is not None else absent, e.locality) is Tier.G1 for e in events]
        asked = [h for e, g in zip(events, in_g1, strict=True) if g and e.KIND == STORED for h in e.block_hashes]
        if not asked:
            return
        resident = dict(zip(asked, g1.resident.contains_many(asked), strict=True)) if g1 is not None else \
            dict.fromkeys(asked, False)
        added: set[Any] = set()  # G1 blocks this batch made resident
        dropped: set[Any] = set()  # and removed
        cleared = False
        counts: dict[str, list[int]] = {}  # tenant -> [lookups, hits] in this batch
        for e, g in zip(events, in_g1, strict=True):
            kind = e.KIND
            if kind == CLEARED:
                cleared, added, dropped = True, set(), set()
                continue
            if not g:
                continue
            hashes = e.block_hashes
            if kind != STORED:
                dropped.update(hashes)
                added.difference_update(hashes)
                continue
            if cleared or dropped:
                hits = sum(1 for h in hashes if h in added or (not cleared and h not in dropped and resident[h]))
                dropped.difference_update(hashes)
            else:
                hits = sum(1 for h in hashes if h in added or resident[h])
            added.update(hashes)
            tenant = tenant_of(e)
            if not tenant:
                self.odd_names += 1
                tenant = OTHER
            tally = counts.setdefault(tenant, [0, 0])
            tally[0] += len(hashes)
            tally[1] += hits
        for tenant, (lookups, hits) in counts.items():
            self.cap.add(tenant, lookups, {LOOKUPS: lookups, HITS: hits})


TENANT_LOOKUP_BLOCKS = "kvscope_tenant_kv_lookup_blocks_total"
TENANT_HIT_BLOCKS = "kvscope_tenant_kv_hit_blocks_total"
TENANTS_FOLDED = "kvscope_tenants_folded"
TENANTS_FORGOTTEN = "kvscope_tenants_forgotten_total"
TENANT_ODD_NAMES = "kvscope_tenant_odd_name_events_total"
TENANT_UNRANKED_BLOCKS = "kvscope_tenant_unranked_lookup_blocks_total"
_SRC = "vLLM KV events (lora_name)"
_CAP_SRC = "tenant cap (top N and other; vLLM lora_name, LMCache cache_salt)"
TENANT_METRICS = (
    counter(TENANT_LOOKUP_BLOCKS, "blocks", (*ENGINE_LABELS, "tenant"),
            "Full G1 blocks a tenant's requests used (every GPU BlockStored, kv_cache_report_mode=full): the "
            "top tenants_top_n tenants by recent lookups each, the rest as tenant=\"other\".", _SRC),
    counter(TENANT_HIT_BLOCKS, "blocks", (*ENGINE_LABELS, "tenant", "tier"),
            "Of those, blocks already resident in the tier (re-announced reuses): the tenant's hits. Served "
            "share = hits / lookups.", _SRC),
    gauge(TENANTS_FOLDED, "", ENGINE_LABELS,
          "Tenants remembered whose traffic counts for tenant=\"other\" (not in the top tenants_top_n).", _CAP_SRC),
    counter(TENANTS_FORGOTTEN, "", ENGINE_LABELS,
            "Tenants dropped from memory at a collection to stay within tenants_max_tracked (the least busy).",
            _CAP_SRC),
    counter(TENANT_UNRANKED_BLOCKS, "blocks", ENGINE_LABELS,
            "Lookups of tenants not taken in between two collections, for want of room (more than "
            "tenants_max_tracked new names): counted for tenant=\"other\".", _SRC),
    counter(TENANT_ODD_NAMES, "events", ENGINE_LABELS,
            f"BlockStored events whose lora_name was empty or longer than {MAX_TENANT_CHARS} characters: counted "
            "for tenant=\"other\".", _SRC),
)


def tenant_readings(accounting: TenantAccounting, labels: tuple[str, ...]) -> list[Reading]:
    """Ranks the tenants (once per collection) and reports the shown ones, `other` and the cap's counts."""
    cap = accounting.cap
    cap.rank()
    out: list[Reading] = []
    for tenant, totals in cap.shown():
        out.append(Sample(TENANT_LOOKUP_BLOCKS, (*labels, tenant), totals.get(LOOKUPS, 0.0)))
        out.append(Sample(TENANT_HIT_BLOCKS, (*labels, tenant, Tier.G1.value), totals.get(HITS, 0.0)))
    out.append(Sample(TENANTS_FOLDED, labels, cap.folded))
    out.append(Sample(TENANTS_FORGOTTEN, labels, cap.forgotten))
    out.append(Sample(TENANT_UNRANKED_BLOCKS, labels, cap.unranked))
    out.append(Sample(TENANT_ODD_NAMES, labels, accounting.odd_names))
    return out
