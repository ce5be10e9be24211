"""History of a fleet of kvscope pods, made from real expositions, as OpenMetrics for `promtool tsdb
create-blocks-from openmetrics`.

`capture()` runs the agent as the chart deploys it (testkit/cardinality.py: the seeds' Dynamo KVBM + vLLM
pod, the sidecar's default configuration with what-if on; and the node agent on an 8-GPU node) against
advancing engine pages, KV events and spans, and reads its /metrics twice: each series' value and its rate
between the two reads. `write_history()` writes that pod for N pods (every 8 pods on one node, with that
node's agent), each counter continuing at its captured rate times a per-pod factor (0.5 to 1.5, the same for
all of a pod's counters, so its ratios stay what the agent exported), gauges at their captured value, with the
labels a PodMonitor scrape adds (cluster, namespace, pod, container, instance, node, job).
"""

from __future__ import annotations

import dataclasses
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from testkit import cardinality as card

_LABEL_NAME = re.compile(r'(?:^|",)([a-zA-Z_][a-zA-Z0-9_]*)="')
PODS_PER_NODE = 8
CLUSTER = "fleet-a"


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    labels: str  # the exposition's label pairs, without braces ("" for none)
    value: float
    rate: float  # per second, between the two reads (0 for gauges)


def _parse(text: str) -> tuple[dict[tuple[str, str], float], set[str]]:
    """Samples by (name, labels) and the names of counting samples (counters, histogram parts)."""
    counting_families: set[str] = set()
    values: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ", 3)
            if kind in ("counter", "histogram"):
                counting_families.add(family)
            continue
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            labels, _, value = rest.rpartition("} ")
        else:
            name, _, value = line.partition(" ")
            labels = ""
        values[(name, labels)] = float(value.split(" ")[0])
    counting = {n for n, _ in values if n in counting_families or n.removesuffix("_total") in counting_families
                or any(n == f + s for f in counting_families for s in ("_bucket", "_sum", "_count"))}
    return values, counting


def _read(url: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        return str(response.read().decode())


def capture_config(config: card.Configuration, apart: float = 4.0) -> list[Series]:
    """The agent of `config` read twice `apart` seconds apart, once its series count has settled."""
    with card.running(config) as (_, url):
        card.settled(url)
        first, t1 = _read(url), time.monotonic()
        time.sleep(apart)
        second, t2 = _read(url), time.monotonic()
    before, _ = _parse(first)
    after, counting = _parse(second)
    out = []
    for (name, labels), value in sorted(after.items()):
        rate = 0.0
        if name in counting and (name, labels) in before:
            rate = max(0.0, (value - before[(name, labels)]) / (t2 - t1))
        out.append(Series(name, labels, value, rate))
    return out


def pod_config() -> card.Configuration:
    """The seeds' pod (Dynamo KVBM with its G4 on the shared file system) with the sidecar's default
    analyses: correlation and what-if on."""
    seeds = next(c for c in card.CONFIGURATIONS if c.key == "dynamo-kvbm")
    return dataclasses.replace(seeds, key="fleet-pod", extra=seeds.extra.replace(card.SIDECAR_ONLY_ENGINE, "", 1))


def node_config() -> card.Configuration:
    return next(c for c in card.CONFIGURATIONS if c.key == "node-nvml-8gpu")


@dataclass(frozen=True, slots=True)
class Fleet:
    pod: list[Series]
    node: list[Series]

    def series_per_pod(self) -> float:
        return len(self.pod) + len(self.node) / PODS_PER_NODE


def capture() -> Fleet:
    return Fleet(capture_config(pod_config()), capture_config(node_config()))


def _targets(pods: int) -> Iterator[tuple[int, dict[str, str], bool]]:
    """(pod index, the labels its scrape adds, whether the target is a node agent) for every target."""
    for i in range(pods):
        node = f"gpu-node-{i // PODS_PER_NODE:03d}"
        yield i, {"cluster": CLUSTER, "namespace": "inference", "pod": f"vllm-{i:04d}", "container": "kvscope",
                  "instance": f"vllm-{i:04d}", "node": node, "job": "kvscope"}, False
        if i % PODS_PER_NODE == 0:
            agent = f"kvscope-node-{node}"
            yield i, {"cluster": CLUSTER, "namespace": "kvscope", "pod": agent, "container": "kvscope",
                      "instance": agent, "node": node, "job": "kvscope-node"}, True


def pod_factor(i: int) -> float:
    return 0.5 + (i * 7 % 11) / 10


def _label_text(series: Series, scrape_labels: dict[str, str]) -> str:
    """The series' labels and the scrape's; an exposed label wins over the scrape's of the same name (the
    node agent's ServiceMonitor honours its labels: kvscope_gpu_pod_info names the GPU's pod)."""
    exposed = set(_LABEL_NAME.findall(series.labels))
    added = ",".join(f'{k}="{v}"' for k, v in scrape_labels.items() if k not in exposed)
    return f"{series.labels},{added}" if series.labels else added


def write_history(out: TextIO, fleet: Fleet, pods: int, timestamps: list[int], start: int) -> int:
    """Writes every sample of the fleet at `timestamps` (seconds, ascending); the number written. At `start`
    (the history's first instant) a counter has its captured value, and from there grows at its rate."""
    written = 0
    for i, scrape_labels, is_node in _targets(pods):
        factor = pod_factor(i)
        for s in fleet.node if is_node else fleet.pod:
            head = f"{s.name}{{{_label_text(s, scrape_labels)}}} "
            if s.rate:
                rate = s.rate * factor
                out.write("".join(f"{head}{s.value + rate * (t - start):.3f} {t}\n" for t in timestamps))
            else:
                value = f"{s.value!r}"
                out.write("".join(f"{head}{value} {t}\n" for t in timestamps))
            written += len(timestamps)
    return written


def write_file(path: Path, fleet: Fleet, pods: int, timestamps: list[int], start: int) -> int:
    with path.open("w", buffering=1 << 22) as out:
        written = write_history(out, fleet, pods, timestamps, start)
        out.write("# EOF\n")
    return written
