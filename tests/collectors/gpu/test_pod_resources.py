"""GPU -> pod through the kubelet's pod-resources API: a real gRPC server on a unix socket serves `List` in
the v1 API's full message shapes (kubernetes/kubelet pkg/apis/podresources/v1/api.proto as the Kubernetes
docs publish it: cpu_ids, memory and the devices' NUMA topology included, which kvscope does not read),
and the NVML collector, replaying a recorded H200 (tests/fixtures/nvml/h200_real_auto.json), names the pod.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from kvscope.agent.core.readings import Sample
from kvscope.collectors.gpu.nvml import POD_OWNERS_REFRESH_SECONDS, SPEC, NvmlCollector, NvmlOptions
from kvscope.collectors.gpu.pod_resources import GpuOwner, PodResourcesClient, gpu_owners, message_classes
from testkit.nvml_replay import NvmlReplay
from testkit.paths import FIXTURES

H200 = "GPU-8fd81bc1-739b-29b3-e925-e361cfbeffa1"  # the UUID in the recording
F = descriptor_pb2.FieldDescriptorProto
# the v1 API's List messages, every field (api.proto, Kubernetes 1.33)
FULL_V1 = {
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".v1.PodResources")],
    "PodResources": [("name", 1, F.TYPE_STRING, F.LABEL_OPTIONAL, ""),
                     ("namespace", 2, F.TYPE_STRING, F.LABEL_OPTIONAL, ""),
                     ("containers", 3, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".v1.ContainerResources")],
    "ContainerResources": [("name", 1, F.TYPE_STRING, F.LABEL_OPTIONAL, ""),
                           ("devices", 2, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".v1.ContainerDevices"),
                           ("cpu_ids", 3, F.TYPE_INT64, F.LABEL_REPEATED, ""),
                           ("memory", 4, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".v1.ContainerMemory")],
    "ContainerMemory": [("memory_type", 1, F.TYPE_STRING, F.LABEL_OPTIONAL, ""),
                        ("size", 2, F.TYPE_UINT64, F.LABEL_OPTIONAL, ""),
                        ("topology", 3, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".v1.TopologyInfo")],
    "ContainerDevices": [("resource_name", 1, F.TYPE_STRING, F.LABEL_OPTIONAL, ""),
                         ("device_ids", 2, F.TYPE_STRING, F.LABEL_REPEATED, ""),
                         ("topology", 3, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".v1.TopologyInfo")],
    "TopologyInfo": [("nodes", 1, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".v1.NUMANode")],
    "NUMANode": [("ID", 1, F.TYPE_INT64, F.LABEL_OPTIONAL, "")],
}


def full_v1() -> Any:
    proto = descriptor_pb2.FileDescriptorProto(name="pkg/apis/podresources/v1/api.proto", package="v1",
                                               syntax="proto3")
    for name, fields in FULL_V1.items():
        message = proto.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            message.field.add(name=field, number=number, type=kind, label=label,
                              **({'type_name': type_name} if type_name else {}))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("v1.ListPodResourcesResponse"))


def kubelet_answer() -> Any:
    """Two pods on an 8-GPU node: vLLM with one GPU (and a sidecar with none), a training pod with two,
    and a pod holding a NIC from another device plugin."""
    answer = full_v1()()
    vllm = answer.pod_resources.add(name="vllm-gpt-oss-120b-0", namespace="inference")
    engine = vllm.containers.add(name="vllm", cpu_ids=[4, 5, 6, 7])
    engine.devices.add(resource_name="nvidia.com/gpu", device_ids=[H200]).topology.nodes.add(ID=0)
    engine.memory.add(memory_type="memory", size=64 << 30).topology.nodes.add(ID=0)
    vllm.containers.add(name="kvscope")
    train = answer.pod_resources.add(name="trainer-7", namespace="research")
    train.containers.add(name="main").devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-a", "GPU-b"])
    nic = answer.pod_resources.add(name="storage-client", namespace="kube-system")
    nic.containers.add(name="client").devices.add(resource_name="nvidia.com/hostdev", device_ids=["mlx5_0"])
    return answer


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A gRPC server on a unix socket serving v1.PodResourcesLister/List; yields (socket, methods called)."""
    socket = str(tmp_path / "kubelet.sock")
    calls: list[str] = []
    request_class, _ = message_classes()

    def list_pods(request: Any, context: Any) -> Any:
        calls.append("List")
        return kubelet_answer()

    handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(list_pods, request_deserializer=request_class.FromString,
                                                    response_serializer=lambda m: m.SerializeToString())})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    assert server.add_insecure_port(f"unix://{socket}") != 0
    server.start()
    try:
        yield socket, calls
    finally:
        server.stop(grace=None)


