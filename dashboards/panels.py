"""The few shapes every kvscope dashboard is made of, on Grafana's Foundation SDK.

Every panel here requires a title, a description (what the number means and where it comes from) and a
unit, so no dashboard can ship a panel without them, and gets explicit thresholds (dashboards/thresholds.py).
Queries go to the dashboard's `datasource` variable; the filters below put the template variables into
every selector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from grafana_foundation_sdk.builders import bargauge, common, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

from kvscope.dashboards.thresholds import NEUTRAL, Look

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")

# selector filters with the template variables: cluster (an external or relabelled label, where there are
# several) and namespace (the PodMonitor's) narrow every query; instance is the agent's pod; engine, model
# and tier as exported
SCOPE = 'cluster=~"$cluster", namespace=~"$namespace"'
HOST = f'{SCOPE}, instance=~"$instance"'
ENGINE = f'{HOST}, engine=~"$engine", model=~"$model"'
# series recorded over every pod of a model (model:… rules): no instance label to select by
MODEL_ENGINE = f'{SCOPE}, engine=~"$engine", model=~"$model"'
TIER = 'tier=~"$tier"'
# tiers every pod of a cluster shares: each pod reports all of one, so it is counted once per cluster
SHARED_TIERS = "G4"

PanelBuilder = Builder[dm.Panel]


@dataclass(frozen=True, slots=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False


def _targets(panel: timeseries.Panel | stat.Panel | bargauge.Panel, queries: Sequence[Query]) -> None:
    for i, q in enumerate(queries):
        target = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i))
        if q.legend:
            target = target.legend_format(q.legend)
        if q.instant:
            target = target.instant()
        panel.with_target(target)


def _check(title: str, description: str, unit: str, queries: Sequence[Query]) -> None:
    if not description.strip() or not unit or not queries:
        raise ValueError(f"panel {title!r}: a description, a unit and at least one query are required")


P = TypeVar("P", timeseries.Panel, stat.Panel, bargauge.Panel)


def _look(panel: P, look: Look) -> P:
    steps = [dm.Threshold(value=None, color=look.base)] + [dm.Threshold(value=v, color=c) for v, c in look.steps]
    panel = panel.thresholds(dashboard.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps))
    if look.mappings:
        panel = panel.mappings([dm.ValueMap({str(value): dm.ValueMappingResult(text=text, color=color, index=i)
                                             for i, (value, text, color) in enumerate(look.mappings)})])
    return panel


def tier_total(metric: str, selector: str) -> str:
    """A gauge per tier over the selected pods: the pods' own tiers summed, a tier they share counted once
    per cluster (the largest any of its pods reports), not once per pod."""
    return (f'sum by (tier) ({metric}{{{selector}, tier!~"{SHARED_TIERS}"}})'
            f' or sum by (tier) (max by (cluster, tier) ({metric}{{{selector}, tier=~"{SHARED_TIERS}"}}))')


def timeseries_panel(title: str, description: str, unit: str, queries: Sequence[Query], *, span: int = 12,
                     height: int = 8, stack: bool = False, percent_max: bool = False,
                     negative: Sequence[int] = (), dashed: Sequence[int] = (), log_scale: bool = False,
                     right_axis: dict[int, str] | None = None, look: Look = NEUTRAL,
                     min_interval: str | None = None) -> timeseries.Panel:
    """A time series. `negative`: indexes of queries drawn below zero (the other direction of a flow);
    `dashed`: indexes drawn as dashed lines (limits, thresholds); `right_axis`: index -> unit on the right;
    `look`: thresholds (drawn as a dashed line when they come from an alert) and value mappings;
    `min_interval`: the shortest step Grafana asks the panel's queries for (its "Min interval"), e.g. "1m" for
    a series recorded once a minute, or for one whose every point is a pass over many series per pod
    (docs/dashboards.md#fleet-scale)."""
    _check(title, description, unit, queries)
    panel = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
             .span(span).height(height).line_width(1).fill_opacity(10 if not stack else 60)
             .legend(common.VizLegendOptions().show_legend(True).display_mode(cm.LegendDisplayMode.LIST)
                     .placement(cm.LegendPlacement.BOTTOM).calcs([])))
    if stack:
        panel = panel.stacking(common.StackingConfig().mode(cm.StackingMode.NORMAL).group("A"))
    if min_interval:
        panel = panel.interval(min_interval)
    if percent_max:
        panel = panel.min(0).max(1)
    if log_scale:
        panel = panel.scale_distribution(common.ScaleDistributionConfig().type(cm.ScaleDistribution.LOG).log(10))
    panel = _look(panel, look)
    if look.alert:
        panel = panel.thresholds_style(common.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED))
    _targets(panel, queries)
    for i in negative:
        panel = panel.override_by_query(chr(ord("A") + i), [
            dm.DynamicConfigValue(id_val="custom.transform", value=cm.GraphTransform.NEGATIVE_Y.value)])
    for i in dashed:
        panel = panel.override_by_query(chr(ord("A") + i), [
            dm.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
            dm.DynamicConfigValue(id_val="custom.fillOpacity", value=0)])
    for i, axis_unit in (right_axis or {}).items():
        panel = panel.override_by_query(chr(ord("A") + i), [
            dm.DynamicConfigValue(id_val="unit", value=axis_unit),
            dm.DynamicConfigValue(id_val="custom.axisPlacement", value="right")])
    return panel


