"""NVML calls for the NVML collector, with NVML's errors turned into data.

No NVML error gets past `NvmlCalls.call`: not supported (also function-not-found, and an error without
a code) becomes `UNSUPPORTED`, logged once at info; NVML_ERROR_NOT_FOUND becomes `NOT_FOUND`; any other
error becomes `FAILED`, counted per call on the GPU (``kvscope_gpu_nvml_errors_total``) and logged
once. The one exception is NVML_ERROR_GPU_IS_LOST, raised as `GpuLost` for the collector to mark the
GPU lost. `nvmlDeviceGetFieldValues` answers with an error per entry; `field_entries` sorts those the
same way.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import Any

from kvscope.collectors.gpu.samples import VALUE_ATTR, GpuState

log = logging.getLogger("kvscope.collectors.nvml")

UNSUPPORTED, FAILED, NOT_FOUND = object(), object(), object()

# NVML field id constant -> the key the collector keeps that field's value under
FIELD_KEYS = {
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": "pcie_tx",
    "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": "pcie_rx",
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": "nvlink_tx",
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX": "nvlink_rx",
}


class GpuLost(Exception):
    pass


def missing(value: object) -> bool:
    return value is UNSUPPORTED or value is FAILED or value is NOT_FOUND


def text(value: object) -> str:
    if missing(value):
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlCalls:
    """The injected NVML module (None: not installed), its error classes, and what was logged once."""

    def __init__(self, nvml: Any | None) -> None:
        self.nvml = nvml
        errors: list[type[BaseException]] = []
        if nvml is not None:
            errors.append(nvml.NVMLError)
            mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)  # unversioned call on an old driver
            if isinstance(mismatch, type):
                errors.append(mismatch)
        self.errors = tuple(errors)
        self._logged: set[Hashable] = set()

    def first_time(self, key: Hashable) -> bool:
        """True the first time `key` is asked about: log a kind of problem once, not every poll."""
        if key in self._logged:
            return False
        self._logged.add(key)
        return True

    def log_once(self, key: Hashable, level: int, message: str, *args: object) -> None:
        if self.first_time(key):
            log.log(level, message, *args)

    def call(self, gpu: GpuState, fn: str, *args: Any) -> Any:
        """One NVML call; NVML errors become sentinels (GPU_IS_LOST raises GpuLost)."""
        nvml: Any = self.nvml
        try:
            return getattr(nvml, fn)(*args)
        except self.errors as exc:
            code = getattr(exc, "value", None)
            if code == nvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost from exc
            if code == nvml.NVML_ERROR_NOT_FOUND:
                return NOT_FOUND
            if code in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND) or code is None:
                self.log_once((gpu.label, fn, "unsupported"), logging.INFO,
                              "nvml: GPU %s: %s is not supported (%s)", gpu.label, fn, type(exc).__name__)
                return UNSUPPORTED
            gpu.errors[fn] = gpu.errors.get(fn, 0) + 1
            self.log_once((gpu.label, fn, code), logging.WARNING, "nvml: GPU %s: %s failed: %s (%s)",
                          gpu.label, fn, type(exc).__name__, exc)
            return FAILED

    def field_entries(self, gpu: GpuState, answer: Any) -> tuple[list[tuple[str, float, int]], list[str]]:
        """The (key, raw value, value type) of the field entries that succeeded, and the keys not supported;
        a failed entry is counted and logged like a failed call."""
        nvml: Any = self.nvml
        keys = {getattr(nvml, name): key for name, key in FIELD_KEYS.items()}
        good, unsupported = [], []
        for entry in answer:
            key, code = keys.get(int(entry.fieldId)), int(entry.nvmlReturn)
            if key is None:
                continue
            if code == nvml.NVML_SUCCESS:
                value_type = int(entry.valueType)
                good.append((key, float(getattr(entry.value, VALUE_ATTR.get(value_type, ""))), value_type))
            elif code == nvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost
            elif code in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                unsupported.append(key)
            else:
                call = f"nvmlDeviceGetFieldValues:{key}"
                gpu.errors[call] = gpu.errors.get(call, 0) + 1
                self.log_once((gpu.label, call, code), logging.WARNING,
                              "nvml: GPU %s: field %s failed with NVML error %d", gpu.label, key, code)
        return good, unsupported
