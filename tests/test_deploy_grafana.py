"""The Grafana dashboard queries only metrics and labels that the router and worker export.

The exported names come from the daemons' own Prometheus objects: the metrics modules are
imported, every series is touched once, and the exposition is parsed back with prometheus_client.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "deploy" / "grafana" / "omni-fleet.json"
# Labels that Prometheus adds when it scrapes, and the histogram bucket label.
TARGET_LABELS = {"instance", "job", "le", "namespace", "pod", "node"}
# Sample-name suffixes by metric type (what PromQL sees, not the family name).
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("", "_count", "_sum"),
}

# -- PromQL, parsed by a real parser (promql-parser: a port of Prometheus' own) ---------------


@dataclass
class Query:
    metrics: set[str] = field(default_factory=set)
    labels: set[str] = field(default_factory=set)


def parse_promql(expr: str) -> Query:
    """Metric names and label names an expression uses; a syntax error raises ValueError."""
    query = Query()

    def visit(node: object) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                query.metrics.add(node.name)
            query.labels.update(m.name for m in node.matchers.matchers if m.name != "__name__")
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            query.labels.update(node.modifier.labels)
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            if node.modifier.matching is not None:
                query.labels.update(node.modifier.matching.labels)
            query.labels.update(node.modifier.group_labels or ())
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return query


def test_the_parser_tells_metrics_from_functions_and_labels() -> None:
    q = parse_promql(
        'histogram_quantile(0.95, sum by (le, route) (rate(a_bucket{route=~"chat|x"}[5m])))'
        " / on (instance) group_left b_total > 0"
    )
    assert q.metrics == {"a_bucket", "b_total"}
    assert q.labels == {"le", "route", "instance"}
    with pytest.raises(ValueError, match="parenthesis"):
        parse_promql("sum(rate(a_total[5m])")


# -- what the daemons export -----------------------------------------------------------------


def exposition_families(text: str) -> dict[str, set[str]]:
    """Sample name -> label names, for every series a scrape would show."""
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.setdefault(family.name + suffix, set())
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    for name, labels in names.items():
        base = re.sub(r"_(bucket|count|sum|total)$", "", name)
        for other, more in names.items():
            if other != name and re.sub(r"_(bucket|count|sum|total)$", "", other) == base:
                labels |= more - {"le"}
    return names


def router_series() -> dict[str, set[str]]:
    """A real ``Router`` (its gauges are wired by the app, not by ``router.metrics``); built
    over a static worker, which needs no Redis and opens no connection."""
    from fleet.errors import ErrorCode
    from fleet.records import ScaleSignal
    from router.app import Router
    from router.metrics import ROUTES
    from router.settings import RouterSettings

    metrics = Router(RouterSettings(worker=["http://127.0.0.1:9"])).metrics
    # the scaling signal has series only for the models of a Redis fleet: one, for its labels
    signal = ScaleSignal(
        model="m", desired_replicas=1, ready_replicas=1, in_flight=0, reason="load"
    )
    metrics.scale = lambda: [signal]
    for route in ROUTES:  # touch every labelled series once, so that the labels show
        metrics.request(route, 200, 0.01)
        metrics.error(route, ErrorCode.INTERNAL_ERROR)
        metrics.first_byte(route, "m", 0.01)
    return exposition_families(metrics.render().decode())


def worker_series() -> dict[str, set[str]]:
    from worker.metrics import Route, WorkerMetrics

    metrics = WorkerMetrics(["thinker", "talker"], "tiny-omni")
    for route in Route:
        metrics.duration.labels(route.value).observe(0.1)
    return exposition_families(metrics.render().decode())


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    try:
        return router_series() | worker_series()
    except ImportError as err:  # the daemons are being written in parallel
        pytest.skip(f"router/worker metrics are not importable yet ({err})")


# -- the dashboard ---------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def targets() -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


@pytest.mark.parametrize(("title", "expr"), targets(), ids=[t for t, _ in targets()])
def test_every_query_uses_exported_metrics_and_labels(
    title: str, expr: str, exported: dict[str, set[str]]
) -> None:
    # Grafana replaces its variables before Prometheus sees the query
    query = parse_promql(expr.replace("$__rate_interval", "5m"))
    assert query.metrics, f"{title}: no metric in {expr!r}"
    unknown = query.metrics - exported.keys()
    assert not unknown, f"{title}: {sorted(unknown)} not exported; known: {sorted(exported)}"
    labels = set().union(*(exported[m] for m in query.metrics)) | TARGET_LABELS
    assert query.labels <= labels, f"{title}: labels {sorted(query.labels - labels)} unknown"


def test_the_dashboard_covers_router_and_worker_signals() -> None:
    exprs = " ".join(expr for _, expr in targets())
    for needed in (
        "omni_router_requests_total",
        "omni_router_request_duration_seconds_bucket",
        "omni_router_errors_total",
        "omni_router_affinity_outcomes_total",
        "omni_router_in_flight",
        "omni_router_workers_routable",
        "omni_worker_stage_queue_depth",
        "omni_worker_status",
        "omni_worker_in_flight",
    ):
        assert needed in exprs


# the latency and audio series that differ by model: a mixed fleet's panels keep models apart
PER_MODEL = (
    "omni_router_first_byte_seconds",
    "omni_worker_first_token_seconds",
    "omni_worker_first_audio_seconds",
    "omni_worker_real_time_factor",
    "omni_worker_audio_underruns",
    "omni_worker_audio_replies",
)


PER_MODEL_TARGETS = [(t, e) for t, e in targets() if any(name in e for name in PER_MODEL)]


@pytest.mark.parametrize(
    ("title", "expr"), PER_MODEL_TARGETS, ids=[t for t, _ in PER_MODEL_TARGETS]
)
def test_latency_and_audio_panels_keep_models_apart(title: str, expr: str) -> None:
    """A panel of a per-model series groups by model and reads the dashboard's model choice."""
    query = parse_promql(expr.replace("$__rate_interval", "5m"))
    assert "model" in query.labels and '{model=~"$model"}' in expr, f"{title}: {expr}"


def test_dashboard_is_importable_grafana_json() -> None:
    board = dashboard()
    assert board["uid"] == "omni-fleet" and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
