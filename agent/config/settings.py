"""Configuration: command-line flags, `KVSCOPE_*` environment variables, one TOML file, embedded defaults.

Precedence, highest first: a flag, then the environment, then the file, then the default. Every
section is a dataclass; the loader checks every key and type against it (binding.py), so a bad
value or an unknown key stops the agent at start with one line naming the key and what is allowed.

Environment variables use `__` between path parts: `KVSCOPE_AGENT__INTERVAL=2`,
`KVSCOPE_EXPORTERS__PROMETHEUS__LISTEN=127.0.0.1:9474`, `KVSCOPE_COLLECTORS__VLLM__ENABLED=true`,
`KVSCOPE_ANALYSES__CORRELATION__FIT_WINDOW=256`. Their text is read by the type of the option it sets.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from kvscope.agent.config.binding import ConfigError as ConfigError
from kvscope.agent.config.binding import Override, bind, env_overrides, positive, set_path
from kvscope.agent.core.pipeline import Components, SinkSpec

T = TypeVar("T")

DEFAULT_PORT = 9474  # 9100 is node_exporter, 9400 DCGM exporter, 8000 vLLM's API server
LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["logfmt", "json"]
# keys that existed once and where they went, so an old config gets a pointer instead of "unknown key"
MOVED = {
    "agent.history": "removed: the store keeps no history (see agent.stale_after)",
    "collectors.correlation": "moved to [analyses.correlation] (its requests_jsonl is [exporters.jsonl] path)",
    "collectors.agent_self": "renamed [collectors.process] (standard process_* metrics)",
}


@dataclass
class AgentSection:
    interval: float = 1.0  # default seconds between collections
    # host collectors (disk, network, rdma, nfs, lustre, gpfs, process) run when their values are read
    # (a scrape, an OTLP export, an analysis), at most once per 3/4 interval; false: on the interval
    collect_on_read: bool = True
    timeout: float = 5.0  # default seconds a collection may take before it counts as hung
    max_backoff: float = 60.0  # longest wait between retries of a failing collector
    # collections of its owner a vanished series is remembered for (its total continues if it comes back),
    # and failed collections its last values stay exported for; then it leaves /metrics and memory
    stale_after: int = 5
    proc_root: str = "/proc"
    sys_root: str = "/sys"
    log_level: LogLevel = "info"
    log_format: LogFormat = "logfmt"

    def validate(self, path: str) -> None:
        for name in ("interval", "timeout", "max_backoff"):
            positive(f"{path}.{name}", getattr(self, name))
        if self.stale_after < 1:
            raise ConfigError(f"{path}.stale_after: must be >= 1, got {self.stale_after}")


@dataclass
class JobSettings:
    """The keys every collector and analysis section has, beside its own options."""

    enabled: bool
    interval: float | None = None
    timeout: float | None = None


@dataclass
class Config:
    agent: AgentSection = field(default_factory=AgentSection)
    # each sink's options, by its spec's name (`[exporters.NAME]`): read them with `exporter(spec)`
    exporters: dict[str, Any] = field(default_factory=dict)
    collectors: dict[str, tuple[JobSettings, Any]] = field(default_factory=dict)
    analyses: dict[str, tuple[JobSettings, Any]] = field(default_factory=dict)

    def exporter(self, spec: SinkSpec[T]) -> T:
        """A sink's options: as configured, or its defaults when the loader did not know the sink."""
        options = self.exporters.get(spec.name)
        return options if isinstance(options, spec.options) else spec.options()

    def _settings(self, name: str) -> JobSettings:
        return (self.collectors.get(name) or self.analyses[name])[0]

    def interval_of(self, name: str) -> float:
        settings = self._settings(name)
        return settings.interval if settings.interval is not None else self.agent.interval

    def timeout_of(self, name: str) -> float:
        settings = self._settings(name)
        return settings.timeout if settings.timeout is not None else self.agent.timeout


