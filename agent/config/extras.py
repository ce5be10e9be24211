"""The optional parts of kvscope (`pip install 'kvscope[EXTRA]'`) and one clear line when one is missing.

The sidecar's runtime set is what every inference pod carries; what only some features need is an
extra. A feature checks its extra before it starts, so a missing package is one line naming the
extra to install, never a `ModuleNotFoundError` traceback halfway through.
"""

from __future__ import annotations

import importlib.util

# extra -> the modules it provides (import names) and what needs it
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "web": (("yaml", "bcrypt"), "a web config file (TLS, basic auth)"),
    "reference": (("numpy", "xxhash", "opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http", "matplotlib"),
                  "the reference pipeline, self-test, demo and report charts"),
    "otlp": (("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"), "OTLP export over HTTP"),
    "otlp-grpc": (("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.grpc", "grpc"), "OTLP export over gRPC"),
}


class MissingExtra(RuntimeError):
    """A feature needs an extra that is not installed; the message is the one line to show."""


def missing_modules(extra: str) -> list[str]:
    modules, _ = EXTRAS[extra]
    out = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing, or a broken install
            found = False
        if not found:
            out.append(name)
    return out


def message(extra: str, feature: str, missing: list[str]) -> str:
    return (f"{feature} needs the '{extra}' extra ({', '.join(missing)} not installed): "
            f"pip install 'kvscope[{extra}]'")


def require(extra: str, feature: str) -> None:
    """Raises MissingExtra naming the extra when any of its modules cannot be imported."""
    missing = missing_modules(extra)
    if missing:
        raise MissingExtra(message(extra, feature, missing))
