"""The recording and alert rules: promtool accepts them (lint included), their promtool unit tests pass,
every alert is written for an operator, tested both ways and has a runbook, every name they use exists, and
the site file ships no facts about anyone's storage.
"""

from __future__ import annotations

import re
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
SITE_EXAMPLE = RULES / "examples" / "kvscope-site.rules.yml"
TESTS = sorted((RULES / "tests").glob("*.test.yml"))
RUNBOOKS = ROOT / "docs" / "runbooks.md"
CAPACITY = "kvscope:tier_fetch_capacity_bytes_per_second"


def _groups(paths: list[Path] = RULE_FILES) -> list[dict[str, Any]]:
    return [g for path in paths for g in yaml.safe_load(path.read_text())["groups"]]


def _checker() -> Checker:
    """The catalogue's labels plus `cluster`, which a multi-cluster setup (external labels, Thanos, Mimir)
    puts on every series; the site example's rule defines the capacity the shipped site file leaves out."""
    metrics = {name: labels | {"cluster"} for name, labels in catalogue_labels(build_catalogue()).items()}
    return Checker(metrics, rules_by_name(_groups([*RULE_FILES, SITE_EXAMPLE])))


def _alerts() -> list[dict[str, Any]]:
    return [r for g in _groups() for r in g["rules"] if "alert" in r]


def test_promtool_checks_the_rule_files_with_lint() -> None:
    promtool = require_tool("promtool")
    proc = subprocess.run([promtool, "check", "rules", "--lint=all", "--lint-fatal", *map(str, RULE_FILES),
                           str(SITE_EXAMPLE)],
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
        assert notes.get("runbook_url") == f"docs/runbooks.md#{name.lower()}", f"{name}: no runbook_url"


def _runbook_sections() -> dict[str, str]:
    """docs/runbooks.md's `## <alert>` sections by GitHub's anchor for the heading (lower case)."""
    parts = re.split(r"^## (\S+)\n", RUNBOOKS.read_text(), flags=re.MULTILINE)
    return {title.lower(): body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


def test_every_runbook_url_leads_to_a_runbook_that_says_what_it_means_how_to_confirm_and_what_to_do() -> None:
    sections = _runbook_sections()
    for rule in _alerts():
        anchor = rule["annotations"]["runbook_url"].partition("#")[2]
        assert anchor in sections, f"{rule['alert']}: no section `## {rule['alert']}` in docs/runbooks.md"
        for part in ("**What it means**", "**Confirm it**", "**What to do**"):
            assert part in sections[anchor], f"{rule['alert']}: its runbook has no {part}"
    assert set(sections) == {r["alert"].lower() for r in _alerts()}, "runbooks for alerts that do not exist"


def test_the_site_file_ships_no_capacity_and_the_example_gives_the_seeds_g4() -> None:
    shipped = [r for g in _groups([RULES / "kvscope-site.rules.yml"]) for r in g["rules"]]
    assert shipped == [], "kvscope-site.rules.yml is the operator's: it ships no bandwidth"
    (example,) = (r for g in _groups([SITE_EXAMPLE]) for r in g["rules"])
    assert example == {"record": CAPACITY, "expr": "vector(315e9)", "labels": {"tier": "G4"}}
    users = [r.get("record") or r["alert"] for r in (r for g in _groups() for r in g["rules"]) if CAPACITY in r["expr"]]
    assert users == ["tier:kvscope_kv_fetch_utilisation:ratio_rate5m"], "the capacity is read by one rule only"


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
    checker = _checker()
    problems = []
    for group in _groups():
        for rule in group["rules"]:
            name = rule.get("record") or rule.get("alert")
            problems += [f"{name}: {p}" for p in checker.check(rule["expr"])]
    assert problems == []


def test_the_checker_catches_an_unknown_metric_and_a_wrong_label() -> None:
    checker = _checker()
    assert checker.check("rate(kvscope_kv_hit_tokens_total[5m])") == []
    assert checker.check('rate(kvscope_kv_hit_tokenz_total{tier="G1"}[5m])') != []
    assert checker.check('rate(kvscope_kv_lookup_tokens_total{tier="G1"}[5m])') != []  # lookups have no tier
    assert checker.check("sum by (teir) (kvscope:kv_hit_tokens:rate5m)") != []
    assert checker.check("kvscope:kv_served_share:ratio_rate5m / on(gpu) kvscope:kv_lookup_tokens:rate5m") != []
    assert checker.check("sum by (tier) (kvscope:kv_conditional_hit_ratio:rate5m)") == []
    assert checker.check("sum(rate(x[5m]) by") != []