def parse_listen(path: str, text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ConfigError(f"{path}: expected HOST:PORT (e.g. 0.0.0.0:{DEFAULT_PORT}), got {text!r}")
    port = int(port_text)
    if not 0 <= port < 65536:
        raise ConfigError(f"{path}: port must be 0..65535 (0 = any free port), got {port}")
    return host.strip("[]") or "0.0.0.0", port


# -- loading ------------------------------------------------------------------------------------


def _check_moved(tree: Mapping[str, Any], prefix: str = "") -> None:
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if path in MOVED:
            where = value.origin if isinstance(value, Override) else path
            raise ConfigError(f"{where}: {MOVED[path]}")
        if isinstance(value, dict):
            _check_moved(value, f"{path}.")


def _bind_jobs(kind: str, sections: Any, specs: Mapping[str, Any]) -> dict[str, tuple[JobSettings, Any]]:
    """Each spec's section: the common keys (enabled, interval, timeout) and the spec's own options."""
    if not isinstance(sections, dict):
        raise ConfigError(f"{kind}: expected a table of sections")
    for name in sections:
        if name not in specs:
            raise ConfigError(f"{kind}.{name}: unknown {kind[:-1] if kind == 'collectors' else 'analysis'} "
                              f"(allowed: {', '.join(sorted(specs))})")
    common = {f.name for f in dataclasses.fields(JobSettings)}
    out = {}
    for name, spec in specs.items():
        section = sections.get(name, {})
        path = f"{kind}.{name}"
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: expected a table")
        section = dict(section)
        settings = bind(JobSettings, {"enabled": spec.enabled_by_default,
                                      **{k: section.pop(k) for k in common if k in section}}, path)
        for key in ("interval", "timeout"):
            value = getattr(settings, key)
            if value is not None:
                positive(f"{path}.{key}", value)
        out[name] = (settings, bind(spec.options, section, path, check=settings.enabled))
    return out


def _bind_sinks(sections: Any, specs: Mapping[str, SinkSpec[Any]]) -> dict[str, Any]:
    """Each sink's `[exporters.NAME]` section, bound to its spec's options."""
    if not isinstance(sections, dict):
        raise ConfigError("exporters: expected a table of sections")
    for name in sections:
        if name not in specs:
            raise ConfigError(f"exporters.{name}: unknown exporter (allowed: {', '.join(sorted(specs))})")
    return {name: bind(spec.options, sections.get(name, {}), f"exporters.{name}") for name, spec in specs.items()}


def load_config(
    text: str | None,
    components: Components,
    environ: Mapping[str, str] | None = None,
    origin: str = "config",
    flags: Sequence[tuple[list[str], Override]] = (),
) -> Config:
    """A TOML document (None = embedded defaults), then environment overrides, then flags."""
    try:
        tree: dict[str, Any] = tomllib.loads(text) if text else {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: not valid TOML: {exc}") from None
    for parts, value in [*env_overrides(os.environ if environ is None else environ), *flags]:
        set_path(tree, parts, value)
    _check_moved(tree)

    allowed_top = {"agent", "exporters", "collectors", "analyses"}
    for key in tree:
        if key not in allowed_top:
            raise ConfigError(f"{key}: unknown section (allowed: {', '.join(sorted(allowed_top))})")
    return Config(
        agent=bind(AgentSection, tree.get("agent", {}), "agent"),
        exporters=_bind_sinks(tree.get("exporters", {}), components.sinks),
        collectors=_bind_jobs("collectors", tree.get("collectors", {}), components.collectors),
        analyses=_bind_jobs("analyses", tree.get("analyses", {}), components.analyses),
    )


def load_config_file(path: str | None, components: Components, environ: Mapping[str, str] | None = None,
                     flags: Sequence[tuple[list[str], Override]] = ()) -> Config:
    if path is None:
        return load_config(None, components, environ, flags=flags)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    return load_config(text, components, environ, origin=path, flags=flags)


# -- the embedded defaults, as a TOML document an operator can start from ----------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml_value(v)}' for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def _table(header: str, obj: Any) -> list[str]:
    lines = [f"[{header}]"]
    nested = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            nested.append((f"{header}.{f.name}", value))
        elif value is None:
            lines.append(f"# {f.name} = (unset)")
        else:
            lines.append(f"{f.name} = {_toml_value(value)}")
    out = [*lines, ""]
    for sub_header, sub in nested:
        out.extend(_table(sub_header, sub))
    return out


def defaults_toml(components: Components) -> str:
    """Every section and key with its embedded default (what `kvscope run` uses with no file)."""
    lines = ["# kvscope configuration: every key with its default. Remove what you do not change.", ""]
    lines += _table("agent", AgentSection())
    for name, sink in components.sinks.items():
        lines.append(f"# {sink.description}")
        lines.extend(_table(f"exporters.{name}", sink.options()))
    for kind, specs in (("collectors", components.collectors), ("analyses", components.analyses)):
        for name, spec in specs.items():
            lines.append(f"# {spec.description}")
            lines.append(f"[{kind}.{name}]")
            lines.append(f"enabled = {_toml_value(spec.enabled_by_default)}")
            lines.append("# interval = (agent.interval)")
            lines.append("# timeout = (agent.timeout)")
            lines.extend(_table(f"{kind}.{name}", spec.options())[1:])
    return "\n".join(lines)
