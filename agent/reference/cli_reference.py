"""`kvscope reference serve|scenario`: filled in with the engine."""

from __future__ import annotations

from typing import Any


def add_reference_commands(sub: Any) -> None:
    sub.add_parser("reference", help="the reference tier pipeline (engine, scenarios)")
