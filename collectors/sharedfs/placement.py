"""Which tier a storage pool on a file system is: G3 (local disk) or G4 (shared network storage).

An engine's "disk" pool (Dynamo KVBM's `DYN_KVBM_DISK_CACHE_DIR`, a file backend's directory) is G3 when the
directory sits on a local file system and G4 when it sits on a network or parallel one — the seeds' system
put KVBM's disk pool on IBM Storage Scale, so its "disk" blocks are G4 blocks. The decision is made from
the type of the mount holding the directory, read from a mount table (`<proc_root>/self/mountinfo`), and
can be overridden in config. `place` is a pure function of the mount table; `place_from` reads it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from kvscope.agent.core import contract as c
from kvscope.agent.core.readings import Sample
from kvscope.agent.core.tiers import Tier
from kvscope.collectors.host.inputs import read_text
from kvscope.collectors.sharedfs.common import MountEntry, parse_mountinfo, under_root

log = logging.getLogger("kvscope.collectors.placement")

# Network and parallel file systems: a pool on one of these is shared storage (G4).
NETWORK_FSTYPES = frozenset({
    "gpfs",  # IBM Storage Scale
    "nfs", "nfs4", "lustre", "ceph", "cephfs", "glusterfs", "beegfs", "wekafs", "cifs", "smb3", "smbfs", "afs",
    "gfs2", "ocfs2", "orangefs", "pvfs2", "panfs", "quobyte", "juicefs",
})
# FUSE file systems are named fuse.<program>; these programs mount network or object storage.
NETWORK_FUSE = frozenset({
    "sshfs", "glusterfs", "ceph-fuse", "cephfs", "s3fs", "gcsfuse", "goofys", "rclone", "juicefs",
    "mountpoint-s3", "blobfuse", "blobfuse2", "lizardfs", "mfs", "moosefs", "alluxio-fuse", "weka", "davfs",
    "objectivefs", "seaweedfs", "geesefs",
})


@dataclass(frozen=True, slots=True)
class Placement:
    tier: Tier
    path: str
    mount: str  # mount point holding the path ("" when not found)
    fstype: str
    decided_by: str  # "mount_type", "config" or "default"


def is_network_fstype(fstype: str, extra: Iterable[str] = ()) -> bool:
    """True for a network or parallel file system type; `extra` adds types the operator declares network."""
    if fstype in NETWORK_FSTYPES or fstype in set(extra):
        return True
    kind, _, program = fstype.partition(".")
    return kind in ("fuse", "fuseblk") and program in NETWORK_FUSE


def mount_of(path: str, mounts: Iterable[MountEntry]) -> MountEntry | None:
    """The mount holding `path` (an absolute, normalised path): the longest mount point that is a prefix of it
    on a path-component boundary; of mounts stacked on one point, the last in the table (the visible one)."""
    best: MountEntry | None = None
    for entry in mounts:
        point = entry.mount_point.rstrip("/") or "/"
        inside = path == point or point == "/" or path.startswith(point + "/")
        if inside and (best is None or len(point) >= len(best.mount_point.rstrip("/") or "/")):
            best = entry
    return best


def place(path: str, mounts: Iterable[MountEntry], override: str = "auto",
          network_fstypes: Iterable[str] = ()) -> Placement:
    """G3 or G4 for a pool directory. `override` G3/G4 wins; "auto" decides by the mount's type; a path no
    mount table entry holds (the table could not be read) is G3, the pool's own name for itself."""
    entry = mount_of(path, mounts)
    mount, fstype = (entry.mount_point, entry.fstype) if entry else ("", "")
    if override != "auto":
        return Placement(Tier(override), path, mount, fstype, "config")
    if entry is None:
        return Placement(Tier.G3, path, "", "", "default")
    tier = Tier.G4 if is_network_fstype(fstype, network_fstypes) else Tier.G3
    return Placement(tier, path, mount, fstype, "mount_type")


def place_from(path: str, mountinfo: str, override: str = "auto",
               network_fstypes: Iterable[str] = ()) -> tuple[Placement, OSError | None]:
    """`place` over the mount table at `mountinfo` (not read when config decides); an unreadable table is the
    default placement, with the error for the caller to report."""
    if override != "auto":
        return place(path, [], override), None
    try:
        return place(path, parse_mountinfo(read_text(mountinfo)), override, network_fstypes), None
    except OSError as exc:
        return place(path, []), exc


def placement_info(engine: str, pool: str, p: Placement) -> Sample:
    return Sample(c.TIER_PLACEMENT_INFO, (engine, pool, p.tier.value, p.path, p.mount, p.fstype, p.decided_by), 1.0)


def place_pool(path: str, proc_root: str, mountinfo: str) -> Placement | None:
    """Where a pool directory from config sits (None when none is configured), decided once by mount type; an
    unreadable mount table is logged and the pool taken as G3."""
    if not path:
        return None
    table = under_root(proc_root, mountinfo)
    placement, error = place_from(os.path.normpath(path), table)
    if error is not None:
        log.warning("cannot read the mount table %s (%s): %s is taken as G3", table, error, path)
    return placement