def test_the_client_lists_the_gpus_of_every_container(kubelet: tuple[str, list[str]]) -> None:
    socket, calls = kubelet
    client = PodResourcesClient(socket)
    try:
        owners = client()
    finally:
        client.close()
    assert calls == ["List"]
    assert owners == {H200: GpuOwner("inference", "vllm-gpt-oss-120b-0", "vllm"),
                      "GPU-a": GpuOwner("research", "trainer-7", "main"),
                      "GPU-b": GpuOwner("research", "trainer-7", "main")}  # the NIC is not a GPU


def test_the_parser_reads_the_full_messages_wire_format() -> None:
    _, response_class = message_classes()
    parsed = response_class.FromString(kubelet_answer().SerializeToString())
    assert gpu_owners(parsed)[H200] == GpuOwner("inference", "vllm-gpt-oss-120b-0", "vllm")
    assert gpu_owners(parsed, resource="nvidia.com/hostdev") == {
        "mlx5_0": GpuOwner("kube-system", "storage-client", "client")}


def _collector(owners: Any, clock: Callable[[], float] = lambda: 0.0) -> NvmlCollector:
    recording = json.loads((FIXTURES / "nvml" / "h200_real_auto.json").read_text())
    return NvmlCollector(NvmlReplay(recording), NvmlOptions(pcie_poll_seconds=0.0), clock,
                         lambda: 1754000000.0, "/nonexistent", owners)


def test_the_kubelet_is_asked_once_per_refresh_period_not_every_collection() -> None:
    asked: list[float] = []
    now = [0.0]

    def owners() -> dict[str, GpuOwner]:
        asked.append(now[0])
        if len(asked) == 2:
            raise ConnectionError("kubelet restarting")
        return {H200: GpuOwner("inference", f"pod-{len(asked)}", "vllm")}

    collector = _collector(owners, lambda: now[0])
    pods = []
    for t in (0.0, 1.0, 9.9, POD_OWNERS_REFRESH_SECONDS, 11.0, 2 * POD_OWNERS_REFRESH_SECONDS):
        now[0] = t
        pods.append([r.labels[3] for r in collector.collect()
                     if isinstance(r, Sample) and r.name == "kvscope_gpu_pod_info"])
    # asked at 0, 10 (fails: no pod, and not asked again at 11), 20
    assert asked == [0.0, POD_OWNERS_REFRESH_SECONDS, 2 * POD_OWNERS_REFRESH_SECONDS]
    assert pods == [["pod-1"], ["pod-1"], ["pod-1"], [], [], ["pod-3"]]


def test_the_nvml_collector_names_the_pod_of_each_gpu(kubelet: tuple[str, list[str]]) -> None:
    client = PodResourcesClient(kubelet[0])
    try:
        readings = _collector(client).collect()
    finally:
        client.close()
    info = [r for r in readings if isinstance(r, Sample) and r.name == "kvscope_gpu_pod_info"]
    assert [(r.labels, r.value) for r in info] == [
        (("0", H200, "inference", "vllm-gpt-oss-120b-0", "vllm"), 1.0)]
    assert "kvscope_gpu_pod_info" in {m.name for m in SPEC.metrics}
    assert any(isinstance(r, Sample) and r.name == "kvscope_gpu_busy_seconds_total" for r in readings)


def test_without_the_kubelet_gpu_data_goes_on_and_the_operator_is_told(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    client = PodResourcesClient(str(tmp_path / "absent.sock"), timeout=0.5)
    collector = _collector(client)
    with caplog.at_level(logging.WARNING, logger="kvscope.collectors.nvml"):
        first, second = collector.collect(), collector.collect()
    client.close()
    for readings in (first, second):
        names = {r.name for r in readings if isinstance(r, Sample)}
        assert "kvscope_gpu_info" in names and "kvscope_gpu_pod_info" not in names
    warnings = [r.getMessage() for r in caplog.records if "pod-resources" in r.getMessage()]
    assert len(warnings) == 1 and "carry no pod" in warnings[0]  # said once, not at every collection


def test_without_grpcio_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)  # what an image without the `node` extra has
    with pytest.raises(ImportError, match=r"kvscope\[node\]"):
        PodResourcesClient("/nonexistent.sock")
