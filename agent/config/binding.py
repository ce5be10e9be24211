"""Binding configuration values to typed dataclasses: TOML tables, environment variables and flags.

Every configuration section is a dataclass. `bind` checks every key and type against it, so a bad
value or an unknown key stops the agent with one line naming the key and what is allowed.

Values from the environment and from command-line flags arrive as text (`Override`); they are read
by the type of the option they set, not guessed: a string option takes the text as it is (so
`KVSCOPE_COLLECTORS__OTLP_TRACES__DP_RANK=1` is the string "1", and a date-like string stays a
string), numbers and booleans are parsed, and lists and tables accept a TOML array / inline table
or, for lists, comma-separated items.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class ConfigError(ValueError):
    """A configuration problem, worded for the operator (one line, names the key)."""


class Override(str):
    """A text value from the environment or a flag; `origin` names where it came from."""

    origin: str

    def __new__(cls, text: str, origin: str) -> Override:
        value = super().__new__(cls, text)
        value.origin = origin
        return value


def positive(path: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{path}: must be > 0, got {value}")


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is list:
        return f"a list of {type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"a table of {type_name(typing.get_args(tp)[1])}"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _from_text(tp: Any, text: Override) -> Any:
    """The value `text` stands for as type `tp`; raises ValueError when it does not parse as one."""
    origin = typing.get_origin(tp)
    if origin is list:
        stripped = text.strip()
        if stripped.startswith("["):
            return tomllib.loads(f"v = {stripped}")["v"]
        return [Override(item.strip(), text.origin) for item in stripped.split(",") if item.strip()]
    if origin is dict:
        return tomllib.loads(f"v = {text.strip()}")["v"]
    if tp is bool:
        word = text.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise ValueError(text)
    if tp is int:
        return int(text.strip())
    if tp is float:
        return float(text.strip())
    return text  # str and Literal of strings: the text as it is (still naming its origin)


def _where(path: str, value: Any) -> str:
    return f"{value.origin} ({path})" if isinstance(value, Override) else path


def coerce(path: str, tp: Any, value: Any) -> Any:
    """`value` as type `tp`; text from the environment or a flag is parsed by the type first (a union tries
    each of its types in turn, in `_coerce`)."""
    union = typing.get_origin(tp) in (types.UnionType, typing.Union)
    dataclass_type = isinstance(tp, type) and dataclasses.is_dataclass(tp)
    if isinstance(value, Override) and tp is not str and not union and not dataclass_type:
        try:
            value = _from_text(tp, value)
        except (ValueError, tomllib.TOMLDecodeError):
            raise ConfigError(f"{_where(path, value)}: expected {type_name(tp)}, got {str(value)!r}") from None
    return _coerce(path, tp, value)


def _coerce(path: str, tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp):
            return str(value) if isinstance(value, Override) else value
    elif origin in (types.UnionType, typing.Union):
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            try:
                return coerce(path, arg, value)
            except ConfigError:
                continue
    elif origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, list):
            return [coerce(f"{path}[{i}]", item, v) for i, v in enumerate(value)]
    elif origin is dict:
        _, item = typing.get_args(tp)
        if isinstance(value, dict):
            return {str(k): coerce(f"{path}.{k}", item, v) for k, v in value.items()}
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, dict):
            return bind(tp, value, path)
        raise ConfigError(f"{_where(path, value)}: expected a table, got {type(value).__name__}")
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
        return str(value)
    shown = str(value) if isinstance(value, Override) else value
    raise ConfigError(f"{_where(path, value)}: expected {type_name(tp)}, got {shown!r}")


def bind(cls: type, table: Mapping[str, Any], path: str, check: bool = True) -> Any:
    """Build dataclass `cls` from a table, rejecting unknown keys and wrong types.

    `check=False` skips the dataclass's own `validate` (a disabled collector's options).
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in table:
        if key not in fields:
            allowed = ", ".join(sorted(fields)) or "(none)"
            raise ConfigError(f"{path}.{key}: unknown key (allowed: {allowed})")
    values = {name: coerce(f"{path}.{name}", hints[name], table[name]) for name in table}
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


def set_path(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    """Sets `value` at `parts` in a TOML tree, creating tables on the way."""
    for part in parts[:-1]:
        node = tree.setdefault(part, {})
        if not isinstance(node, dict):
            where = value.origin if isinstance(value, Override) else ".".join(parts)
            raise ConfigError(f"{where}: {part} is not a table")
        tree = node
    tree[parts[-1]] = value


def env_overrides(environ: Mapping[str, str], prefix: str = "KVSCOPE_") -> list[tuple[list[str], Override]]:
    """`KVSCOPE_A__B__C=text` → (["a", "b", "c"], text): `__` separates the parts of a key's path."""
    out = []
    for key, raw in sorted(environ.items()):
        if not key.startswith(prefix) or "__" not in key:
            continue
        parts = [p.lower() for p in key[len(prefix):].split("__")]
        out.append((parts, Override(raw, key)))
    return out
