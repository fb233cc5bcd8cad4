"""Paths and parsers the deploy tests share: the manifests, the metric names the server exports,
and the metric names and labels a PromQL expression uses."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from lmserve.server.front.process.stats_export import metric_families
from lmserve.server.metrics import Metrics
from lmserve.server.shared.stats import EngineStats

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
MONITORING = KUBERNETES / "monitoring"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
# The Kubernetes release the manifests are validated against (bundled in kubernetes-validate).
KUBERNETES_VERSION = "1.33.0"
# LMSERVE_* variables the manifests may set before the server reads them (being added on other
# branches); every other one must be a Settings field. Drop a name here once it lands.
PENDING_SETTINGS: set[str] = set()
# Labels Prometheus adds to every scraped series (static configs, Operator service discovery).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}


def load_documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def core_manifests() -> list[Path]:
    """The manifests of built-in kinds (`kubectl apply -f deploy/kubernetes/`)."""
    return sorted(KUBERNETES.glob("*.yaml"))


def documents_by_kind() -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for path in [*core_manifests(), *sorted(MONITORING.glob("*.yaml"))]:
        for doc in load_documents(path):
            found.setdefault(doc["kind"], []).append(doc)
    return found


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    docs = [d for d in documents_by_kind().get(kind, []) if name in (None, d["metadata"]["name"])]
    assert len(docs) == 1, f"expected one {kind} {name or ''}, found {len(docs)}"
    return docs[0]


def exported_samples() -> dict[str, set[str]]:
    """Every sample name the server exports, with its label names: a fresh `Metrics`' (the
    front's) and the engine stats' (`stats_export`, one model "x" with one session event).

    A fresh registry's labelled metrics have no children, hence no samples: one child of each
    (label values "x") makes `collect()` show the real sample names (`_total`, `_bucket`, ...).
    """
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase) and value._labelnames:
            value.labels(*["x"] * len(value._labelnames))
    engine = EngineStats("x")
    engine.session_event("x")
    samples: dict[str, set[str]] = {}
    for family in [*registry.collect(), *metric_families([engine])]:
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


@dataclass
class QueryUse:
    """What one PromQL expression refers to."""

    metrics: set[str] = field(default_factory=set)
    # (metric, label, operator, value) of each label matcher.
    matchers: list[tuple[str, str, str, str]] = field(default_factory=list)
    # Labels of by/without/on/ignoring clauses.
    grouping: set[str] = field(default_factory=set)


_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
KEYWORDS |= {"and", "or", "unless", "inf", "nan"}


def parse_query(expr: str) -> QueryUse:
    """The metric names, label matchers and grouping labels of a PromQL expression.

    Enough of PromQL for dashboards and alert rules: selectors `name{l="v"}`, functions
    `f(...)`, aggregations with `by (...)`, ranges `[5m]`, Grafana variables `$x`.
    """
    use = QueryUse()
    text = expr
    for match in _GROUPING.finditer(text):
        use.grouping.update(x.strip() for x in match.group(2).split(",") if x.strip())
    text = _GROUPING.sub(" ", text)

    def selector(match: re.Match[str]) -> str:
        name = match.group(1) or ""
        body = match.group(2)
        rest = body
        for m in _MATCHER.finditer(body):
            use.matchers.append((name, m.group(1), m.group(2), m.group(3)))
            rest = rest.replace(m.group(0), "", 1)
        assert not rest.strip(), f"unparsed label matchers {rest!r} in {expr!r}"
        return f" {name} "

    text = _SELECTOR.sub(selector, text)
    text = _STRING.sub(" ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery durations
    text = re.sub(r"\$\{?\w+\}?", " ", text)  # Grafana variables
    for match in _IDENT.finditer(text):
        word = match.group(0)
        following = text[match.end() :].lstrip()
        if following.startswith("(") or word in KEYWORDS:
            continue  # a function or aggregation, or a keyword
        if re.fullmatch(r"[0-9.]+[a-z]*", word):
            continue
        use.metrics.add(word)
    return use


def label_values() -> dict[str, set[str]]:
    """The values the server gives the labels whose values are a closed set."""
    import grpc

    from lmserve.server.registry.repository import ModelState
    from lmserve.v1 import lm_service_pb2

    service = lm_service_pb2.DESCRIPTOR.services_by_name["LanguageModelService"]
    return {
        "code": {code.name for code in grpc.StatusCode},
        "state": {state.value for state in ModelState},
        "method": {method.name for method in service.methods},
    }


# Series that are not lmserve's but that the queries may use (Prometheus' own per target).
EXTERNAL_SAMPLES = {"up": {"job", "instance"}}


def query_problems(expr: str, samples: dict[str, set[str]]) -> list[str]:
    """Why `expr` would not match what the server exports: unknown metrics or labels, label values
    the server never gives. Empty when it is fine."""
    use = parse_query(expr)
    known = {**samples, **EXTERNAL_SAMPLES}
    problems = [f"unknown metric {m}" for m in sorted(use.metrics) if m not in known]
    if not use.metrics:
        problems.append("names no metric")
    labels = set(TARGET_LABELS)
    for metric in use.metrics:
        labels |= known.get(metric, set())
    closed = label_values()
    for metric, label, op, value in use.matchers:
        if label not in known.get(metric, set()) | TARGET_LABELS:
            problems.append(f"{metric} has no label {label}")
        if label in closed and "$" not in value:
            given = value.split("|") if op in ("=~", "!~") else [value]
            problems += [f"{label}={v!r} never exported" for v in given if v not in closed[label]]
    problems += [f"grouping by unknown label {g}" for g in sorted(use.grouping - labels)]
    return problems
