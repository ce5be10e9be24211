"""The few shapes every kvscope dashboard is made of, on Grafana's Foundation SDK.

Every panel here requires a title, a description (what the number means and where it comes from) and a
unit, so no dashboard can ship a panel without them. Queries go to the dashboard's `datasource`
variable; the filters below put the template variables into every selector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import bargauge, common, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")

# selector filters with the template variables (instance is the agent's pod; engine, model, tier as exported)
HOST = 'instance=~"$instance"'
ENGINE = 'instance=~"$instance", engine=~"$engine", model=~"$model"'
TIER = 'tier=~"$tier"'

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


def timeseries_panel(title: str, description: str, unit: str, queries: Sequence[Query], *, span: int = 12,
                     height: int = 8, stack: bool = False, percent_max: bool = False,
                     negative: Sequence[int] = (), dashed: Sequence[int] = (), log_scale: bool = False,
                     right_axis: dict[int, str] | None = None) -> timeseries.Panel:
    """A time series. `negative`: indexes of queries drawn below zero (the other direction of a flow);
    `dashed`: indexes drawn as dashed lines (limits, thresholds); `right_axis`: index -> unit on the right."""
    _check(title, description, unit, queries)
    panel = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
             .span(span).height(height).line_width(1).fill_opacity(10 if not stack else 60)
             .legend(common.VizLegendOptions().show_legend(True).display_mode(cm.LegendDisplayMode.LIST)
                     .placement(cm.LegendPlacement.BOTTOM).calcs([])))
    if stack:
        panel = panel.stacking(common.StackingConfig().mode(cm.StackingMode.NORMAL).group("A"))
    if percent_max:
        panel = panel.min(0).max(1)
    if log_scale:
        panel = panel.scale_distribution(common.ScaleDistributionConfig().type(cm.ScaleDistribution.LOG).log(10))
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
               height: int = 5, decimals: int | None = None) -> stat.Panel:
    _check(title, description, unit, queries)
    panel = (stat.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
             .span(span).height(height).graph_mode(cm.BigValueGraphMode.AREA)
             .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    if decimals is not None:
        panel = panel.decimals(decimals)
    _targets(panel, queries)
    return panel


def bargauge_panel(title: str, description: str, unit: str, queries: Sequence[Query], *, span: int = 12,
                   height: int = 8) -> bargauge.Panel:
    _check(title, description, unit, queries)
    panel = (bargauge.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
             .span(span).height(height).orientation(cm.VizOrientation.HORIZONTAL)
             .display_mode(cm.BarGaugeDisplayMode.GRADIENT).min(0)
             .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    _targets(panel, queries)
    return panel


def variables(*names: str) -> list[Builder[dm.VariableModel]]:
    """The datasource variable, then the named label variables, each narrowed by the ones before it."""
    out: list[Builder[dm.VariableModel]] = [
        dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")]
    sources = {"instance": ("Pod / instance", "kvscope_build_info"),
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
    board = (dashboard.Dashboard(title).uid(uid).description(description).tags(["kvscope"])
             .time("now-1h", "now").refresh("30s").timezone("browser").editable())
    for variable in variables(*variable_names):
        board = board.with_variable(variable)
    for row_title, panels in rows:
        board = board.with_row(dashboard.Row(row_title))
        for panel in panels:
            board = board.with_panel(panel)
    return board.build()
