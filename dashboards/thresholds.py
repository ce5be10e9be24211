"""How a panel colours its numbers: thresholds read from the alert rules, so a panel turns red where an
alert fires, and value mappings for the 0/1 panels (up or down, a signal raised or not).

A panel without one of these gets NEUTRAL: Grafana's default (green, red from 80) would paint a rate
red at any real load and a "No" green.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

ALERTS = Path(__file__).resolve().parent / "rules" / "kvscope.alerts.yml"
_LAST_COMPARISON = re.compile(r"(?s).*\S\s*>\s*([0-9.]+(?:e[+-]?[0-9]+)?)")


@dataclass(frozen=True, slots=True)
class Look:
    """Threshold steps over a base colour (value, colour), and value -> (text, colour) mappings."""

    base: str
    steps: tuple[tuple[float, str], ...] = ()
    mappings: tuple[tuple[int, str, str], ...] = ()
    alert: str = ""  # the alert the steps come from, named in the panel's description


NEUTRAL = Look("text")
UP = Look("red", ((1, "green"),), ((0, "Down", "red"), (1, "Up", "green")))
RAISED = Look("green", ((1, "red"),), ((0, "No", "green"), (1, "Yes", "red")))


@cache
def _alert_expressions() -> dict[str, str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def alert_threshold(alert: str) -> float:
    """The number an alert compares its value with: `... > 0.8` gives 0.8."""
    match = _LAST_COMPARISON.fullmatch(_alert_expressions()[alert].strip())
    if match is None:
        raise ValueError(f"{alert}: its expression does not end in `> <number>`")
    return float(match.group(1))


def above(alert: str) -> Look:
    """Green below the alert's threshold, red from it."""
    return Look("green", ((alert_threshold(alert), "red"),), alert=alert)
