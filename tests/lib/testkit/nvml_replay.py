"""Recorded NVML: a recorder that wraps the real ``pynvml`` module and a replay that answers from JSON.

The collector is handed an NVML *module* (anything with pynvml's function names, constants and
exception classes). In production that is ``pynvml``; ``scripts/gpu_check.py`` wraps it in
`NvmlRecorder`, which writes every call and its answer (or error code) as JSON; the tests hand the
collector an `NvmlReplay` fed from such JSON, hand-written or recorded on a real GPU. Both sides use
one format, so a recording from a real machine can be checked in as a fixture unchanged.

Format (``"format": "kvscope-nvml-recording/1"``)::

    {"format": ..., "origin": "what produced it",   # "poll": index into "polls" (recordings only)
     "calls": [{"fn": "nvmlDeviceGetSamples", "args": [{"handle": 0}, 1, 0],
                "result": {"valueType": 1, "samples": [[1754000000166666, 37]]}},
               {"fn": "nvmlDeviceGetSamples", "args": [{"handle": 0}, 1, 1754000000166666], "error": 6}, ...],
     "defaults": {"nvmlDeviceGetPciInfo": {"error": 3}},      # optional: any args
     "polls": [{"clock": 100.0, "wall": 1754000001.0}, ...]}  # optional: the collector's clocks per poll

A handle is ``{"handle": <index or uuid>}``. A union value is stored as the number in the member its
``valueType`` names. Calls with the same function and arguments are answered in recorded order; the
last answer repeats once they run out. A call that was never recorded raises `ReplayMiss`, which is
not an NVML error, so a test notices instead of the collector treating it as "not supported".

It lives in tests/, not in the package: the sidecar never records or replays NVML. No third-party
imports: the GPU check runs this with only torch and nvidia-ml-py installed.
"""

from __future__ import annotations

import ctypes
import json
import string
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from kvscope.collectors.gpu.samples import VALUE_ATTR

FORMAT = "kvscope-nvml-recording/1"

# The subset of pynvml's constants the collector and its tests use (values from pynvml.py 13.615.71;
# a test holds them equal to the installed pynvml).
CONSTANTS: dict[str, int] = {
    "NVML_SUCCESS": 0,
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_ALREADY_INITIALIZED": 5,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_INSUFFICIENT_SIZE": 7,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_RESET_REQUIRED": 16,
    "NVML_ERROR_NO_DATA": 21,
    "NVML_ERROR_UNKNOWN": 999,
    "NVML_GPU_UTILIZATION_SAMPLES": 1,
    "NVML_PCIE_UTIL_TX_BYTES": 0,
    "NVML_PCIE_UTIL_RX_BYTES": 1,
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": 138,
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX": 139,
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": 197,
    "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": 198,
    "NVML_VALUE_TYPE_DOUBLE": 0,
    "NVML_VALUE_TYPE_UNSIGNED_INT": 1,
    "NVML_VALUE_TYPE_UNSIGNED_LONG": 2,
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": 3,
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": 4,
    "NVML_DEVICE_MIG_DISABLE": 0,
    "NVML_DEVICE_MIG_ENABLE": 1,
}


class ReplayMiss(LookupError):
    """The collector made a call the recording has no answer for."""


class NVMLError(Exception):
    """Mirrors pynvml.NVMLError: ``NVMLError(code)`` builds the subclass for that code; ``.value`` is the code."""

    _by_code: dict[int, type[NVMLError]] = {}  # noqa: RUF012 - filled once below, like pynvml's
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return f"NVML error {self.value}"


def _error_classes() -> dict[str, type[NVMLError]]:
    classes: dict[str, type[NVMLError]] = {}
    for name, code in CONSTANTS.items():
        if not name.startswith("NVML_ERROR_"):
            continue
        # NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost, as pynvml's _extractNVMLErrorsAsClasses does
        class_name = "NVMLError_" + string.capwords(name[len("NVML_ERROR_"):], "_").replace("_", "")
        cls = type(class_name, (NVMLError,), {"__new__": _fixed_new(code)})
        NVMLError._by_code[code] = cls
        classes[class_name] = cls
    return classes


def _fixed_new(code: int) -> Callable[..., NVMLError]:
    def new(cls: type[NVMLError], *_args: object) -> NVMLError:
        return NVMLError.__new__(cls, code)

    return new


ERROR_CLASSES = _error_classes()


class ReplayHandle:
    """A device handle in a replay; equal handles have equal keys (an index, or a UUID)."""

    __slots__ = ("key",)

    def __init__(self, key: int | str) -> None:
        self.key = key

    def __repr__(self) -> str:
        return f"ReplayHandle({self.key!r})"


def union_value(value_type: int, number: float | int | None) -> SimpleNamespace:
    """A stand-in for c_nvmlValue_t with only the member ``value_type`` names: reading another one fails."""
    return SimpleNamespace(**{VALUE_ATTR[value_type]: number if number is not None else 0})


def _args_key(fn: str, args: list[Any]) -> str:
    return json.dumps([fn, args], sort_keys=True)


