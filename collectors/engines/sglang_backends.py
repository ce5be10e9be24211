"""SGLang HiCache storage backends (L3) as SGLang names them, and the kvscope tier each defaults to.

SGLang spells one backend two ways on its /metrics page:
- `cached_tokens_total{cache_source="storage_<X>"}`: X is the backend object's *class name*
  (`type(storage_backend).__name__` in the scheduler: `storage_HiCacheNixl`, `storage_MooncakeStore`), or
  `unknown` when a request's details carry no backend;
- `prefetched_tokens_total` / `backuped_tokens_total{storage_backend="<flag>"}`: the value of
  `--hicache-storage-backend` (`nixl`, `mooncake`), a label of the storage metrics collector.

Both are read through one table, keyed by the flag name, that knows each built-in backend's class
(sglang `python/sglang/srt/mem_cache/storage/backend_factory.py`, `StorageBackendFactory.register_backend`).
A value is matched case aside and with a `storage_` or `HiCache` prefix aside, so `storage_HiCacheNixl`,
`HiCacheNixl`, `hicachenixl` and `nixl` are one backend. Backends listed without a tier are SGLang's own
but kvscope cannot say where they keep KV (a peer GPU, shared memory, a simulator): their hits stay
`unattributed` until `storage_backend_tiers` names a tier, and the adapter says so once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvscope.collectors.engines.vllm_map import TierTable

UNATTRIBUTED = "unattributed"


@dataclass(frozen=True, slots=True)
class Backend:
    flag: str  # --hicache-storage-backend value, and the `storage_backend` label
    cls: str  # class SGLang registers for it: the `storage_<cls>` of cache_source
    tier: str  # kvscope's default tier ("" = none: unattributed unless configured)


BACKENDS = (
    Backend("file", "HiCacheFile", "G3"),  # a local directory; placed by its mount where file_storage_dir is set
    Backend("nixl", "HiCacheNixl", "G4"),  # NIXL's file/object plugins to shared storage
    Backend("mooncake", "MooncakeStore", "G4"),  # Mooncake's distributed store
    Backend("hf3fs", "HiCacheHF3FS", "G4"),  # 3FS, a distributed file system
    Backend("aibrix", "AibrixKVCacheStorage", "G4"),
    Backend("eic", "EICStorage", "G4"),
    Backend("simm", "HiCacheSiMM", ""),
    Backend("mori", "UMBPStore", ""),
    Backend("shm", "HiCacheShm", ""),
    Backend("kvcc", "KVCCStore", ""),  # peer-to-peer between workers: a peer's memory, not a tier of this pod
    Backend("sim", "SimHiCacheStorage", ""),
)
# what SGLang writes when it has no backend to name: not a backend, never warned about
PLACEHOLDERS = frozenset({"unknown", "none", ""})


def _folded(value: str) -> str:
    return value.lower().replace("-", "").replace("_", "")


_BY_NAME: dict[str, str] = {}
for _b in BACKENDS:
    _BY_NAME[_folded(_b.flag)] = _b.flag
    _BY_NAME[_folded(_b.cls)] = _b.flag


def backend_key(value: str) -> str:
    """The backend a `cache_source` or `storage_backend` value names: its flag name where SGLang's table has
    it, else the value lower-cased with its `storage_` prefix removed (an unknown backend keeps its name)."""
    name = value[len("storage_"):] if value.lower().startswith("storage_") else value
    folded = _folded(name)
    for candidate in (folded, folded.removeprefix("hicache")):
        if candidate in _BY_NAME:
            return _BY_NAME[candidate]
    return name.lower()


DEFAULT_BACKEND_TIERS: dict[str, str] = {b.flag: b.tier or UNATTRIBUTED for b in BACKENDS}
UNTIERED = frozenset(b.flag for b in BACKENDS if not b.tier)


def backend_tiers(configured: Mapping[str, str], file_tier: str) -> TierTable:
    """Backend (flag name, backend_key) → tier: the defaults, `file` at `file_tier`, then the configured entries."""
    return TierTable({**DEFAULT_BACKEND_TIERS, "file": file_tier, **{backend_key(k): v for k, v in configured.items()}})


def untiered_reason(backend: str) -> str:
    """Why a backend has no tier, for the warning that says so."""
    return ("an SGLang backend whose place kvscope cannot tell" if backend in UNTIERED
            else "a backend kvscope's table does not know")
