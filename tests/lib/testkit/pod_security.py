"""The Pod Security Standards (Kubernetes 1.33, kubernetes.io/docs/concepts/security/pod-security-standards/),
written from the published tables: `violations(pod_spec, level)` names each control a pod spec breaks at
"baseline" or "restricted" (restricted includes baseline), as `kubectl label ns pod-security.kubernetes.io/
enforce=<level>` would refuse it. Every container counts: containers, initContainers, ephemeralContainers.
"""

from __future__ import annotations

from typing import Any

LEVELS = ("privileged", "baseline", "restricted")
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret", "image"}


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for key in ("initContainers", "containers", "ephemeralContainers") for c in spec.get(key) or []]


def _baseline(spec: dict[str, Any], annotations: dict[str, str]) -> list[str]:
    out = [f"host namespaces: {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    out += [f"hostPath volume {v['name']}" for v in spec.get("volumes") or [] if "hostPath" in v]
    pod_sc = spec.get("securityContext") or {}
    contexts = [("pod", pod_sc)] + [(c["name"], c.get("securityContext") or {}) for c in containers(spec)]
    for name, sc in contexts:
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{name}: HostProcess")
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"{name}: seccomp Unconfined")
        if (sc.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
            out.append(f"{name}: AppArmor profile {sc['appArmorProfile']['type']}")
        selinux = sc.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            out.append(f"{name}: SELinux options {selinux}")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount {sc['procMount']}")
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            out.append(f"{name}: adds capabilities {sorted(added - BASELINE_CAPABILITIES)}")
    for c in containers(spec):
        out += [f"{c['name']}: hostPort {p['hostPort']}" for p in c.get("ports") or [] if p.get("hostPort")]
    out += [f"sysctl {s['name']}" for s in pod_sc.get("sysctls") or [] if s["name"] not in SAFE_SYSCTLS]
    out += [f"AppArmor annotation {k}={v}" for k, v in annotations.items()
            if k.startswith("container.apparmor.security.beta.kubernetes.io/")
            and v != "runtime/default" and not v.startswith("localhost/")]
    return out


def _restricted(spec: dict[str, Any]) -> list[str]:
    out = [f"volume {v['name']}: type {sorted(set(v) - {'name'})}" for v in spec.get("volumes") or []
           if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    pod_sc = spec.get("securityContext") or {}
    if pod_sc.get("runAsUser") == 0:
        out.append("pod: runAsUser 0")
    for c in containers(spec):
        sc, name = c.get("securityContext") or {}, c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile is {seccomp or 'unset'}, not RuntimeDefault or Localhost")
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            out.append(f"{name}: capabilities do not drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds capabilities other than NET_BIND_SERVICE")
    return out


def violations(spec: dict[str, Any], level: str, annotations: dict[str, str] | None = None) -> list[str]:
    """What the pod spec breaks at `level` (baseline or restricted; privileged allows everything)."""
    if level not in LEVELS:
        raise ValueError(f"unknown Pod Security level {level!r}")
    out = [] if level == "privileged" else _baseline(spec, annotations or {})
    return out + (_restricted(spec) if level == "restricted" else [])


def pod_specs(resource: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """(pod spec, pod annotations) of a Pod, or of the pod template of a workload."""
    kind = resource.get("kind")
    if kind == "Pod":
        return [(resource["spec"], resource["metadata"].get("annotations") or {})]
    if kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
        template = resource["spec"]["template"]
        return [(template["spec"], (template.get("metadata") or {}).get("annotations") or {})]
    if kind == "CronJob":
        template = resource["spec"]["jobTemplate"]["spec"]["template"]
        return [(template["spec"], (template.get("metadata") or {}).get("annotations") or {})]
    return []
