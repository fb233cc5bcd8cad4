"""The Grafana dashboard and the alert rules query only metrics, labels and label values that
the server exports (`Metrics`, `stats_export`), and the dashboard shows every exported metric."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from deploy_files import DEPLOY, MONITORING, exported_samples, parse_query, query_problems

DASHBOARD = DEPLOY / "grafana" / "lmserve.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"


def family(sample: str) -> str:
    return re.sub(r"_(total|bucket|sum|count|created)$", "", sample)


def dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    found = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            found.append((panel["title"], target["expr"]))
    for variable in dash["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            query = query["query"] if isinstance(query, dict) else query
            inner = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
            assert inner, f"variable {variable['name']}: unexpected query {query!r}"
            found.append((f"variable {variable['name']}", f"{inner.group(1)}"))
    return found


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_the_checker_catches_wrong_names_labels_and_values() -> None:
    samples = exported_samples()
    assert query_problems('rate(lmserve_requests_total{code!="OK"}[5m])', samples) == []
    assert query_problems("rate(lmserve_request_total[5m])", samples) == [
        "unknown metric lmserve_request_total"
    ]
    assert query_problems("rate(lmserve_requests[5m])", samples)  # the family, not the sample
    assert query_problems('lmserve_models{status="failed"}', samples)
    assert query_problems('lmserve_models{state="broken"}', samples)
    assert query_problems('sum by (methd) (rate(lmserve_requests_total{code="Ok"}[1m]))', samples)
    assert query_problems('rate(lmserve_requests_total{method=~"Score|Scores"}[1m])', samples)


def test_dashboard_queries_use_exported_metrics() -> None:
    samples = exported_samples()
    problems = {
        f"{title}: {expr}": query_problems(expr, samples) for title, expr in dashboard_queries()
    }
    assert {k: v for k, v in problems.items() if v} == {}


def test_dashboard_shows_every_exported_metric() -> None:
    exported = {family(s) for s in exported_samples()}
    used = {family(m) for _, expr in dashboard_queries() for m in parse_query(expr).metrics}
    assert exported - used == set()


def test_dashboard_is_importable() -> None:
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dash["uid"] == "lmserve" and dash["title"]
    ids = [panel["id"] for panel in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    names = {v["name"] for v in dash["templating"]["list"]}
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            for var in re.findall(r"\$(\w+)", target["expr"]):
                assert var in names or var.startswith("__"), f"{panel['title']}: ${var}"


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: r.get("alert", r.get("record")))
def test_alert_rule_uses_exported_metrics(rule: dict[str, Any]) -> None:
    assert query_problems(rule["expr"], exported_samples()) == []
    assert rule["labels"]["severity"] in {"warning", "critical"}
    assert rule["annotations"]["summary"]


def test_alert_rules_cover_the_failure_modes() -> None:
    used = {m for rule in alert_rules() for m in parse_query(rule["expr"]).metrics}
    for metric in [
        "lmserve_requests_total",
        "lmserve_request_duration_seconds_bucket",
        "lmserve_queue_duration_seconds_bucket",
        "lmserve_pending_requests",
        "lmserve_models",
        "up",
    ]:
        assert metric in used
    exprs = " ".join(rule["expr"] for rule in alert_rules())
    assert 'code!="OK"' in exprs and 'state="failed"' in exprs and "absent(up" in exprs


def test_prometheus_rule_holds_the_same_alerts() -> None:
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    [rule] = [
        d
        for d in yaml.safe_load_all((MONITORING / "prometheusrule.yaml").read_text())
        if d["kind"] == "PrometheusRule"
    ]
    assert rule["spec"]["groups"] == groups
