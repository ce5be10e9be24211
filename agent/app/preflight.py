"""What `kvscope run` will need, checked before it starts (and by `kvscope config check`).

A configuration can be well-formed and still not run: a web config without the `web` extra, a host
/proc that is not mounted where the config says, a listen address whose host does not resolve, a
JSON Lines file in a directory that does not exist, OTLP export without the `otlp` extra or with a
bad OTEL_* variable. Each problem is one line naming the key; problems
stop the agent (exit 2), warnings are printed and the agent runs.
"""

from __future__ import annotations

import os
import socket
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvscope.agent.config import extras
from kvscope.agent.config.binding import ConfigError
from kvscope.agent.config.settings import Config, parse_listen
from kvscope.agent.core.pipeline import Components
from kvscope.agent.http.webconfig import load_web_config
from kvscope.exporters.jsonl import SPEC as JSONL
from kvscope.exporters.otlp import settings as otlp_settings
from kvscope.exporters.prometheus.server import SPEC as PROMETHEUS

_ROOT_KEYS = {"proc": ("agent.proc_root", "--path.procfs", "/proc"), "sys": ("agent.sys_root", "--path.sysfs", "/sys")}
# a file every Linux /proc and /sys has: a directory without it is not the tree the collectors expect
_ROOT_MARKERS = {"proc": "stat", "sys": "class"}


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _roots(config: Config, parts: Components, found: Findings) -> None:
    for root in ("proc", "sys"):
        users = [name for name, (settings, _) in config.collectors.items()
                 if settings.enabled and root in parts.collectors[name].roots]
        if not users:
            continue
        key, flag, usual = _ROOT_KEYS[root]
        path = config.agent.proc_root if root == "proc" else config.agent.sys_root
        needed = f"(read by the {', '.join(users)} collector{'s' if len(users) > 1 else ''})"
        if not os.path.isdir(path):
            found.problems.append(f"{key}: {path} is not a directory {needed}; mount the host's {usual} there "
                                  f"read-only, set {flag}, or disable those collectors")
        elif not os.path.exists(os.path.join(path, _ROOT_MARKERS[root])):
            found.warnings.append(f"{key}: {path} has no {_ROOT_MARKERS[root]!r}: it does not look like a "
                                  f"{usual} tree {needed}")


def _listen(key: str, address: str, found: Findings) -> None:
    host, port = parse_listen(key, address)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        found.problems.append(f"{key}: cannot resolve host {host!r} of {address!r}: {exc.strerror or exc}")


def _web(config: Config, found: Findings) -> None:
    """The web config of /metrics and of the OTLP receiver, when set: readable, valid, its extra installed."""
    files = [("exporters.prometheus.web_config_file", config.exporter(PROMETHEUS).web_config_file)]
    otlp = config.collectors.get("otlp_traces")
    if otlp is not None and otlp[0].enabled:
        files.append(("collectors.otlp_traces.web_config_file", otlp[1].web_config_file))
    for key, path in files:
        if not path:
            continue
        missing = extras.missing_modules("web")
        if missing:
            found.problems.append(extras.message("web", key, missing))
            continue
        try:
            load_web_config(path).close()
        except ConfigError as exc:
            found.problems.append(f"{key}: {exc}")


def _jsonl(config: Config, found: Findings) -> None:
    section = config.exporter(JSONL)
    if not section.enabled:
        return
    directory = os.path.dirname(os.path.abspath(section.path))
    if not os.path.isdir(directory):
        found.problems.append(f"exporters.jsonl.path: directory {directory} does not exist")
    elif not os.access(directory, os.W_OK):
        found.problems.append(f"exporters.jsonl.path: directory {directory} is not writable")


_LOCAL = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"}


def _receives_itself(config: Config, dest: otlp_settings.Destination) -> bool:
    """The destination is kvscope's own otlp_traces receiver (the OTLP default port is the same)."""
    receiver = config.collectors.get("otlp_traces")
    if receiver is None or not receiver[0].enabled:
        return False
    url = urllib.parse.urlsplit(dest.endpoint if "://" in dest.endpoint else f"//{dest.endpoint}")
    default = 443 if url.scheme == "https" else 80
    _, port = parse_listen("collectors.otlp_traces.listen", receiver[1].listen)
    return (url.hostname or "") in _LOCAL and (url.port or default) == port


def _otlp(config: Config, environ: Mapping[str, str], found: Findings) -> None:
    section = config.exporter(otlp_settings.SPEC)
    if not (section.metrics or section.traces):
        return
    try:
        settings = otlp_settings.resolve(section, environ)
    except ConfigError as exc:
        found.problems.append(str(exc))
        return
    dests = [d for d in (settings.metrics, settings.traces) if d is not None]
    for extra in ("otlp", *(["otlp-grpc"] if any(d.protocol == "grpc" for d in dests) else [])):
        missing = extras.missing_modules(extra)
        if missing:
            found.problems.append(extras.message(extra, "exporters.otlp", missing))
    for dest in dests:
        if dest.certificate and not os.path.isfile(dest.certificate):
            found.problems.append(f"exporters.otlp.certificate: {dest.certificate} is not a file ({dest.signal})")
        if _receives_itself(config, dest):
            found.warnings.append(f"exporters.otlp: {dest.describe()} is kvscope's own otlp_traces receiver; set "
                                  "exporters.otlp.endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT) to your Collector")
    correlation = config.analyses.get("correlation")
    if section.traces and (correlation is None or not correlation[0].enabled):
        found.warnings.append("exporters.otlp.traces: the correlation analysis is disabled, so no request is "
                              "attributed and no trace is exported")
    temporality = environ.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "").strip().lower()
    if section.metrics and temporality not in ("", "cumulative"):
        found.warnings.append(f"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE={temporality}: kvscope exports "
                              "cumulative sums and histograms only (a Collector's cumulativetodelta processor "
                              "converts them)")


def check(config: Config, parts: Components, environ: Mapping[str, str] | None = None) -> Findings:
    found = Findings()
    _roots(config, parts, found)
    if config.exporter(PROMETHEUS).enabled:
        _listen("exporters.prometheus.listen", config.exporter(PROMETHEUS).listen, found)
    _web(config, found)
    _jsonl(config, found)
    _otlp(config, os.environ if environ is None else environ, found)
    records_in = [n for n in ("otlp_traces",) if n in config.collectors and config.collectors[n][0].enabled]
    correlation = config.analyses.get("correlation")
    if records_in and (correlation is None or not correlation[0].enabled):
        found.warnings.append(f"collectors.{records_in[0]}: request records are received but the correlation "
                              "analysis is disabled, so nothing attributes them")
    if not any(settings.enabled for settings, _ in config.collectors.values()):
        found.warnings.append("collectors: none enabled; /metrics will show only the agent's own health")
    return found
