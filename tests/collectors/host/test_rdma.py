"""RDMA collector: port counters x 4, link layer, absent stack, partial failures."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from kvscope.agent.core.readings import Sample
from kvscope.collectors.host.rdma import RdmaCollector, RdmaOptions, port_readings
from testkit.paths import FIXTURES

HOST = FIXTURES / "host"


def collect(root: Path, **options: object) -> list[Sample]:
    out = RdmaCollector(RdmaOptions(**options), str(root / "sys")).collect()  # type: ignore[arg-type]
    return [r for r in out if isinstance(r, Sample)]


def values(readings: list[Sample], metric: str) -> dict[tuple[str, ...], float]:
    return {r.labels: r.value for r in readings if r.name == metric}


def test_data_counters_are_lanes_times_four_with_64_bit_values() -> None:
    out = collect(HOST / "gpu-node")
    assert values(out, "kvscope_rdma_receive_bytes_total") == {
        ("mlx5_0", "1"): 1546875000000 * 4, ("mlx5_1", "1"): 25769803776 * 4}
    assert values(out, "kvscope_rdma_transmit_bytes_total") == {
        ("mlx5_0", "1"): 2030078125000 * 4, ("mlx5_1", "1"): 12884901888 * 4}
    assert values(out, "kvscope_rdma_receive_packets_total")[("mlx5_1", "1")] == 6442450944
    assert values(out, "kvscope_rdma_transmit_packets_total")[("mlx5_0", "1")] == 2113929216
    assert values(out, "kvscope_rdma_port_info") == {
        ("mlx5_0", "1", "Ethernet"): 1.0, ("mlx5_1", "1", "InfiniBand"): 1.0}
    assert values(out, "kvscope_host_input_errors_total") == {("rdma",): 0}


def test_no_infiniband_class_is_no_data_not_an_error() -> None:
    out = collect(HOST / "real-vm")
    assert [r.name for r in out] == ["kvscope_host_input_errors_total"]
    assert out[0].value == 0


def test_packets_can_be_left_out_and_devices_filtered() -> None:
    out = collect(HOST / "gpu-node", packets=False, exclude=["mlx5_1"])
    assert {r.name for r in out} == {"kvscope_rdma_receive_bytes_total", "kvscope_rdma_transmit_bytes_total",
                                     "kvscope_rdma_port_info", "kvscope_host_input_errors_total"}
    assert set(values(out, "kvscope_rdma_receive_bytes_total")) == {("mlx5_0", "1")}


def test_unreadable_or_garbage_counter_skips_only_that_counter(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "r"
    shutil.copytree(HOST / "gpu-node", root)
    counters = root / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    (counters / "port_rcv_data").unlink()
    (counters / "port_rcv_data").mkdir()  # unreadable: IsADirectoryError even as root
    (counters / "port_xmit_data").write_text("N/A (no PMA)\n")
    with caplog.at_level(logging.WARNING, "kvscope.collectors.rdma"):
        c = RdmaCollector(RdmaOptions(), str(root / "sys"))
        c.collect()
        out = [r for r in c.collect() if isinstance(r, Sample)]
    assert set(values(out, "kvscope_rdma_receive_bytes_total")) == {("mlx5_1", "1")}
    assert set(values(out, "kvscope_rdma_transmit_bytes_total")) == {("mlx5_1", "1")}
    assert ("mlx5_0", "1") in values(out, "kvscope_rdma_receive_packets_total")
    assert values(out, "kvscope_host_input_errors_total") == {("rdma",): 4}  # 2 problems x 2 cycles
    assert len(caplog.records) == 2  # each kind of problem logged once


def test_device_gone_between_listings(tmp_path: Path) -> None:
    root = tmp_path / "r"
    shutil.copytree(HOST / "gpu-node", root)
    shutil.rmtree(root / "sys" / "class" / "infiniband" / "mlx5_0" / "ports")
    out = collect(root)
    assert set(values(out, "kvscope_rdma_receive_bytes_total")) == {("mlx5_1", "1")}


def test_saturated_32_bit_data_counter_is_reported_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    result = port_readings("qib0", "1", "InfiniBand\n", {"port_rcv_data": "4294967295\n", "port_xmit_data": "12\n"})
    assert result.saturated == ["port_rcv_data"]
    assert [(r.name, r.value) for r in result.readings if isinstance(r, Sample)] == [
        ("kvscope_rdma_port_info", 1.0),
        ("kvscope_rdma_receive_bytes_total", 4294967295 * 4),
        ("kvscope_rdma_transmit_bytes_total", 48.0),
    ]
    root = tmp_path / "r"
    shutil.copytree(HOST / "gpu-node", root)
    (root / "sys" / "class" / "infiniband" / "mlx5_1" / "ports" / "1" / "counters" / "port_rcv_data").write_text(
        "4294967295\n")
    c = RdmaCollector(RdmaOptions(), str(root / "sys"))
    with caplog.at_level(logging.WARNING, "kvscope.collectors.rdma"):
        c.collect()
        out = [r for r in c.collect() if isinstance(r, Sample)]
    assert values(out, "kvscope_rdma_receive_bytes_total")[("mlx5_1", "1")] == 4294967295 * 4
    assert values(out, "kvscope_host_input_errors_total") == {("rdma",): 0}  # a data problem, not an input error
    assert [r.getMessage().split(" is ")[0] for r in caplog.records] == ["rdma: mlx5_1 port 1 port_rcv_data"]


def test_empty_infiniband_class_is_no_data(tmp_path: Path) -> None:
    # as on the H200 VM this was checked on (kernel 6.18 "-gpu"): the class directory exists, no devices
    (tmp_path / "sys" / "class" / "infiniband").mkdir(parents=True)
    out = collect(tmp_path)
    assert [(r.name, r.value) for r in out] == [("kvscope_host_input_errors_total", 0.0)]
