"""Which pod owns each GPU: the kubelet's pod-resources API, as dcgm-exporter reads it.

The node agent sees every GPU of its node; the kubelet knows which container was given which device. Its
gRPC service `v1.PodResourcesLister` on `/var/lib/kubelet/pod-resources/kubelet.sock` answers `List` with
every pod's containers and the device ids the device plugin assigned them; for NVIDIA's device plugin the
resource is `nvidia.com/gpu` and a device id is the GPU's UUID, the same UUID NVML reports. The NVML
collector turns that into `kvscope_gpu_pod_info{gpu, uuid, namespace, pod, container}`, which dashboards
join to the GPU series on (node, gpu) and from there to the sidecar's series on (namespace, pod).

The messages are the v1 API's (kubernetes/kubelet pkg/apis/podresources/v1/api.proto, as published in the
Kubernetes docs' device-plugins page), declared here with only the fields kvscope reads: protobuf skips
the others (cpu_ids, memory, topology, dynamic resources) as unknown fields. grpcio is not a dependency of
the sidecar: it comes with the `node` extra (`pip install 'kvscope[node]'`, in the node agent's image).
MIG devices (`nvidia.com/mig-*`, device ids `MIG-…`) are not placed on their parent GPU.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from kvscope.agent.core.catalogue import gauge

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCE = "nvidia.com/gpu"

POD_INFO = gauge(
    "kvscope_gpu_pod_info", "", ("gpu", "uuid", "namespace", "pod", "container"),
    "1 for each GPU the kubelet assigned to a container (collectors.nvml.pod_resources_socket): join the GPU "
    "series on (gpu) to it for the pod that owns the GPU. GPUs no pod was given have no series.",
    "kubelet pod-resources API v1 List")


@dataclass(frozen=True, order=True)
class GpuOwner:
    namespace: str
    pod: str
    container: str


# (message, [(field name, number, type, label, message type)]) of the v1 API's List call
_STRING, _MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_STRING, descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
_ONE, _MANY = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_MESSAGES: tuple[tuple[str, tuple[tuple[str, int, int, int, str], ...]], ...] = (
    ("ListPodResourcesRequest", ()),
    ("ListPodResourcesResponse", (("pod_resources", 1, _MESSAGE, _MANY, ".v1.PodResources"),)),
    ("PodResources", (("name", 1, _STRING, _ONE, ""), ("namespace", 2, _STRING, _ONE, ""),
                      ("containers", 3, _MESSAGE, _MANY, ".v1.ContainerResources"))),
    ("ContainerResources", (("name", 1, _STRING, _ONE, ""),
                            ("devices", 2, _MESSAGE, _MANY, ".v1.ContainerDevices"))),
    ("ContainerDevices", (("resource_name", 1, _STRING, _ONE, ""), ("device_ids", 2, _STRING, _MANY, ""))),
)


def message_classes() -> tuple[Any, Any]:
    """(ListPodResourcesRequest, ListPodResourcesResponse) built in a private descriptor pool."""
    proto = descriptor_pb2.FileDescriptorProto(name="kvscope/podresources/v1/api.proto", package="v1",
                                               syntax="proto3")
    for name, fields in _MESSAGES:
        message = proto.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            message.field.add(name=field_name, number=number, type=kind, label=label,
                              **({'type_name': type_name} if type_name else {}))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("v1.ListPodResourcesRequest")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("v1.ListPodResourcesResponse")))


def gpu_owners(response: Any, resource: str = GPU_RESOURCE) -> dict[str, GpuOwner]:
    """GPU UUID -> the container it was assigned to, from a ListPodResourcesResponse."""
    owners: dict[str, GpuOwner] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name == resource:
                    for uuid in devices.device_ids:
                        owners[uuid] = GpuOwner(pod.namespace, pod.name, container.name)
    return owners


class PodResourcesClient:
    """`List` on the kubelet's socket; one channel, kept open. `grpc` is injectable (tests, absent grpcio)."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 2.0, grpc: Any | None = None) -> None:
        if grpc is None:
            try:
                grpc = importlib.import_module("grpc")
            except ImportError:
                raise ImportError("the pod-resources lookup needs grpcio: pip install 'kvscope[node]'") from None
        request, response = message_classes()
        self._request = request
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        self._list = self._channel.unary_unary(LIST_METHOD, request_serializer=request.SerializeToString,
                                               response_deserializer=response.FromString)
        self._timeout = timeout

    def __call__(self) -> dict[str, GpuOwner]:
        return gpu_owners(self._list(self._request(), timeout=self._timeout))

    def close(self) -> None:
        self._channel.close()


def pod_info(gpus: Iterable[tuple[str, str]], owners: Mapping[str, GpuOwner]) -> list[tuple[tuple[str, ...], float]]:
    """(labels, 1.0) of kvscope_gpu_pod_info for each (gpu label, uuid) the kubelet assigned to a container."""
    return [((label, uuid, o.namespace, o.pod, o.container), 1.0)
            for label, uuid in gpus if (o := owners.get(uuid)) is not None]