def stat_panel(title: str, description: str, unit: str, queries: Sequence[Query], *, span: int = 6,
               height: int = 5, decimals: int | None = None, look: Look = NEUTRAL) -> stat.Panel:
    _check(title, description, unit, queries)
    panel = _look(stat.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
                  .span(span).height(height).graph_mode(cm.BigValueGraphMode.AREA)
                  .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False)), look)
    if decimals is not None:
        panel = panel.decimals(decimals)
    _targets(panel, queries)
    return panel


def bargauge_panel(title: str, description: str, unit: str, queries: Sequence[Query], *, span: int = 12,
                   height: int = 8) -> bargauge.Panel:
    _check(title, description, unit, queries)
    panel = _look(bargauge.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
                  .span(span).height(height).orientation(cm.VizOrientation.HORIZONTAL)
                  .display_mode(cm.BarGaugeDisplayMode.GRADIENT).min(0)
                  .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False)), NEUTRAL)
    _targets(panel, queries)
    return panel


def variables(*names: str) -> list[Builder[dm.VariableModel]]:
    """The datasource variable, then the named label variables, each narrowed by the ones before it."""
    out: list[Builder[dm.VariableModel]] = [
        dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")]
    sources = {"cluster": ("Cluster", "kvscope_build_info"),
               "namespace": ("Namespace", "kvscope_build_info"),
               "instance": ("Pod / instance", "kvscope_build_info"),
               "engine": ("Engine", "kvscope_kv_lookup_tokens_total"),
               "model": ("Model", "kvscope_kv_lookup_tokens_total"),
               "tier": ("Tier", "kvscope_kv_hit_tokens_total")}
    before: list[str] = []
    for name in names:
        label, metric = sources[name]
        narrow = ", ".join(f'{b}=~"${b}"' for b in before)
        selector = f"{metric}{{{narrow}}}" if narrow else metric
        out.append(dashboard.QueryVariable(name).label(label).datasource(DATASOURCE)
                   .query(f"label_values({selector}, {name})")
                   .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).multi(True).include_all(True)
                   .all_value(".*").sort(dm.VariableSort.ALPHABETICAL_ASC))
        if name != "tier":
            before.append(name)
    return out


Row = tuple[str, Sequence[PanelBuilder]]


def build_dashboard(title: str, uid: str, description: str, variable_names: Sequence[str],
                    rows: Sequence[Row]) -> dm.Dashboard:
    """The dashboard with the cluster and namespace variables, then `variable_names`, then the rows."""
    board = (dashboard.Dashboard(title).uid(uid).description(description).tags(["kvscope"])
             .time("now-1h", "now").refresh("30s").timezone("browser").editable())
    for variable in variables("cluster", "namespace", *variable_names):
        board = board.with_variable(variable)
    for row_title, panels in rows:
        board = board.with_row(dashboard.Row(row_title))
        for panel in panels:
            board = board.with_panel(panel)
    return board.build()
