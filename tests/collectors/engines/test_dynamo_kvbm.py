"""Dynamo KVBM /metrics → contract: links by full name, blocks → bytes, hits from onboarded blocks, the disk
pool placed in G3 or G4 by mount type. Expected numbers come from tests/fixtures/dynamo/make_pages.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvscope.agent.app.wiring import build_catalogue, components
from kvscope.agent.config.settings import ConfigError, load_config
from kvscope.agent.core.tiers import Tier
from kvscope.collectors.engines.dynamo_kvbm import SPEC, KvbmCollector, KvbmOptions
from kvscope.collectors.sharedfs.common import parse_mountinfo
from kvscope.collectors.sharedfs.placement import is_network_fstype, place
from testkit.engine_pages import (
    FIXTURES,
    PageServer,
    as_dict,
    assert_golden,
    exposition,
    fixture_module,
    page,
    series,
    serving,
    value,
)

PAGES = fixture_module("dynamo")
NODE = str(FIXTURES / "dynamo" / "node" / "proc")
MOUNTS = parse_mountinfo((FIXTURES / "dynamo" / "node" / "proc" / "self" / "mountinfo").read_text())
BT, BPT = PAGES.BLOCK_TOKENS, PAGES.BYTES_PER_TOKEN
MODEL = PAGES.MODEL


def kvbm(body: bytes, disk_dir: str = "/kvbm/pool", **options: Any) -> KvbmCollector:
    opts = KvbmOptions(urls=["http://kvbm/metrics"], model=MODEL, disk_cache_dir=disk_dir, **options)
    return KvbmCollector(opts, NODE, environ={}, fetch=lambda *_: body)


def base() -> tuple[str, str, str]:
    return ("dynamo", MODEL, "0")


# -- the G3/G4 decision over mount tables ----------------------------------------------------------------


@pytest.mark.parametrize(("path", "tier", "mount", "fstype"), [
    ("/kvbm/pool", "G4", "/kvbm", "gpfs"),  # a bind mount of Storage Scale's /kvcache: the seeds' case
    ("/gpfs/fs1/kv/dir", "G4", "/gpfs/fs1", "gpfs"),
    ("/mnt/nvme0/kvbm", "G3", "/mnt/nvme0", "xfs"),  # local NVMe
    ("/mnt/nvme0/stack/kvbm", "G4", "/mnt/nvme0/stack", "nfs4"),  # two mounts stacked: the last one is visible
    ("/mnt/nvme0/stacked", "G3", "/mnt/nvme0", "xfs"),  # a prefix of a mount point's name is not inside it
    ("/mnt/ceph/kv", "G4", "/mnt/ceph", "ceph"),
    ("/mnt/jfs/kv", "G4", "/mnt/jfs", "fuse.juicefs"),  # FUSE by program name
    ("/mnt/local-fuse/kv", "G3", "/mnt/local-fuse", "fuse.lxcfs"),
    ("/mnt/lustre", "G4", "/mnt/lustre", "lustre"),  # the mount point itself
    ("/mnt/kv pool/x", "G4", "/mnt/kv pool", "nfs"),  # the kernel's \040 escape
    ("/tmp", "G3", "/tmp", "tmpfs"),  # KVBM's default directory
    ("/var/lib/kvbm", "G3", "/", "ext4"),
])
def test_placement_by_mount_type(path: str, tier: str, mount: str, fstype: str) -> None:
    placed = place(path, MOUNTS)
    assert (placed.tier.value, placed.mount, placed.fstype, placed.decided_by) == (tier, mount, fstype, "mount_type")


def test_placement_config_wins_and_declares_types() -> None:
    assert place("/mnt/nvme0/kvbm", MOUNTS, "G4").decided_by == "config"
    assert place("/mnt/nvme0/kvbm", MOUNTS, "G4").tier is Tier.G4
    assert place("/mnt/nvme0/kvbm", MOUNTS, network_fstypes=["xfs"]).tier is Tier.G4
    assert place("/anything", []).decided_by == "default" and place("/anything", []).tier is Tier.G3
    assert is_network_fstype("fuse.sshfs") and not is_network_fstype("fuse.lxcfs") and not is_network_fstype("ext4")


# -- normalisation of the fixture pages --------------------------------------------------------------------


def test_seeds_g4_page_at_the_seeds_geometry() -> None:
    """gpt-oss-120b (36,864 B/token), 16-token blocks, the disk pool on Storage Scale: every reused block is a
    G4 → G1 onboard, every stored one a G1 → G4 offload (d2d: the host pool is off)."""
    r = as_dict(kvbm(page("dynamo", "kvbm-0.9.0-seeds-g4.prom"), block_tokens=BT, kv_bytes_per_token=BPT).collect())
    s, b = PAGES.SEEDS, base()
    assert value(r, "kvscope_kv_transfer_blocks_total", *b, "G4", "G1") == s["onboard_blocks_d2d"]
    assert value(r, "kvscope_kv_transfer_blocks_total", *b, "G1", "G4") == s["offload_blocks_d2d"]
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G4", "G1") == 7490 * 16 * 36_864 == 4_417_781_760
    assert value(r, "kvscope_kv_transfer_bytes_total", *b, "G1", "G4") == s["offload_blocks_d2d"] * BT * BPT
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "G4") == s["matched_tokens"] == 119_840
    assert value(r, "kvscope_connector_hit_tokens_total", *b) == s["matched_tokens"]
    assert value(r, "kvscope_engine_hit_ratio", *b, "G4", "kvbm_disk_cache_hit_rate") == 0.5
    assert ("dynamo", "kvbm_disk", "G4", "/kvbm/pool", "/kvbm", "gpfs", "mount_type") in series(
        r, "kvscope_tier_placement_info")
    assert {labels[3]: value(r, "kvscope_kv_hit_tokens_total", *labels)
            for labels in series(r, "kvscope_kv_hit_tokens_total")} == {"G2": 0.0, "G4": s["matched_tokens"]}
    assert value(r, "kvscope_kv_block_size_tokens", *b, "config") == BT


def test_host_disk_page_directions_by_full_name() -> None:
    """offload h2d is host → disk and onboard h2d host → device: the same suffix, opposite links."""
    r = as_dict(kvbm(page("dynamo", "kvbm-0.9.0-host-disk.prom"), "/mnt/nvme0/kvbm", block_tokens=BT,
                     kv_bytes_per_token=BPT).collect())
    h, b = PAGES.HOST_DISK, base()
    blocks = {labels[3:]: value(r, "kvscope_kv_transfer_blocks_total", *labels)
              for labels in series(r, "kvscope_kv_transfer_blocks_total") if value(
                  r, "kvscope_kv_transfer_blocks_total", *labels)}
    assert blocks == {("G1", "G2"): h["offload_blocks_d2h"], ("G2", "G3"): h["offload_blocks_h2d"],
                      ("G2", "G1"): h["onboard_blocks_h2d"], ("G3", "G1"): h["onboard_blocks_d2d"]}
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "G2") == h["onboard_blocks_h2d"] * BT
    assert value(r, "kvscope_kv_hit_tokens_total", *b, "G3") == h["onboard_blocks_d2d"] * BT
    hits = sum(value(r, "kvscope_kv_hit_tokens_total", *labels) for labels in series(r, "kvscope_kv_hit_tokens_total"))
    assert hits == value(r, "kvscope_connector_hit_tokens_total", *b) == h["matched_tokens"]
    assert value(r, "kvscope_engine_hit_ratio", *b, "G2", "kvbm_host_cache_hit_rate") == h["host_cache_hit_rate"]
    assert value(r, "kvscope_engine_hit_ratio", *b, "G3", "kvbm_disk_cache_hit_rate") == h["disk_cache_hit_rate"]


def test_legacy_dynamo_component_form_reads_the_same() -> None:
    """Older builds: dynamo_component_<name>{dynamo_namespace="kvbm_connector_leader"}; the worker's own
    dynamo_component_* series of another namespace are not KVBM's."""
    legacy = as_dict(kvbm(page("dynamo", "worker-legacy-kvbm.prom"), "/mnt/nvme0/kvbm", block_tokens=BT).collect())
    native = as_dict(kvbm(page("dynamo", "kvbm-0.9.0-host-disk.prom"), "/mnt/nvme0/kvbm", block_tokens=BT).collect())
    engine = {k: v for k, v in native.items() if not k[0].startswith("kvscope_scrape_")}
    assert {k: v for k, v in legacy.items() if not k[0].startswith("kvscope_scrape_")} == engine
    assert value(legacy, "kvscope_scrape_malformed_lines_total", "dynamo_kvbm", "http://kvbm/metrics") == 0


