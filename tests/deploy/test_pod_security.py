"""The Pod Security checker (testkit.pod_security) against the pod kvscope shipped before the node/pod split:
refused at baseline for its hostPath volumes, and at restricted also for the missing seccomp profile and
the vllm container without a securityContext, as the issue that replaced it says."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testkit.pod_security import pod_specs, violations

OLD = yaml.safe_load((Path(__file__).parent / "pre_split_inference_pod.yaml").read_text())


def test_the_old_pod_fails_baseline_for_its_host_paths() -> None:
    (spec, annotations), = pod_specs(OLD)
    assert violations(spec, "baseline", annotations) == ["hostPath volume host-proc", "hostPath volume host-sys"]
    assert violations(spec, "privileged", annotations) == []


def test_the_old_pod_fails_restricted_for_seccomp_and_the_engine() -> None:
    (spec, annotations), = pod_specs(OLD)
    found = violations(spec, "restricted", annotations)
    assert "kvscope: seccompProfile is unset, not RuntimeDefault or Localhost" in found
    assert {"vllm: allowPrivilegeEscalation is not false", "vllm: runAsNonRoot is not true",
            "vllm: capabilities do not drop ALL"} <= set(found)
    assert "volume host-proc: type ['hostPath']" in found


@pytest.mark.parametrize(("change", "expected"), [
    ({"hostNetwork": True}, "host namespaces: hostNetwork"),
    ({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}, "sysctl kernel.msgmax"),
    ({"containers": [{"name": "c", "securityContext": {"privileged": True}}]}, "c: privileged"),
    ({"containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]},
     "c: adds capabilities ['SYS_ADMIN']"),
    ({"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}]}]}, "c: hostPort 80"),
])
def test_each_baseline_control_is_checked(change: dict[str, object], expected: str) -> None:
    assert expected in violations({"containers": [], **change}, "baseline")
