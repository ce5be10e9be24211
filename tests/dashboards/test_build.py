"""The dashboards as generated: committed and fresh, valid for Grafana 11.6, every panel with a unit and a
description, every query parsed and naming only metrics and labels that exist.

The schemas are the Grafana 11.6 JSON schemas published with the Foundation SDK (tests/fixtures/schemas,
see its README): the dashboard and panel envelope, each panel type's options and field config, and the
Prometheus query.
"""

from __future__ import annotations

import json
import re
from typing import Any

import promql_parser
import pytest
import yaml
from jsonschema import Draft7Validator
from jsonschema.exceptions import best_match

from kvscope.agent.app.wiring import build_catalogue
from kvscope.dashboards.build import DASHBOARDS, PROMETHEUS_RULE, RULE_FILES, render
from testkit.paths import ROOT
from testkit.promql_names import Checker, catalogue_labels, rules_by_name, substitute

SCHEMAS = ROOT / "tests" / "fixtures" / "schemas" / "grafana-11.6"
RULES = ROOT / "dashboards" / "rules"
PANEL_TYPES = ("timeseries", "stat", "bargauge")


def _load(relative: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / relative).read_text())
    return data


def _schema(name: str, definition: str | None = None) -> Draft7Validator:
    schema = json.loads((SCHEMAS / f"{name}.jsonschema.json").read_text())
    if name == "dashboard":
        # Grafana's dashboard kind types a field override's matcher options and property values as `_`
        # (anything): Grafana writes a string for byFrameRefID and for custom.transform, as the SDK does.
        # The generated JSON schema narrowed both to objects; widen them back, nothing else.
        definitions = schema["definitions"]
        definitions["MatcherConfig"]["properties"]["options"] = {}
        definitions["DynamicConfigValue"]["properties"]["value"] = {}
        # A threshold's first step has no value (-Infinity), which Grafana and the SDK write as null, as the
        # schema's own description of the field says; the generated type left null out.
        definitions["Threshold"]["properties"]["value"] = {"type": ["number", "null"]}
    if definition is not None:
        schema = {"$ref": f"#/definitions/{definition}", "definitions": schema["definitions"]}
    return Draft7Validator(schema)


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in board["panels"]:
        out += [panel, *panel.get("panels", [])]
    return [p for p in out if p["type"] != "row"]


def _errors(validator: Draft7Validator, instance: Any) -> list[str]:
    out = []
    for error in validator.iter_errors(instance):
        if error.context and isinstance(error.instance, dict):  # anyOf(Panel, RowPanel): the branch by type
            branch = 1 if error.instance.get("type") == "row" else 0
            error = best_match([c for c in error.context if c.relative_schema_path[0] == branch]) or error
        out.append(f"{'/'.join(map(str, error.absolute_path)) or '<root>'}: {error.message[:200]}")
    return out


def _checker() -> Checker:
    """The catalogue's labels plus `cluster` (an external or relabelled label where there are several);
    the site example defines the capacity rule the shipped site file leaves to the operator."""
    files = [RULES / name for name in RULE_FILES] + [RULES / "examples" / "kvscope-site.rules.yml"]
    groups = [g for path in files for g in yaml.safe_load(path.read_text())["groups"]]
    metrics = {name: labels | {"cluster"} for name, labels in catalogue_labels(build_catalogue()).items()}
    return Checker(metrics, rules_by_name(groups))


BOARDS = sorted(DASHBOARDS)


def test_the_committed_files_are_what_make_dashboards_writes() -> None:
    stale = [path for path, text in render().items() if not (ROOT / path).exists() or (ROOT / path).read_text() != text]
    assert stale == [], f"run `make dashboards`: {stale}"


def test_the_five_dashboards() -> None:
    titles = {_load(p)["title"] for p in BOARDS}
    assert titles == {"kvscope / KV tiers overview", "kvscope / TTFT attribution", "kvscope / Hardware path",
                      "kvscope / Agent health", "kvscope / Fleet and shared tier"}
    assert len({_load(p)["uid"] for p in BOARDS}) == len(BOARDS)


@pytest.mark.parametrize("path", BOARDS)
def test_valid_against_grafanas_dashboard_schema(path: str) -> None:
    board = _load(path)
    assert board["schemaVersion"] == 41  # Grafana 11.6
    assert _errors(_schema("dashboard"), board) == []


@pytest.mark.parametrize("path", BOARDS)
def test_panel_options_field_config_and_queries_valid(path: str) -> None:
    query = _schema("prometheus")
    problems = []
    for panel in _panels(_load(path)):
        kind = panel["type"]
        assert kind in PANEL_TYPES, f"vendor the {kind} schema before using that panel type"
        problems += [f"{panel['title']} options {e}" for e in _errors(_schema(kind, "Options"), panel["options"])]
        custom = panel["fieldConfig"]["defaults"].get("custom")
        if custom is not None:
            problems += [f"{panel['title']} custom {e}" for e in _errors(_schema(kind, "FieldConfig"), custom)]
        for target in panel["targets"]:
            problems += [f"{panel['title']} {target['refId']} {e}" for e in _errors(query, target)]
    assert problems == []


def test_the_schema_check_catches_a_broken_panel() -> None:
    board = _load(BOARDS[0])
    board["panels"][1]["gridPos"]["w"] = "6"
    board["panels"][2]["titel"] = "typo"
    assert len(_errors(_schema("dashboard"), board)) == 2
    assert _errors(_schema("timeseries", "Options"), {"legend": {"displayMode": "huge"}}) != []