def test_without_geometry_blocks_only_then_block_size_learned_from_the_worker() -> None:
    body = page("dynamo", "kvbm-0.9.0-seeds-g4.prom")
    r = as_dict(kvbm(body).collect())
    assert series(r, "kvscope_kv_transfer_blocks_total")
    assert not series(r, "kvscope_kv_transfer_bytes_total") and not series(r, "kvscope_kv_hit_tokens_total")
    assert not series(r, "kvscope_kv_block_size_tokens")
    with serving(body, page("dynamo", "worker-0.9.0-vllm-0.14.1.prom")) as (leader, worker):
        opts = KvbmOptions(urls=[leader.url()], model=MODEL, disk_cache_dir="/kvbm/pool", geometry_url=worker.url())
        r = as_dict(KvbmCollector(opts, NODE, environ={}).collect())
    assert value(r, "kvscope_kv_block_size_tokens", *base(), worker.url()) == BT
    assert value(r, "kvscope_kv_hit_tokens_total", *base(), "G4") == PAGES.SEEDS["matched_tokens"]
    assert not series(r, "kvscope_kv_transfer_bytes_total")  # bytes per token is never on a page


def test_disk_dir_from_the_environment_then_temp_dir() -> None:
    opts = KvbmOptions(urls=["http://kvbm/metrics"])
    body = page("dynamo", "kvbm-0.9.0-seeds-g4.prom")
    env = {"DYN_KVBM_DISK_CACHE_DIR": "/gpfs/fs1/kv"}
    with_env = as_dict(KvbmCollector(opts, NODE, env, lambda *_: body).collect())
    default = as_dict(KvbmCollector(opts, NODE, {}, lambda *_: body).collect())
    assert {labels[2:4] for labels in series(with_env, "kvscope_tier_placement_info")} == {("G4", "/gpfs/fs1/kv")}
    assert {labels[2:] for labels in series(default, "kvscope_tier_placement_info")} == {
        ("G3", "/tmp", "/tmp", "tmpfs", "mount_type")}


