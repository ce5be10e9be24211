"""RDMA ports (InfiniBand, RoCE): data bytes and packets per device and port, from sysfs.

Reads `/sys/class/infiniband/<device>/ports/<port>/counters/port_{rcv,xmit}_{data,packets}` and the
port's `link_layer` (hardware.md §2.3). The data counters count octets divided by 4 (lanes), so
bytes = value x 4, as node_exporter and procfs do. On ConnectX (mlx5) the files carry the 64-bit
PortCountersExtended values; HCAs without the extended set give 32-bit values that saturate at
0xFFFFFFFF rather than wrap (logged once when seen). This is where RoCE, GPUDirect RDMA, NIXL/UCX
and NVMe-oF/RDMA traffic shows up; the netdev counters in `kvscope.collectors.host.network` never see it.

No /sys/class/infiniband (no RDMA hardware or driver) is no data, not an error. Each counter file
read is a firmware query on mlx5, so only these four files per port are read, once per cycle.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kvscope.agent.core.catalogue import counter, gauge
from kvscope.agent.core.pipeline import CollectorContext, CollectorSpec
from kvscope.agent.core.readings import Reading, Sample
from kvscope.collectors.host.inputs import INPUT_ERRORS, InputErrors, NameFilter, check_patterns, parse_u64, read_text

log = logging.getLogger("kvscope.collectors.rdma")

LANES = 4  # port_{rcv,xmit}_data count octets / 4
SATURATED_32 = 0xFFFFFFFF
SOURCE = "/sys/class/infiniband/*/ports/*/counters"
LABELS = ("device", "port")

METRICS = (
    counter("kvscope_rdma_receive_bytes_total", "bytes", LABELS,
            "Data bytes received on the RDMA port (port_rcv_data x 4).", SOURCE),
    counter("kvscope_rdma_transmit_bytes_total", "bytes", LABELS,
            "Data bytes transmitted on the RDMA port (port_xmit_data x 4).", SOURCE),
    counter("kvscope_rdma_receive_packets_total", "", LABELS, "Packets received on the RDMA port.", SOURCE),
    counter("kvscope_rdma_transmit_packets_total", "", LABELS, "Packets transmitted on the RDMA port.", SOURCE),
    gauge("kvscope_rdma_port_info", "", ("device", "port", "link_layer"),
          "Always 1; the port's link layer (InfiniBand, or Ethernet for RoCE) as a label.",
          "/sys/class/infiniband/*/ports/*/link_layer"),
    INPUT_ERRORS,
)

# (counter file, metric, multiplier)
DATA_COUNTERS = (
    ("port_rcv_data", "kvscope_rdma_receive_bytes_total", LANES),
    ("port_xmit_data", "kvscope_rdma_transmit_bytes_total", LANES),
)
PACKET_COUNTERS = (
    ("port_rcv_packets", "kvscope_rdma_receive_packets_total", 1),
    ("port_xmit_packets", "kvscope_rdma_transmit_packets_total", 1),
)


@dataclass
class PortReadings:
    readings: list[Reading] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)  # counter files whose text is not an unsigned 64-bit integer
    saturated: list[str] = field(default_factory=list)  # 32-bit data counters stuck at their maximum


def port_readings(device: str, port: str, link_layer: str | None, counters: Mapping[str, str]) -> PortReadings:
    """Readings for one port from the text of its `link_layer` and counter files (absent ones are skipped)."""
    out = PortReadings()
    labels = (device, port)
    if link_layer is not None and link_layer.strip():
        out.readings.append(Sample("kvscope_rdma_port_info", (device, port, link_layer.strip()), 1.0))
    for filename, metric, scale in (*DATA_COUNTERS, *PACKET_COUNTERS):
        text = counters.get(filename)
        if text is None:
            continue
        value = parse_u64(text.strip())
        if value is None:
            out.malformed.append(filename)
            continue
        if scale == LANES and value == SATURATED_32:
            out.saturated.append(filename)
        out.readings.append(Sample(metric, labels, float(value * scale)))
    return out


@dataclass
class RdmaOptions:
    include: list[str] = field(default_factory=list)  # device globs, or regexes after "re:"; [] = all
    exclude: list[str] = field(default_factory=list)  # wins over include
    packets: bool = True  # two more firmware queries per port and cycle

    def validate(self, path: str) -> None:
        check_patterns("include", self.include)
        check_patterns("exclude", self.exclude)


class RdmaCollector:
    def __init__(self, options: RdmaOptions, sys_root: str) -> None:
        self._root = os.path.join(sys_root, "class", "infiniband")
        self._wanted: Callable[[str], bool] = NameFilter(options.include, options.exclude)
        self._files = tuple(f for f, _, _ in (*DATA_COUNTERS, *(PACKET_COUNTERS if options.packets else ())))
        self._errors = InputErrors("rdma", log)
        self._saturated: set[tuple[str, str, str]] = set()

    def _read(self, path: str, what: str) -> str | None:
        try:
            return read_text(path)
        except FileNotFoundError:
            return None  # the driver does not offer it, or the device left mid-cycle
        except OSError as exc:
            self._errors.note(what, f"cannot read {path}: {exc}")
            return None

    def collect(self) -> list[Reading]:
        try:
            devices = sorted(os.listdir(self._root))
        except FileNotFoundError:
            return [self._errors.sample()]  # no RDMA stack on this host: no data, not an error
        out: list[Reading] = []
        for device in devices:
            if not self._wanted(device):
                continue
            ports_dir = os.path.join(self._root, device, "ports")
            try:
                ports = sorted(os.listdir(ports_dir), key=lambda p: (len(p), p))
            except OSError:
                continue  # the device went away between the listings
            for port in ports:
                out.extend(self._port(device, port, os.path.join(ports_dir, port)))
        out.append(self._errors.sample())
        return out

    def _port(self, device: str, port: str, port_dir: str) -> list[Reading]:
        link_layer = self._read(os.path.join(port_dir, "link_layer"), "link_layer")
        counters: dict[str, str] = {}
        for filename in self._files:
            text = self._read(os.path.join(port_dir, "counters", filename), filename)
            if text is not None:
                counters[filename] = text
        result = port_readings(device, port, link_layer, counters)
        for filename in result.malformed:
            self._errors.note(f"malformed:{filename}", f"{device} port {port}: {filename} is not an integer")
        for filename in result.saturated:
            key = (device, port, filename)
            if key not in self._saturated:
                self._saturated.add(key)
                log.warning("rdma: %s port %s %s is stuck at 0xFFFFFFFF: a 32-bit counter that saturated "
                            "(the HCA lacks extended port counters); its bytes stop counting", device, port, filename)
        return result.readings


def build(options: RdmaOptions, context: CollectorContext) -> RdmaCollector:
    return RdmaCollector(options, context.sys_root)


SPEC = CollectorSpec(
    name="rdma",
    description="RDMA ports (InfiniBand/RoCE): data bytes and packets (/sys/class/infiniband)",
    options=RdmaOptions,
    factory=build,
    metrics=METRICS,
    roots=("sys",),
    on_read=True,
)
