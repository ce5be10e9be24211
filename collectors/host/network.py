"""Network interfaces: bytes, packets, errors and drops per interface, from /proc/net/dev.

/proc/net/dev is the kernel's `rtnl_link_stats64` for every interface of the reading process's
network namespace, one read for all of them (hardware.md §2.1). It is parsed here rather than by
`psutil.net_io_counters` for the same reason as in `kvscope.collectors.host.disk`: psutil takes its proc root from
a process-wide global, and the agent's roots are injected. Only kernel-path traffic is visible: RDMA
(RoCE, GPUDirect) bypasses the netdev counters and is reported by `kvscope.collectors.host.rdma`.

In a pod, /proc/net/dev shows the pod's interfaces. `path` (relative to the proc root) selects
another namespace, e.g. `1/net/dev` with the host's /proc mounted and hostPID.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from kvscope.agent.core.catalogue import MetricSpec, counter
from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.readings import Reading, Sample
from kvscope.collectors.host.inputs import INPUT_ERRORS, InputErrors, KernelFile, NameFilter, check_patterns, parse_u64s

log = logging.getLogger("kvscope.collectors.network")

# Loopback and the host ends of container/bridge plumbing: their bytes are counted again on the
# physical interface (or never leave the host), so they would double the node's traffic.
DEFAULT_EXCLUDE = ("lo", "veth*", "docker*", "br-*", "cni*", "flannel*", "cali*", "virbr*")
SOURCE = "/proc/net/dev"


def _pair(what: str, unit: str, help_what: str) -> tuple[MetricSpec, MetricSpec]:
    suffix = f"_{what}_total"
    return (
        counter(f"kvscope_network_receive{suffix}", unit, ("interface",), f"{help_what} received.", SOURCE),
        counter(f"kvscope_network_transmit{suffix}", unit, ("interface",), f"{help_what} transmitted.", SOURCE),
    )


METRICS = (
    *_pair("bytes", "bytes", "Bytes"),
    *_pair("packets", "", "Packets"),
    *_pair("errors", "", "Packets with errors (driver-defined)"),
    *_pair("drops", "", "Packets dropped by the kernel or driver, of those"),
    INPUT_ERRORS,
)


class NetCounters(NamedTuple):
    receive_bytes: int
    receive_packets: int
    receive_errors: int
    receive_drops: int
    transmit_bytes: int
    transmit_packets: int
    transmit_errors: int
    transmit_drops: int


def parse_net_dev(text: str, keep: Callable[[str], bool] | None = None) -> tuple[dict[str, NetCounters], int]:
    """Counters per interface, and the number of malformed lines; with `keep`, the numbers of an interface it
    rejects (loopback, container plumbing) are neither read nor checked.

    After two header lines each line is `name: ` and 16 columns: 8 receive (bytes packets errs drop
    fifo frame compressed multicast), then 8 transmit (bytes packets errs drop fifo colls carrier
    compressed). Interface names cannot contain ':' (dev_valid_name), so the first ':' ends the name.
    """
    out: dict[str, NetCounters] = {}
    bad = 0
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        if not sep:
            if line.strip():
                bad += 1
            continue
        if keep is not None and not keep(name.strip()):
            continue
        f = rest.split()
        if len(f) < 16:
            bad += 1
            continue
        values = parse_u64s(f[i] for i in (0, 1, 2, 3, 8, 9, 10, 11))
        if values is None:  # a sign, a digit that is not ASCII, more than 64 bits: not a kernel counter
            bad += 1
            continue
        out[name.strip()] = NetCounters(*values)
    return out, bad


_METRIC_NAMES = tuple(
    f"kvscope_network_{direction}_{what}_total"
    for direction in ("receive", "transmit")
    for what in ("bytes", "packets", "errors", "drops")
)


@dataclass
class NetworkOptions:
    include: list[str] = field(default_factory=list)  # globs, or regexes after "re:"; [] = every interface
    exclude: list[str] = field(default_factory=lambda: list(DEFAULT_EXCLUDE))  # wins over include
    path: str = "net/dev"  # relative to the proc root

    def validate(self, path: str) -> None:
        check_patterns("include", self.include)
        check_patterns("exclude", self.exclude)
        if not self.path or os.path.isabs(self.path):
            raise ValueError(f"path: must be relative to agent.proc_root, got {self.path!r}")


class NetworkCollector:
    def __init__(self, options: NetworkOptions, proc_root: str) -> None:
        self._path = os.path.join(proc_root, options.path)
        self._file = KernelFile(self._path)
        self._wanted: Callable[[str], bool] = NameFilter(options.include, options.exclude)
        self._errors = InputErrors("network", log)

    def collect(self) -> list[Reading]:
        counters, bad = parse_net_dev(self._file.read(), self._wanted)  # unreadable: the run fails, visibly
        if bad:
            self._errors.note("net/dev", f"{bad} malformed line(s) in {self._path}", bad)
        out: list[Reading] = []
        for name, values in counters.items():
            labels = (name,)
            out.extend(Sample(metric, labels, float(v)) for metric, v in zip(_METRIC_NAMES, values, strict=True))
        out.append(self._errors.sample())
        return out


def build(options: NetworkOptions, context: CollectorContext) -> NetworkCollector:
    return NetworkCollector(options, context.proc_root)


SPEC = CollectorSpec(
    name="network",
    description="Network interfaces: bytes, packets, errors and drops (/proc/net/dev)",
    options=NetworkOptions,
    factory=build,
    metrics=METRICS,
    roots=("proc",),
    on_read=True,
)
