"""Configuration: one TOML file, `KVSCOPE_*` environment overrides, embedded defaults.

Every section is a dataclass; the loader checks every key and type against it, so a bad value or
an unknown key stops the agent at start with one line naming the key and what is allowed.

Environment overrides use `__` between path parts: `KVSCOPE_AGENT__INTERVAL=2`,
`KVSCOPE_EXPORTERS__PROMETHEUS__LISTEN=127.0.0.1:9474`, `KVSCOPE_COLLECTORS__VLLM__ENABLED=true`.
A value is read as a TOML value when it parses as one (numbers, booleans, `["a","b"]`), else as a string.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kvscope.collectors.base import CollectorSpec

DEFAULT_PORT = 9474  # 9100 is node_exporter, 9400 DCGM exporter, 8000 vLLM's API server


class ConfigError(ValueError):
    """A configuration problem, worded for the operator (one line, names the key)."""


def positive(path: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{path}: must be > 0, got {value}")


@dataclass
class AgentSection:
    interval: float = 1.0  # default seconds between collections
    timeout: float = 5.0  # default seconds a collection may take before it counts as hung
    max_backoff: float = 60.0  # longest wait between retries of a failing collector
    history: int = 600  # points of history kept per series
    proc_root: str = "/proc"
    sys_root: str = "/sys"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    def validate(self, path: str) -> None:
        for name in ("interval", "timeout", "max_backoff"):
            positive(f"{path}.{name}", getattr(self, name))
        if self.history < 2:
            raise ConfigError(f"{path}.history: must be >= 2, got {self.history}")


@dataclass
class PrometheusSection:
    enabled: bool = True
    listen: str = f"0.0.0.0:{DEFAULT_PORT}"
    # Prometheus exporter-toolkit web config (tls_server_config, basic_auth_users); "" = plain HTTP
    web_config_file: str = ""

    def validate(self, path: str) -> None:
        parse_listen(f"{path}.listen", self.listen)


@dataclass
class ExportersSection:
    prometheus: PrometheusSection = field(default_factory=PrometheusSection)


@dataclass
class CollectorSettings:
    """The keys every collector section has, beside its own options."""

    enabled: bool
    interval: float | None = None
    timeout: float | None = None


@dataclass
class Config:
    agent: AgentSection = field(default_factory=AgentSection)
    exporters: ExportersSection = field(default_factory=ExportersSection)
    collectors: dict[str, tuple[CollectorSettings, Any]] = field(default_factory=dict)

    def interval_of(self, name: str) -> float:
        settings = self.collectors[name][0]
        return settings.interval if settings.interval is not None else self.agent.interval

    def timeout_of(self, name: str) -> float:
        settings = self.collectors[name][0]
        return settings.timeout if settings.timeout is not None else self.agent.timeout


def parse_listen(path: str, text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ConfigError(f"{path}: expected HOST:PORT (e.g. 0.0.0.0:{DEFAULT_PORT}), got {text!r}")
    port = int(port_text)
    if not 0 <= port < 65536:
        raise ConfigError(f"{path}: port must be 0..65535 (0 = any free port), got {port}")
    return host.strip("[]") or "0.0.0.0", port


# -- generic dataclass binding ------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"a table of {_type_name(typing.get_args(tp)[1])}"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _coerce(path: str, tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
    elif origin in (types.UnionType, typing.Union):
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            try:
                return _coerce(path, arg, value)
            except ConfigError:
                continue
    elif origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, list):
            return [_coerce(f"{path}[{i}]", item, v) for i, v in enumerate(value)]
    elif origin is dict:
        _, item = typing.get_args(tp)
        if isinstance(value, dict):
            return {str(k): _coerce(f"{path}.{k}", item, v) for k, v in value.items()}
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, dict):
            return bind(tp, value, path)
        raise ConfigError(f"{path}: expected a table, got {type(value).__name__}")
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is str and isinstance(value, str):
        return value
    raise ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}")


def bind(cls: type, table: Mapping[str, Any], path: str, check: bool = True) -> Any:
    """Build dataclass `cls` from a TOML table, rejecting unknown keys and wrong types.

    `check=False` skips the dataclass's own `validate` (a disabled collector's options).
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in table:
        if key not in fields:
            allowed = ", ".join(sorted(fields)) or "(none)"
            raise ConfigError(f"{path}.{key}: unknown key (allowed: {allowed})")
    values = {name: _coerce(f"{path}.{name}", hints[name], table[name]) for name in table}
    try:
        obj = cls(**values)
    except TypeError as exc:  # a required option missing
        raise ConfigError(f"{path}: {exc}") from None
    validate = getattr(obj, "validate", None) if check else None
    if validate is not None:
        try:
            validate(path)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    return obj