@pytest.mark.parametrize("path", BOARDS)
def test_every_panel_has_a_unit_a_description_and_the_datasource_variable(path: str) -> None:
    for panel in _panels(_load(path)):
        title = panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{title}: no unit"
        assert len(panel.get("description", "")) > 60, f"{title}: say what the number means and where it comes from"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert panel["targets"], title


def test_template_variables() -> None:
    def names(path: str) -> list[str]:
        return [v["name"] for v in _load(path)["templating"]["list"]]

    scope = ["datasource", "cluster", "namespace"]
    for board in ("kvscope-tiers", "kvscope-ttft"):
        assert names(f"dashboards/grafana/{board}.json") == [*scope, "instance", "engine", "model", "tier"]
    assert names("dashboards/grafana/kvscope-hardware.json") == [*scope, "instance", "tier"]
    assert names("dashboards/grafana/kvscope-agent.json") == [*scope, "instance", "engine", "model"]
    assert names("dashboards/grafana/kvscope-fleet.json") == [*scope, "model", "tier"]
    for path in BOARDS:  # a variable used in a query is defined on its dashboard
        board = _load(path)
        defined = set(names(path)) | {"__rate_interval", "__interval", "__range"}
        used = {m for p in _panels(board) for t in p["targets"] for m in re.findall(r"\$\{?(\w+)", t["expr"])}
        assert used <= defined, (path, used - defined)
        for panel in _panels(board):  # every query is narrowed by cluster (but a site fact: one per Prometheus)
            for target in panel["targets"]:
                expr = target["expr"]
                assert "$cluster" in expr or "tier_fetch_capacity" in expr, (path, panel["title"])


@pytest.mark.parametrize("path", BOARDS)
def test_every_query_parses_and_names_only_metrics_and_labels_that_exist(path: str) -> None:
    checker = _checker()
    problems = []
    for panel in _panels(_load(path)):
        for target in panel["targets"]:
            problems += [f"{panel['title']} {target['refId']}: {p}" for p in checker.check(substitute(target["expr"]))]
    for variable in _load(path)["templating"]["list"]:
        query = variable.get("query")
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
        assert match, query
        selector, label = substitute(match.group(1)), match.group(2)
        problems += [f"variable {variable['name']}: {p}" for p in checker.check(selector)]
        if label not in checker.labels(promql_parser.parse(selector)):
            problems.append(f"variable {variable['name']}: {label} is not a label of {selector}")
    assert problems == []


def test_the_prometheus_rule_carries_every_rule_file() -> None:
    resource = yaml.safe_load((ROOT / PROMETHEUS_RULE).read_text())
    groups = [g for name in RULE_FILES for g in yaml.safe_load((RULES / name).read_text())["groups"]]
    assert resource["spec"]["groups"] == groups
    assert {p.name for p in RULES.glob("*.yml")} == set(RULE_FILES)


def _alert_thresholds() -> dict[str, float]:
    """Each alert whose expression ends in `> <number>`, with that number (read with promql-parser)."""
    out = {}
    for group in yaml.safe_load((RULES / "kvscope.alerts.yml").read_text())["groups"]:
        for rule in group["rules"]:
            ast = promql_parser.parse(rule["expr"])
            if isinstance(ast, promql_parser.BinaryExpr) and isinstance(ast.rhs, promql_parser.NumberLiteral):
                out[rule["alert"]] = ast.rhs.val
    return out


def _steps(panel: dict[str, Any]) -> list[tuple[float | None, str]]:
    return [(s["value"], s["color"]) for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]


@pytest.mark.parametrize("path", BOARDS)
def test_every_panel_sets_its_thresholds_and_red_means_an_alert_or_down(path: str) -> None:
    """No panel keeps Grafana's default (green, red from 80): a red step is an alert's threshold, named in
    the panel's description, or the 1 of a 0/1 panel whose value mappings say what 0 and 1 mean."""
    thresholds = _alert_thresholds()
    for panel in _panels(_load(path)):
        title, steps = panel["title"], _steps(panel)
        assert steps != [(None, "green"), (80, "red")], f"{title}: Grafana's default thresholds"
        assert steps[0][0] is None, title
        red = [value for value, color in steps if color == "red" and value is not None]
        if not red:
            continue
        mappings = {k: v for m in panel["fieldConfig"]["defaults"].get("mappings", []) for k, v in m["options"].items()}
        if red == [1]:
            assert {"0", "1"} <= set(mappings), f"{title}: a 0/1 panel needs value mappings"
            assert {mappings["0"]["color"], mappings["1"]["color"]} == {"red", "green"}, title
            continue
        named = [name for name in thresholds if name in panel["description"]]
        assert len(named) == 1, f"{title}: red from {red} names no alert"
        assert red == [thresholds[named[0]]], f"{title}: red from {red}, {named[0]} fires above {thresholds[named[0]]}"


def test_up_panels_read_up_green_and_down_red_and_the_alert_thresholds_are_drawn() -> None:
    panels = {p["title"]: p for path in BOARDS for p in _panels(_load(path))}
    for title in ("Collectors and analyses up", "Engine endpoints answering", "Prometheus scraping kvscope"):
        (mapping,) = panels[title]["fieldConfig"]["defaults"]["mappings"]
        assert mapping["options"]["0"]["text"] == "Down" and mapping["options"]["0"]["color"] == "red", title
        assert mapping["options"]["1"]["text"] == "Up" and mapping["options"]["1"]["color"] == "green", title
    assert _steps(panels["Lookups per second"]) == [(None, "text")]
    assert _steps(panels["Shared tier load"]) == [(None, "green"), (0.8, "red")]
    assert _steps(panels["Tier path utilisation"]) == [(None, "green"), (0.9, "red")]
    assert panels["Tier path utilisation"]["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"] == {"mode": "dashed"}
