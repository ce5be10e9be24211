"""Binding configuration values to typed dataclasses: TOML tables, environment variables and flags.

Every configuration section is a dataclass. `bind` checks every key and type against it, so a bad
value or an unknown key stops the agent with one line naming the key and what is allowed. The types
are checked and converted by `msgspec.convert` (strictly: a file's `size = 1.5` is not an integer);
this module refuses unknown keys, which msgspec would ignore, reads text by type, and words
msgspec's errors (`... - at $.http.workers`) with kvscope's key paths.

Values from the environment and from command-line flags arrive as text (`Override`); they are read
by the type of the option they set, not guessed: a string option takes the text as it is (so
`KVSCOPE_COLLECTORS__OTLP_TRACES__DP_RANK=1` is the string "1", and a date-like string stays a
string), numbers and booleans are parsed, and lists and tables accept a TOML array / inline table
or, for lists, comma-separated items.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_MISSING = re.compile(r"Object missing required field `(\w+)`")
_STEP = re.compile(r"\.(\w+)|\[(\d+)\]|\[\.\.\.\]")  # one step of msgspec's `$.a[0][...]`: field, index, dict value


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


def bind(cls: type, table: Mapping[str, Any], path: str, check: bool = True) -> Any:
    """Build dataclass `cls` from a table, rejecting unknown keys and wrong types.

    `check=False` skips the dataclass's own `validate` (a disabled collector's options); the tables
    inside it are still validated.
    """
    obj = _convert(_prepared_table(cls, table, path), cls, path)
    _validate(obj, path, check)
    return obj


def _where(path: str, origin: str) -> str:
    return f"{origin} ({path})" if origin else path


def _prepared_table(cls: type, table: Any, path: str) -> dict[str, Any]:
    """`table` checked for unknown keys (at every depth) and its text values parsed, ready for msgspec."""
    if not isinstance(table, Mapping):
        if isinstance(table, Override):
            raise ConfigError(f"{_where(path, table.origin)}: expected a table, got {str(table)!r}")
        raise ConfigError(f"{path}: expected a table, got {type(table).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    for key in table:
        if key not in fields:
            raise ConfigError(f"{path}.{key}: unknown key (allowed: {', '.join(sorted(fields)) or '(none)'})")
    return {key: _prepared(hints[key], value, f"{path}.{key}") for key, value in table.items()}


def _prepared(tp: Any, value: Any, path: str) -> Any:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _prepared_table(tp, value, path)
    if isinstance(value, Override):
        return _from_text(tp, value, path)
    if typing.get_origin(tp) is dict and isinstance(value, dict):  # may hold overrides: KVSCOPE_..__TIERS__DISK
        item = typing.get_args(tp)[1]
        return {key: _prepared(item, v, f"{path}.{key}") for key, v in value.items()}
    return value


def _from_text(tp: Any, text: Override, path: str) -> Any:
    """The value `text` stands for as type `tp` (an optional option as its type: text cannot unset it)."""
    tp = _without_none(tp)
    origin = typing.get_origin(tp)
    try:
        if origin is list:
            value: Any = _list_from_text(text)
        elif origin is dict:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        elif tp is bool:
            word = text.strip().lower()
            value = (word in _TRUE) if word in _TRUE | _FALSE else str(text)  # msgspec refuses other words
        else:  # str and Literal take the text as it is; msgspec parses numbers from it
            value = str(text) if tp is str or origin is Literal else text.strip()
    except tomllib.TOMLDecodeError:
        raise ConfigError(f"{_where(path, text.origin)}: expected {type_name(tp)}, got {str(text)!r}") from None
    return _convert(value, tp, path, text.origin, strict=False)


def _list_from_text(text: str) -> list[Any]:
    """A TOML array (`["a", "b"]`) or comma-separated items (`a, b`)."""
    stripped = text.strip()
    if stripped.startswith("["):
        return list(tomllib.loads(f"v = {stripped}")["v"])
    return [item.strip() for item in stripped.split(",") if item.strip()]


def _without_none(tp: Any) -> Any:
    """`X` for `X | None`; any other type as it is."""
    if typing.get_origin(tp) not in (types.UnionType, typing.Union):
        return tp
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if len(args) == 1 else tp


def _convert(value: Any, tp: Any, path: str, origin: str = "", strict: bool = True) -> Any:
    """`value` as `tp` by msgspec; its error worded as kvscope's, at the key it is about."""
    try:
        return msgspec.convert(value, tp, strict=strict)
    except msgspec.ValidationError as exc:
        message, _, at = str(exc).partition(" - at `$")
        path, tp, value = _located(at.rstrip("`"), tp, value, path, strict)
        missing = _MISSING.match(message)
        if missing:
            raise ConfigError(f"{_where(f'{path}.{missing[1]}', origin)}: required key not set") from None
        raise ConfigError(f"{_where(path, origin)}: expected {type_name(tp)}, got {value!r}") from None


def _located(at: str, tp: Any, value: Any, path: str, strict: bool) -> tuple[str, Any, Any]:
    """The key path, type and value msgspec's location `at` (`.http.workers`, `[2]`, `[...]`) points to.

    msgspec does not name a table's key (`[...]`): it is the first whose value does not convert.
    """
    for step in _STEP.finditer(at):
        field, index = step.groups()
        tp = _without_none(tp)
        if field:
            tp, value, path = typing.get_type_hints(tp)[field], value[field], f"{path}.{field}"
        elif index:
            tp, value, path = typing.get_args(tp)[0], value[int(index)], f"{path}[{index}]"
        else:
            tp = typing.get_args(tp)[1]
            key = next(k for k, v in value.items() if not _converts(v, tp, strict))
            value, path = value[key], f"{path}.{key}"
    return path, tp, value


def _converts(value: Any, tp: Any, strict: bool) -> bool:
    try:
        msgspec.convert(value, tp, strict=strict)
    except msgspec.ValidationError:
        return False
    return True


def _validate(obj: Any, path: str, check: bool) -> None:
    """Runs the `validate(path)` of `obj`'s tables, inner ones first, then (when `check`) its own."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            _validate(value, f"{path}.{f.name}", check=True)
    validate = getattr(obj, "validate", None) if check else None
    if validate is not None:
        try:
            validate(path)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(f"{path}: {exc}") from None


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