class NvmlReplay:
    """Answers NVML calls from a recording; exposes pynvml's names, constants and exception classes."""

    NVMLError = NVMLError

    def __init__(self, recording: dict[str, Any]) -> None:
        if recording.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} recording: format={recording.get('format')!r}")
        self._answers: dict[str, list[dict[str, Any]]] = {}
        for call in recording["calls"]:
            self._answers.setdefault(_args_key(call["fn"], call["args"]), []).append(call)
        self._defaults: dict[str, dict[str, Any]] = dict(recording.get("defaults", {}))
        self._next: dict[str, int] = {}
        self.calls: list[tuple[str, list[Any]]] = []  # every call made, for tests to inspect
        self.polls: list[dict[str, float]] = list(recording.get("polls", []))
        for name, value in CONSTANTS.items():
            setattr(self, name, value)
        for name, cls in ERROR_CLASSES.items():
            setattr(self, name, cls)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if not name.startswith("nvml"):
            raise AttributeError(name)

        def call(*args: Any) -> Any:
            return self._answer(name, [_to_json(a, {}) for a in args])

        return call

    def _answer(self, fn: str, args: list[Any]) -> Any:
        self.calls.append((fn, args))
        key = _args_key(fn, args)
        answers = self._answers.get(key)
        if answers:
            index = self._next.get(key, 0)
            self._next[key] = index + 1
            answer = answers[min(index, len(answers) - 1)]
        elif fn in self._defaults:
            answer = self._defaults[fn]
        else:
            raise ReplayMiss(f"no recorded answer for {fn}{tuple(args)}")
        if "error" in answer:
            raise NVMLError(int(answer["error"]))
        return _from_json(fn, answer.get("result"))


def _from_json(fn: str, result: Any) -> Any:
    if fn == "nvmlDeviceGetSamples":
        vt = int(result["valueType"])
        return vt, [SimpleNamespace(timeStamp=int(ts), sampleValue=union_value(vt, v)) for ts, v in result["samples"]]
    if fn == "nvmlDeviceGetFieldValues":
        return [
            SimpleNamespace(**{**entry, "value": union_value(int(entry["valueType"]), entry["value"])})
            for entry in result
        ]
    return _plain_from_json(result)


def _plain_from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"handle"}:
            return ReplayHandle(value["handle"])
        return SimpleNamespace(**{k: _plain_from_json(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_plain_from_json(v) for v in value]
    return value


def _to_json(value: Any, handles: dict[int, Any]) -> Any:
    """JSON form of an argument or result (handles by key, ctypes structures as dicts)."""
    if isinstance(value, ReplayHandle):
        return {"handle": value.key}
    if id(value) in handles:
        return {"handle": handles[id(value)][1]}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, list | tuple):
        return [_to_json(v, handles) for v in value]
    if isinstance(value, ctypes.Structure):
        return {name: _to_json(getattr(value, name), handles) for name, *_ in value._fields_}
    if isinstance(value, ctypes.Array):
        return [_to_json(v, handles) for v in value]
    if isinstance(value, ctypes.Union):
        return None  # only meaningful with its valueType; the callers below read it
    if hasattr(value, "__dict__"):  # pynvml's nvmlFriendlyObject, SimpleNamespace
        return {k: _to_json(v, handles) for k, v in vars(value).items()}
    return repr(value)


class NvmlRecorder:
    """Wraps an NVML module; records every ``nvml*`` call as JSON in the replay format."""

    def __init__(self, inner: Any, origin: str) -> None:
        self._inner = inner
        self.origin = origin
        self.calls: list[dict[str, Any]] = []
        self.polls: list[dict[str, float]] = []
        self._handles: dict[int, tuple[Any, int | str]] = {}  # id -> (object kept alive, key)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not (name.startswith("nvml") and callable(attr)):
            return attr  # constants and exception classes pass through

        def call(*args: Any) -> Any:
            json_args = [_to_json(a, self._handles) for a in args]
            entry: dict[str, Any] = {"fn": name, "args": json_args, "poll": len(self.polls)}
            self.calls.append(entry)
            try:
                result = attr(*args)
            except self._inner.NVMLError as exc:
                entry["error"] = int(getattr(exc, "value", CONSTANTS["NVML_ERROR_UNKNOWN"]))
                raise
            if name in ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByUUID") and args:
                self._handles[id(result)] = (result, args[0])
            entry["result"] = self._result_json(name, result)
            return result

        return call

    def _result_json(self, fn: str, result: Any) -> Any:
        if fn == "nvmlDeviceGetSamples":
            vt, samples = result
            attr = VALUE_ATTR[int(vt)]
            pairs = [[int(s.timeStamp), getattr(s.sampleValue, attr)] for s in samples]
            return {"valueType": int(vt), "samples": pairs}
        if fn == "nvmlDeviceGetFieldValues":
            out = []
            for entry in result:
                ok = int(entry.nvmlReturn) == CONSTANTS["NVML_SUCCESS"]
                vt = int(entry.valueType)
                number = getattr(entry.value, VALUE_ATTR[vt]) if ok and vt in VALUE_ATTR else None
                out.append({
                    "fieldId": int(entry.fieldId), "scopeId": int(entry.scopeId), "timestamp": int(entry.timestamp),
                    "latencyUsec": int(entry.latencyUsec), "valueType": vt, "nvmlReturn": int(entry.nvmlReturn),
                    "value": number,
                })
            return out
        return _to_json(result, self._handles)

    def mark_poll(self, clock: float, wall: float) -> None:
        self.polls.append({"clock": clock, "wall": wall})

    def recording(self) -> dict[str, Any]:
        return {"format": FORMAT, "origin": self.origin, "calls": self.calls, "polls": self.polls}
