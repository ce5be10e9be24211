"""Checks a PromQL expression against kvscope's metric catalogue and its recording rules.

Every metric an expression selects must be a catalogued metric (histograms by their _bucket, _sum and
_count series), a recording rule, or one of Prometheus' own series (`up`). Labels are checked too: the
labels a selector matches on and the ones `by`, `without`, `on` and `ignoring` name must exist on the
expression below them. Each sub-expression's possible labels are inferred from the catalogue (plus the
target labels Prometheus adds), through functions, aggregations and binary operators; a recording
rule's labels are inferred from its own expression and its `labels:`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import promql_parser as pp

from kvscope.agent.core.catalogue import Catalogue

# labels Prometheus adds to every scraped series (static/file SD, and the prometheus-operator's PodMonitor),
# and `node`, which kvscope's PodMonitor and ServiceMonitor add (the node the pod runs on)
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "container", "endpoint", "node"})
PROMETHEUS_SERIES = {"up": TARGET_LABELS}
_VARIABLE = re.compile(r"\$\{?(\w+)\}?")
DEFAULT_STEP = 15  # seconds: Grafana's step for a 1 h range over a panel's width (15 s scrapes)


def grafana_macros(step: int = DEFAULT_STEP, scrape_interval: int = 15) -> dict[str, str]:
    """Grafana's macros for a panel asked at `step` seconds (a 1 h range at its default width: 15 s, or the
    panel's min interval when longer): $__rate_interval is max(step + scrape interval, 4 × scrape interval)."""
    return {"$__rate_interval": f"{max(step + scrape_interval, 4 * scrape_interval)}s", "$__interval": f"{step}s",
            "$__range": "1h"}


def substitute(expr: str, variables: Mapping[str, str] | None = None, step: int = DEFAULT_STEP) -> str:
    """The expression as Prometheus receives it: macros replaced (for a query asked at `step` seconds),
    template variables by `.*` (All)."""
    for macro, value in grafana_macros(step).items():
        expr = expr.replace(macro, value)
    chosen = variables or {}
    return _VARIABLE.sub(lambda m: chosen.get(m.group(1), ".*"), expr)


def catalogue_labels(catalogue: Catalogue) -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = dict(PROMETHEUS_SERIES)
    for spec in catalogue:
        labels = frozenset(spec.labels) | TARGET_LABELS
        if spec.type == "histogram":
            out[f"{spec.name}_bucket"] = labels | {"le"}
            out[f"{spec.name}_sum"] = labels
            out[f"{spec.name}_count"] = labels
        else:
            out[spec.name] = labels
    return out


@dataclass
class Checker:
    """Label inference over the catalogue plus recording rules (name -> list of (expr, extra labels))."""

    metrics: dict[str, frozenset[str]]
    rules: dict[str, list[tuple[str, frozenset[str]]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    _rule_labels: dict[str, frozenset[str]] = field(default_factory=dict)

    def check(self, expr: str) -> list[str]:
        """Problems in `expr` (already substituted); empty when it parses and every name and label exists."""
        self.problems = []
        try:
            ast = pp.parse(expr)
        except ValueError as exc:
            return [f"does not parse: {exc}"]
        self.labels(ast)
        return self.problems

    def names(self, expr: str) -> set[str]:
        found: set[str] = set()

        def visit(node: object) -> None:
            if isinstance(node, pp.VectorSelector) and node.name:
                found.add(node.name)

        pp.walk(pp.parse(expr), visit)
        return found

    def metric(self, name: str) -> frozenset[str]:
        if name in self.metrics:
            return self.metrics[name]
        if name in self.rules:
            if name not in self._rule_labels:
                self._rule_labels[name] = frozenset()  # recursion guard
                outer, self.problems = self.problems, []
                labels: frozenset[str] = frozenset()
                for text, extra in self.rules[name]:
                    labels |= self.labels(pp.parse(text)) | extra
                self.problems = outer + [f"in rule {name}: {p}" for p in self.problems]
                self._rule_labels[name] = labels
            return self._rule_labels[name]
        self.problems.append(f"metric {name} is neither catalogued nor recorded")
        return frozenset()

    def _need(self, wanted: list[str], have: frozenset[str], where: str) -> None:
        missing = sorted(set(wanted) - have)
        if missing:
            self.problems.append(f"{where} names {missing}, not among {sorted(have)}")

    def labels(self, node: object) -> frozenset[str]:
        if isinstance(node, pp.VectorSelector):
            have = self.metric(node.name) if node.name else frozenset()
            used = [m.name for m in node.matchers.matchers if m.name != "__name__"]
            self._need(used, have, f"selector {node.name}")
            return have
        if isinstance(node, pp.MatrixSelector):
            return self.labels(node.vector_selector)
        if isinstance(node, (pp.ParenExpr, pp.UnaryExpr, pp.SubqueryExpr)):
            return self.labels(node.expr)
        if isinstance(node, (pp.NumberLiteral, pp.StringLiteral)):
            return frozenset()
        if isinstance(node, pp.Call):
            return self._call(node)
        if isinstance(node, pp.AggregateExpr):
            inner = self.labels(node.expr)
            if node.param is not None:
                self.labels(node.param)
            op = str(node.op)
            mod = node.modifier
            if mod is not None:
                self._need(list(mod.labels), inner, f"{op} {'by' if mod.type == pp.AggModifierType.By else 'without'}")
            if op in ("topk", "bottomk", "limitk"):
                return inner
            if mod is None:
                return frozenset()
            return frozenset(mod.labels) if mod.type == pp.AggModifierType.By else inner - set(mod.labels)
        if isinstance(node, pp.BinaryExpr):
            return self._binary(node)
        raise TypeError(f"unhandled PromQL node {type(node).__name__}")

    def _call(self, node: pp.Call) -> frozenset[str]:
        name = node.func.name
        args = [self.labels(a) for a in node.args]
        if name == "histogram_quantile":
            return args[1] - {"le"}
        if name in ("label_replace", "label_join"):
            target = node.args[1].val
            return args[0] | {target}
        if name in ("vector", "time", "scalar", "pi"):
            return frozenset()
        return args[0] if args else frozenset()

    def _binary(self, node: pp.BinaryExpr) -> frozenset[str]:
        left, right = self.labels(node.lhs), self.labels(node.rhs)
        op = str(node.op)
        mod = node.modifier
        matching = mod.matching if mod is not None else None
        if matching is not None and left and right:
            listed = list(matching.labels)
            if matching.type == pp.LabelModifierType.Include:  # on(...)
                self._need(listed, left, f"'{op} on' (left)")
                self._need(listed, right, f"'{op} on' (right)")
            else:
                self._need(listed, left | right, f"'{op} ignoring'")
        if op == "or":
            return left | right
        if not left:
            return right
        if mod is not None and mod.card == pp.VectorMatchCardinality.ManyToOne:
            return left | frozenset(mod.group_labels)
        if mod is not None and mod.card == pp.VectorMatchCardinality.OneToMany:
            return right | frozenset(mod.group_labels)
        return left


def rules_by_name(groups: list[dict[str, object]]) -> dict[str, list[tuple[str, frozenset[str]]]]:
    """Recording rule name -> its (expression, labels set by `labels:`) pairs, from parsed rule files."""
    out: dict[str, list[tuple[str, frozenset[str]]]] = {}
    for group in groups:
        for rule in group["rules"]:  # type: ignore[attr-defined]
            if "record" in rule:
                out.setdefault(rule["record"], []).append((rule["expr"], frozenset(rule.get("labels", {}))))
    return out
