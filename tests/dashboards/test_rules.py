"""The recording and alert rules: promtool accepts them (lint included), their promtool unit tests pass,
every alert is written for an operator and tested both ways, and every name they use exists.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvscope.agent.app.wiring import build_catalogue
from testkit.environment import require_tool
from testkit.paths import ROOT
from testkit.promql_names import Checker, catalogue_labels, rules_by_name

RULES = ROOT / "dashboards" / "rules"
RULE_FILES = sorted(RULES.glob("*.yml"))
TESTS = sorted((RULES / "tests").glob("*.test.yml"))


def _groups() -> list[dict[str, Any]]:
    return [g for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"]]


def _alerts() -> list[dict[str, Any]]:
    return [r for g in _groups() for r in g["rules"] if "alert" in r]


def test_promtool_checks_the_rule_files_with_lint() -> None:
    promtool = require_tool("promtool")
    proc = subprocess.run([promtool, "check", "rules", "--lint=all", "--lint-fatal", *map(str, RULE_FILES)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("test_file", TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(test_file: Path) -> None:
    promtool = require_tool("promtool")
    proc = subprocess.run([promtool, "test", "rules", test_file.name], cwd=test_file.parent,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_the_alert_tests_load_every_rule_file() -> None:
    (alert_tests,) = (p for p in TESTS if "alerts" in p.name)
    loaded = {(alert_tests.parent / f).resolve() for f in yaml.safe_load(alert_tests.read_text())["rule_files"]}
    assert {p.resolve() for p in RULE_FILES} == loaded


def test_every_alert_has_for_severity_summary_and_where_to_look() -> None:
    alerts = _alerts()
    assert len(alerts) >= 8
    for rule in alerts:
        name = rule["alert"]
        assert name.startswith("KVScope"), name
        assert rule.get("for"), f"{name}: no `for`"
        assert rule.get("labels", {}).get("severity") in ("warning", "critical"), name
        notes = rule.get("annotations", {})
        assert notes.get("summary"), f"{name}: no summary"
        description = notes.get("description", "")
        assert "Look at" in description, f"{name}: the description must say where to look"


def test_every_alert_is_tested_firing_and_silent() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for test_file in TESTS:
        for case in yaml.safe_load(test_file.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check["exp_alerts"] else silent).add(check["alertname"])
    names = {r["alert"] for r in _alerts()}
    assert names - firing == set(), "alerts never shown firing"
    assert names - silent == set(), "alerts never shown silent"


def test_every_metric_and_label_in_the_rules_exists() -> None:
    checker = Checker(catalogue_labels(build_catalogue()), rules_by_name(_groups()))
    problems = []
    for group in _groups():
        for rule in group["rules"]:
            name = rule.get("record") or rule.get("alert")
            problems += [f"{name}: {p}" for p in checker.check(rule["expr"])]
    assert problems == []


def test_the_checker_catches_an_unknown_metric_and_a_wrong_label() -> None:
    checker = Checker(catalogue_labels(build_catalogue()), rules_by_name(_groups()))
    assert checker.check("rate(kvscope_kv_hit_tokens_total[5m])") == []
    assert checker.check('rate(kvscope_kv_hit_tokenz_total{tier="G1"}[5m])') != []
    assert checker.check('rate(kvscope_kv_lookup_tokens_total{tier="G1"}[5m])') != []  # lookups have no tier
    assert checker.check("sum by (teir) (kvscope:kv_hit_tokens:rate5m)") != []
    assert checker.check("kvscope:kv_served_share:ratio_rate5m / on(gpu) kvscope:kv_lookup_tokens:rate5m") != []
    assert checker.check("sum by (tier) (kvscope:kv_conditional_hit_ratio:rate5m)") == []
    assert checker.check("sum(rate(x[5m]) by") != []