def test_unreadable_mount_table_is_g3_by_default_until_readable(tmp_path: Path) -> None:
    opts = KvbmOptions(urls=["http://kvbm/metrics"], disk_cache_dir="/gpfs/fs1/kv", mountinfo=str(tmp_path / "m"))
    collector = KvbmCollector(opts, NODE, {}, lambda *_: page("dynamo", "kvbm-0.9.0-seeds-g4.prom"))
    first = as_dict(collector.collect())
    assert {labels[2] + labels[6] for labels in series(first, "kvscope_tier_placement_info")} == {"G3default"}
    (tmp_path / "m").write_text((FIXTURES / "dynamo" / "node" / "proc" / "self" / "mountinfo").read_text())
    second = as_dict(collector.collect())
    assert {labels[2] + labels[6] for labels in series(second, "kvscope_tier_placement_info")} == {"G4mount_type"}
    assert ("kvscope_kv_transfer_blocks_total", (*base()[:1], "", "0", "G4", "G1")) in second


# -- config, catalogue, golden exposition ----------------------------------------------------------------


def test_registered_disabled_and_needs_urls() -> None:
    assert components().collectors["dynamo_kvbm"] is SPEC and not SPEC.enabled_by_default
    with pytest.raises(ConfigError, match=r"dynamo_kvbm.*no URL"):
        load_config("[collectors.dynamo_kvbm]\nenabled = true\n", components(), environ={})
    with pytest.raises(ConfigError, match="disk_tier"):
        load_config('[collectors.dynamo_kvbm]\nenabled = true\nurls = ["http://h:6880/metrics"]\ndisk_tier = "G5"\n',
                    components(), environ={})
    with pytest.raises(ConfigError, match="absolute"):
        load_config('[collectors.dynamo_kvbm]\nenabled = true\nurls = ["http://h:6880/metrics"]\n'
                    'disk_cache_dir = "kv"\n', components(), environ={})


def test_every_reading_is_catalogued() -> None:
    catalogue = build_catalogue()
    for name in ("kvbm-0.9.0-seeds-g4.prom", "kvbm-0.9.0-host-disk.prom", "worker-legacy-kvbm.prom"):
        for (metric, labels) in as_dict(kvbm(page("dynamo", name), block_tokens=BT, kv_bytes_per_token=BPT).collect()):
            spec = catalogue.get(metric)
            assert spec is not None and len(spec.labels) == len(labels), metric


def test_golden_exposition_of_the_seeds_page() -> None:
    with PageServer({"/metrics": page("dynamo", "kvbm-0.9.0-seeds-g4.prom")}) as leader:
        opts = KvbmOptions(urls=[leader.url()], model=MODEL, disk_cache_dir="/kvbm/pool", block_tokens=BT,
                           kv_bytes_per_token=BPT)
        text = exposition({"dynamo_kvbm": SPEC}, {"dynamo_kvbm": KvbmCollector(opts, NODE, environ={})},
                          {leader.url(): "TARGET"})
    assert_golden(FIXTURES / "dynamo" / "expected-kvbm-0.9.0-seeds-g4.txt", text)
