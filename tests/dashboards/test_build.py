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
    groups = [g for name in RULE_FILES for g in yaml.safe_load((RULES / name).read_text())["groups"]]
    return Checker(catalogue_labels(build_catalogue()), rules_by_name(groups))


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

    for board in ("kvscope-tiers", "kvscope-ttft"):
        assert names(f"dashboards/grafana/{board}.json") == ["datasource", "instance", "engine", "model", "tier"]
    assert names("dashboards/grafana/kvscope-hardware.json") == ["datasource", "instance", "tier"]
    assert names("dashboards/grafana/kvscope-agent.json") == ["datasource", "instance", "engine", "model"]
    assert names("dashboards/grafana/kvscope-fleet.json") == ["datasource", "model", "tier"]
    for path in BOARDS:  # a variable used in a query is defined on its dashboard
        board = _load(path)
        defined = set(names(path)) | {"__rate_interval", "__interval", "__range"}
        used = {m for p in _panels(board) for t in p["targets"] for m in re.findall(r"\$\{?(\w+)", t["expr"])}
        assert used <= defined, (path, used - defined)


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
        if label not in checker.labels(__import__("promql_parser").parse(selector)):
            problems.append(f"variable {variable['name']}: {label} is not a label of {selector}")
    assert problems == []


def test_the_prometheus_rule_carries_every_rule_file() -> None:
    resource = yaml.safe_load((ROOT / PROMETHEUS_RULE).read_text())
    groups = [g for name in RULE_FILES for g in yaml.safe_load((RULES / name).read_text())["groups"]]
    assert resource["spec"]["groups"] == groups
    assert {p.name for p in RULES.glob("*.yml")} == set(RULE_FILES)
