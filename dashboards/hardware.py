"""Hardware path: the devices KV blocks cross — NVMe, NICs and RDMA ports, the shared-FS client, the GPU."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from kvscope.dashboards.panels import HOST, SCOPE, TIER, Query, build_dashboard, timeseries_panel
from kvscope.dashboards.thresholds import RAISED, above

UID = "kvscope-hardware"

# The nodes the selected pods run on: kvscope's monitors put `node` on the sidecars' and the node agents'
# series alike, so a node agent's host series are kept where a selected agent runs on the same node.
# Series without `node` (one agent per host, the compose demo) are filtered by the variables directly.
NODES = f"kvscope_build_info{{{HOST}}}"
OWNED_GPU = "GPU {{gpu}} {{namespace}}/{{pod}} ({{instance}})"


def _rate(metric: str, by: str, extra: str = "") -> str:
    """Per second over the nodes of the selected pods, by the agent (the node, for a node agent) and `by`."""
    return (f"sum by (instance, {by}) ("
            f'rate({metric}{{cluster=~"$cluster", node!=""{extra}}}[$__rate_interval]) and on(cluster, node) {NODES}'
            f' or rate({metric}{{{HOST}, node=""{extra}}}[$__rate_interval]))')


def _gpu(rule: str) -> str:
    """A GPU recording rule of the selected pods: the rules put the owning pod's namespace and pod on each GPU
    (kvscope_gpu_pod_info), so $namespace is the owner's and $instance matches the owner's pod name (the
    sidecar's instance); a GPU no pod was given shows under the agent that reads it."""
    return f'{rule}{{{SCOPE}, pod=~"$instance"}} or {rule}{{{HOST}}}'


def build() -> Dashboard:
    storage = [
        timeseries_panel("Block devices: read up, written down", (
            "Bytes per second read from (above zero) and written to (below zero) each whole block device, "
            "NVMe included, from /proc/diskstats (sectors × 512; NVMe multipath paths are folded into their "
            "namespace). G3 lives on a local NVMe; a G4 on NVMe-oF shows here too "
            "(kvscope_disk_read_bytes_total, kvscope_disk_written_bytes_total)."), "Bps",
            [Query(_rate("kvscope_disk_read_bytes_total", "device"), "{{device}} read {{instance}}"),
             Query(_rate("kvscope_disk_written_bytes_total", "device"), "{{device}} written {{instance}}")],
            negative=[1]),
        timeseries_panel("Block device time busy", (
            "Share of wall time each device had at least one request in flight (io_ticks from "
            "/proc/diskstats, kvscope_disk_io_time_seconds_total). Near 100 % is saturation for a disk that "
            "serves one request at a time; an NVMe serves many at once, so read it as a hint only."),
            "percentunit", [Query(_rate("kvscope_disk_io_time_seconds_total", "device"), "{{device}} {{instance}}")],
            percent_max=True),
        timeseries_panel("Shared-filesystem client: read up, written down", (
            "Bytes per second applications on the node read and wrote through the shared-filesystem client "
            "(NFS mountstats, Lustre llite stats, IBM Storage Scale mmpmon): the G4 path when G4 is a parallel "
            "file system (kvscope_fs_read_bytes_total, kvscope_fs_written_bytes_total; cache hits included)."),
            "Bps",
            [Query(_rate("kvscope_fs_read_bytes_total", "mount, fstype"), "{{mount}} ({{fstype}}) read {{instance}}"),
             Query(_rate("kvscope_fs_written_bytes_total", "mount, fstype"),
                   "{{mount}} ({{fstype}}) written {{instance}}")],
            negative=[1], span=24),
    ]
    network = [
        timeseries_panel("NIC traffic per interface: received up, sent down", (
            "Bytes per second through each network interface's kernel path, loopback left out "
            "(/proc/net/dev; kvscope_network_receive_bytes_total, kvscope_network_transmit_bytes_total). "
            "RDMA traffic bypasses these counters: see the RDMA panel."), "Bps",
            [Query(_rate("kvscope_network_receive_bytes_total", "interface", ', interface!="lo"'),
                   "{{interface}} in {{instance}}"),
             Query(_rate("kvscope_network_transmit_bytes_total", "interface", ', interface!="lo"'),
                   "{{interface}} out {{instance}}")], negative=[1]),
        timeseries_panel("RDMA traffic per port: received up, sent down", (
            "Data bytes per second on each InfiniBand or RoCE port (port_rcv_data and port_xmit_data × 4 from "
            "/sys/class/infiniband; kvscope_rdma_receive_bytes_total, kvscope_rdma_transmit_bytes_total): "
            "GPUDirect Storage and NIXL transfers that the NIC counters miss."), "Bps",
            [Query(_rate("kvscope_rdma_receive_bytes_total", "device, port"), "{{device}}:{{port}} in {{instance}}"),
             Query(_rate("kvscope_rdma_transmit_bytes_total", "device, port"), "{{device}}:{{port}} out {{instance}}")],
            negative=[1]),
    ]
    gpu = [
        timeseries_panel("GPU idle share", (
            "Share of sampled time each GPU ran no kernel (recording rule kvscope:gpu_idle:ratio_rate5m, from "
            "NVML utilization samples: kvscope_gpu_idle_seconds_total over busy plus idle). NVML's busy means "
            "at least one kernel ran, so it overstates how much of the GPU worked. Each GPU is shown under "
            "the namespace/pod the kubelet gave it to (kvscope_gpu_pod_info), and the namespace and pod "
            "variables select GPUs by that owner; a GPU no pod was given shows under the agent reading it. One "
            "point a minute (a 5-minute ratio)."),
            "percentunit", [Query(_gpu("kvscope:gpu_idle:ratio_rate5m"), OWNED_GPU)], percent_max=True, span=8,
            min_interval="1m"),
        timeseries_panel("Host↔GPU PCIe bytes: to the GPU up, from it down", (
            "Bytes per second the GPU received over PCIe from the host (the G2→G1 wire, above zero) and sent "
            "to it (G1→G2, below zero), from NVML's PCIe counters or its throughput samples (recording rules "
            "kvscope:gpu_pcie_receive_bytes:rate5m and kvscope:gpu_pcie_transmit_bytes:rate5m, of "
            "kvscope_gpu_pcie_receive_bytes_total and kvscope_gpu_pcie_transmit_bytes_total), under the "
            "namespace/pod that owns each GPU. One point a minute (5-minute rates)."), "Bps",
            [Query(_gpu("kvscope:gpu_pcie_receive_bytes:rate5m"), f"{OWNED_GPU} host→GPU"),
             Query(_gpu("kvscope:gpu_pcie_transmit_bytes:rate5m"), f"{OWNED_GPU} GPU→host")],
            negative=[1], span=8, min_interval="1m"),
        timeseries_panel("GPU idle while requests wait on KV fetch", (
            "Share of wall time each GPU ran no kernel while at least one request was fetching KV blocks and "
            "none was computing (recording rule kvscope:gpu_fetch_stall:ratio_rate5m; the correlation engine "
            "intersects NVML idle samples with the requests' fetch intervals), under the namespace/pod that "
            "owns the GPU. Only an agent that reads both the GPU and the requests computes it: empty where "
            "the node agent reads the GPUs and the sidecar the requests (compare GPU idle share with the "
            "pod's fetch share of TTFT instead). Dashed: where KVScopeGpuStalledOnFetch fires. One point a "
            "minute (a 5-minute ratio)."),
            "percentunit", [Query(_gpu("kvscope:gpu_fetch_stall:ratio_rate5m"), OWNED_GPU)], span=8,
            look=above("KVScopeGpuStalledOnFetch"), min_interval="1m"),
    ]
    contention = [
        timeseries_panel("Tier path utilisation", (
            "Traffic on the devices each tier's blocks travel (the disk, NIC, RDMA or FS series configured in "
            "analyses.correlation.paths) over that path's peak, observed or configured "
            "(kvscope_tier_path_utilisation_ratio, correlation engine). Dashed: where "
            "KVScopeStoragePathSaturated fires (on its 10-minute average)."), "percentunit",
            [Query(f"kvscope_tier_path_utilisation_ratio{{{HOST}, {TIER}}}", "{{tier}} {{instance}}")],
            look=above("KVScopeStoragePathSaturated")),
        timeseries_panel("Non-KV share of the path and fetch bandwidth drop", (
            "Share of a tier path's traffic that is not KV moving to or from the tier "
            "(kvscope_tier_path_non_kv_share_ratio), and how far the tier's fetch bandwidth fell below its "
            "quiet baseline (kvscope_tier_fetch_bandwidth_drop_ratio). Both rising together is another "
            "workload on the same storage path."), "percentunit",
            [Query(f"kvscope_tier_path_non_kv_share_ratio{{{HOST}, {TIER}}}", "{{tier}} non-KV share {{instance}}"),
             Query(f"kvscope_tier_fetch_bandwidth_drop_ratio{{{HOST}, {TIER}}}",
                   "{{tier}} bandwidth drop {{instance}}")]),
        timeseries_panel("Noisy neighbour and saturation signals", (
            "1 while the correlation engine finds the tier's path near its peak with fetch bandwidth down and "
            "KV's share of the path fallen (noisy neighbour, kvscope_tier_noisy_neighbour), or the path at "
            "its peak while the fetch share of TTFT grows (kvscope_tier_saturated)."), "bool_yes_no",
            [Query(f"max by (instance, tier) (kvscope_tier_noisy_neighbour{{{HOST}, {TIER}}})",
                   "{{tier}} noisy neighbour {{instance}}"),
             Query(f"max by (instance, tier) (kvscope_tier_saturated{{{HOST}, {TIER}}})",
                   "{{tier}} saturated {{instance}}")], span=24, look=RAISED),
    ]
    return build_dashboard(
        "kvscope / Hardware path", UID,
        "The devices KV blocks cross on their way to the GPU: block devices (NVMe), NICs and RDMA ports, the "
        "shared-filesystem client, PCIe and the GPU itself, and the correlation engine's storage-path signals. "
        "Device panels show the nodes the selected pods run on (joined on `node`); GPU panels show each GPU "
        "under the pod it was given (kvscope_gpu_pod_info), selected by that pod's namespace and name.",
        ("instance", "tier"),
        [("Storage", storage), ("Network", network), ("GPU", gpu), ("Storage path contention", contention)])