# -- loading ------------------------------------------------------------------------------------


def _set_path(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    for part in parts[:-1]:
        node = tree.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{'.'.join(parts)}: {part} is not a table")
        tree = node
    tree[parts[-1]] = value


def env_overrides(environ: Mapping[str, str]) -> list[tuple[list[str], Any]]:
    out = []
    for key, raw in sorted(environ.items()):
        if not key.startswith("KVSCOPE_") or "__" not in key:
            continue
        parts = [p.lower() for p in key[len("KVSCOPE_"):].split("__")]
        try:
            value: Any = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        out.append((parts, value))
    return out


def load_config(
    text: str | None,
    specs: Mapping[str, CollectorSpec],
    environ: Mapping[str, str] | None = None,
    origin: str = "config",
) -> Config:
    """Parse a TOML document (None = embedded defaults) plus environment overrides."""
    try:
        tree: dict[str, Any] = tomllib.loads(text) if text else {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: not valid TOML: {exc}") from None
    for parts, value in env_overrides(os.environ if environ is None else environ):
        _set_path(tree, parts, value)

    allowed_top = {"agent", "exporters", "collectors"}
    for key in tree:
        if key not in allowed_top:
            raise ConfigError(f"{key}: unknown section (allowed: {', '.join(sorted(allowed_top))})")
    config = Config(
        agent=bind(AgentSection, tree.get("agent", {}), "agent"),
        exporters=bind(ExportersSection, tree.get("exporters", {}), "exporters"),
    )
    sections = tree.get("collectors", {})
    if not isinstance(sections, dict):
        raise ConfigError("collectors: expected a table of collector sections")
    for name in sections:
        if name not in specs:
            raise ConfigError(f"collectors.{name}: unknown collector (allowed: {', '.join(sorted(specs))})")
    common = {f.name for f in dataclasses.fields(CollectorSettings)}
    for name, spec in specs.items():
        section = dict(sections.get(name, {}))
        path = f"collectors.{name}"
        settings = bind(
            CollectorSettings,
            {"enabled": spec.enabled_by_default, **{k: section.pop(k) for k in common if k in section}},
            path,
        )
        for key in ("interval", "timeout"):
            value = getattr(settings, key)
            if value is not None:
                positive(f"{path}.{key}", value)
        options = bind(spec.options, section, path, check=settings.enabled)
        config.collectors[name] = (settings, options)
    return config


def load_config_file(path: str | None, specs: Mapping[str, CollectorSpec],
                     environ: Mapping[str, str] | None = None) -> Config:
    if path is None:
        return load_config(None, specs, environ)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    return load_config(text, specs, environ, origin=path)


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


def defaults_toml(specs: Mapping[str, CollectorSpec]) -> str:
    """Every section and key with its embedded default (what `kvscope run` uses with no file)."""
    lines = ["# kvscope configuration: every key with its default. Remove what you do not change.", ""]
    lines += _table("agent", AgentSection())
    lines += _table("exporters.prometheus", PrometheusSection())
    for name, spec in specs.items():
        lines.append(f"# {spec.description}")
        lines.append(f"[collectors.{name}]")
        lines.append(f"enabled = {_toml_value(spec.enabled_by_default)}")
        lines.append("# interval = (agent.interval)")
        lines.append("# timeout = (agent.timeout)")
        lines.extend(_table("x", spec.options())[1:])
    return "\n".join(lines)
