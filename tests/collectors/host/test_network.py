"""Network collector: /proc/net/dev parsing, interface selection, resets."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvscope.agent.config.settings import ConfigError, load_config
from kvscope.agent.core.catalogue import AGENT_METRICS, Catalogue
from kvscope.agent.core.pipeline import Components
from kvscope.agent.core.readings import Sample
from kvscope.agent.core.store import Store
from kvscope.collectors.host import network
from kvscope.collectors.host.network import NetCounters, NetworkCollector, NetworkOptions, parse_net_dev
from testkit.paths import FIXTURES

HOST = FIXTURES / "host"


def collect(root: Path, **options: object) -> list[Sample]:
    out = NetworkCollector(NetworkOptions(**options), str(root / "proc")).collect()  # type: ignore[arg-type]
    return [r for r in out if isinstance(r, Sample)]


def by_interface(readings: list[Sample], metric: str) -> dict[str, float]:
    return {r.labels[0]: r.value for r in readings if r.name == metric}


def test_parse_real_vm_net_dev() -> None:
    counters, bad = parse_net_dev((HOST / "real-vm" / "proc" / "net" / "dev").read_text())
    assert bad == 0
    assert list(counters) == ["lo", "ifb0", "ifb1", "eth0"]
    # eth0: 115329282 3598 0 0 0 0 0 0 | 217924 2079 0 0 0 0 0 0
    assert counters["eth0"] == NetCounters(115329282, 3598, 0, 0, 217924, 2079, 0, 0)


def test_parse_takes_errs_and_drop_columns_and_overflowing_names() -> None:
    counters, bad = parse_net_dev((HOST / "gpu-node" / "proc" / "net" / "dev").read_text())
    assert bad == 0
    # eth0 receive: bytes packets errs drop fifo frame compressed multicast = ... 3 1201 0 3 0 20211
    assert counters["eth0"] == NetCounters(48213377012, 35123456, 3, 1201, 9123456789, 21987654, 0, 0)
    # names longer than the 6-column field run into the colon: "ens1f0np0: 7340032512 ..."
    assert counters["ens1f0np0"].receive_bytes == 7340032512
    assert counters["cali8d2c1e4f5a6"].transmit_packets == 50123


def test_malformed_lines_are_counted() -> None:
    text = (
        "h1\nh2\n"
        "  eth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n"
        "  eth1: 1 2 3\n"  # too few columns
        "  eth2 1 2\n"  # no colon
        "  eth3: a b c d e f g h i j k l m n o p\n"  # not numbers
    )
    counters, bad = parse_net_dev(text)
    assert list(counters) == ["eth0"]
    assert counters["eth0"] == NetCounters(1, 2, 3, 4, 9, 10, 11, 12)
    assert bad == 3


def test_default_excludes_loopback_and_container_plumbing() -> None:
    out = collect(HOST / "gpu-node")
    assert sorted(by_interface(out, "kvscope_network_receive_bytes_total")) == ["ens1f0np0", "eth0", "ib0"]
    assert by_interface(out, "kvscope_network_receive_drops_total")["eth0"] == 1201
    assert by_interface(out, "kvscope_network_receive_errors_total")["eth0"] == 3
    assert by_interface(out, "kvscope_network_transmit_bytes_total")["eth0"] == 9123456789
    assert by_interface(out, "kvscope_network_transmit_packets_total")["ib0"] == 400111
    assert by_interface(out, "kvscope_host_input_errors_total") == {"network": 0}
    assert sorted(by_interface(collect(HOST / "real-vm"), "kvscope_network_receive_bytes_total")) == [
        "eth0", "ifb0", "ifb1"]


def test_include_and_exclude() -> None:
    root = HOST / "gpu-node"
    assert sorted(by_interface(collect(root, include=["e*"]), "kvscope_network_receive_bytes_total")) == [
        "ens1f0np0", "eth0"]
    assert sorted(by_interface(collect(root, exclude=["re:(lo|ib[0-9]+)"]), "kvscope_network_receive_bytes_total")) == [
        "cali8d2c1e4f5a6", "docker0", "ens1f0np0", "eth0", "veth3f2a1b0"]


def test_path_selects_another_namespace_file(tmp_path: Path) -> None:
    root = tmp_path / "r"
    shutil.copytree(HOST / "gpu-node", root)
    (root / "proc" / "1" / "net").mkdir(parents=True)
    (root / "proc" / "net" / "dev").rename(root / "proc" / "1" / "net" / "dev")
    assert "eth0" in by_interface(collect(root, path="1/net/dev"), "kvscope_network_receive_bytes_total")
    with pytest.raises(FileNotFoundError):
        collect(root)


def test_bad_options_are_config_errors() -> None:
    parts = Components({"network": network.SPEC}, {})
    with pytest.raises(ConfigError, match=r"collectors\.network: path: must be relative"):
        load_config("[collectors.network]\npath = '/proc/net/dev'\n", parts, environ={})
    with pytest.raises(ConfigError, match=r"collectors\.network: include: empty pattern"):
        load_config("[collectors.network]\ninclude = ['']\n", parts, environ={})


def test_interface_counter_reset_keeps_the_total_monotonic(tmp_path: Path) -> None:
    root = tmp_path / "r"
    shutil.copytree(HOST / "real-vm", root)
    store = Store(Catalogue([*AGENT_METRICS, *network.METRICS]))
    c = NetworkCollector(NetworkOptions(), str(root / "proc"))
    store.ingest("network", c.collect(), 1.0)
    dev = root / "proc" / "net" / "dev"
    # eth0 re-created (driver reload): its counters restart; ifb0 vanished
    lines = [ln for ln in dev.read_text().splitlines() if "ifb0" not in ln]
    lines = [("  eth0:     500       5    0    0    0     0          0         0      70       1    0    0"
              "    0     0       0          0") if ln.startswith("  eth0") else ln for ln in lines]
    dev.write_text("\n".join(lines) + "\n")
    store.ingest("network", c.collect(), 2.0)
    assert store.value("kvscope_network_receive_bytes_total", ("eth0",)) == 115329282 + 500
    assert sorted(k[0] for k in store.values("kvscope_network_receive_bytes_total")) == ["eth0", "ifb1"]
