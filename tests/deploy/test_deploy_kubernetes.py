"""The Kubernetes manifests: valid for a pinned Kubernetes release (strict: unknown fields are
errors), the CRDs against their schemas, and the properties the deployment relies on."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from deploy_files import (
    KUBERNETES_VERSION,
    MONITORING,
    PENDING_SETTINGS,
    SCHEMAS,
    core_manifests,
    documents_by_kind,
    load_documents,
    one,
)

from lmserve.server.settings import Settings, load_settings

CRD_SCHEMAS = {
    "ServiceMonitor": SCHEMAS / "servicemonitor_v1.json",
    "PrometheusRule": SCHEMAS / "prometheusrule_v1.json",
}


def validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("path", core_manifests(), ids=lambda p: p.name)
def test_manifest_validates_strictly(path: Path) -> None:
    docs = load_documents(path)
    assert docs
    for doc in docs:
        validate(doc)


def test_validation_is_offline_and_strict() -> None:
    """The bundled schemas answer (no download), and a misspelt field fails."""
    deployment = copy.deepcopy(one("Deployment", "lmserve"))
    validate(deployment)
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"grpc": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    deployment = copy.deepcopy(one("Deployment", "lmserve"))
    deployment["spec"]["replica"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)


def check_jsonschema(schema: Path, instance: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--schemafile", str(schema), str(instance)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("path", sorted(MONITORING.glob("*.yaml")), ids=lambda p: p.name)
def test_monitoring_resource_validates_against_its_crd_schema(path: Path) -> None:
    [doc] = load_documents(path)
    result = check_jsonschema(CRD_SCHEMAS[doc["kind"]], path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_crd_schemas_reject_unknown_fields(tmp_path: Path) -> None:
    bad = tmp_path / "servicemonitor.yaml"
    text = (MONITORING / "servicemonitor.yaml").read_text()
    bad.write_text(text.replace("scrapeTimeout:", "scrapeTimout:"))
    assert check_jsonschema(CRD_SCHEMAS["ServiceMonitor"], bad).returncode == 1
    bad = tmp_path / "prometheusrule.yaml"
    text = (MONITORING / "prometheusrule.yaml").read_text()
    bad.write_text(text.replace("for: 10m", "for: ten minutes", 1))
    assert check_jsonschema(CRD_SCHEMAS["PrometheusRule"], bad).returncode == 1


def container() -> dict[str, Any]:
    [c] = one("Deployment", "lmserve")["spec"]["template"]["spec"]["containers"]
    return c


def env() -> dict[str, str]:
    return {e["name"]: e["value"] for e in container()["env"]}


def test_every_lmserve_variable_is_a_setting() -> None:
    for name in env():
        if name.startswith("LMSERVE_"):
            setting = name.removeprefix("LMSERVE_").lower()
            assert setting in Settings.model_fields or setting in PENDING_SETTINGS, name


def test_deployment_runs_three_non_root_replicas_with_grpc_probes() -> None:
    deployment = one("Deployment", "lmserve")
    pod = deployment["spec"]["template"]["spec"]
    c = container()
    assert deployment["spec"]["replicas"] == 3
    health_port = int(env()["LMSERVE_HEALTH_PORT"])
    assert health_port not in (0, 50051, 9090)  # its own port, on
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        # The plaintext health port: the kubelet's gRPC probes cannot speak TLS.
        assert c[probe]["grpc"]["port"] == health_port, probe
    assert c["readinessProbe"]["grpc"]["service"] == "lmserve.v1.LanguageModelService"
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]


def test_logs_are_json_lines() -> None:
    assert env()["LMSERVE_LOG_FORMAT"] == "json"
    load_settings({"log_format": env()["LMSERVE_LOG_FORMAT"]})  # a value the setting takes


def test_shutdown_fits_in_the_termination_grace_period() -> None:
    pod = one("Deployment", "lmserve")["spec"]["template"]["spec"]
    values = env()
    notice = float(values["LMSERVE_SHUTDOWN_NOTICE_SECONDS"])
    grace = float(values["LMSERVE_GRACE_PERIOD_SECONDS"])
    assert pod["terminationGracePeriodSeconds"] == 35
    assert notice + grace < pod["terminationGracePeriodSeconds"]


def test_models_come_read_only_from_the_claim_and_tmp_is_writable() -> None:
    pod = one("Deployment", "lmserve")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container()["volumeMounts"]}
    models = mounts["/models"]
    assert models["readOnly"] is True
    claim = volumes[models["name"]]["persistentVolumeClaim"]["claimName"]
    assert claim == "lmserve-models"
    one("PersistentVolumeClaim", claim)
    assert env()["LMSERVE_MODEL_REPOSITORY"] == "/models"
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]


def pod_labels() -> dict[str, str]:
    labels: dict[str, str] = one("Deployment", "lmserve")["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_services_select_the_pods_and_name_their_ports() -> None:
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    assert ports == {
        "grpc": 50051,
        "http": int(env()["LMSERVE_HTTP_PORT"]),
        "metrics": 9090,
        "health": int(env()["LMSERVE_HEALTH_PORT"]),
    }
    headless = one("Service", "lmserve-headless")["spec"]
    assert headless["clusterIP"] == "None"
    assert [p["targetPort"] for p in headless["ports"]] == ["grpc"]
    assert headless["ports"][0]["port"] == 50051
    metrics = one("Service", "lmserve-metrics")["spec"]
    assert metrics.get("clusterIP") != "None"
    assert [p["targetPort"] for p in metrics["ports"]] == ["metrics"]
    http = one("Service", "lmserve-http")["spec"]
    assert [(p["targetPort"], p["port"]) for p in http["ports"]] == [("http", ports["http"])]
    for spec in (headless, metrics, http):
        assert selects(spec["selector"], pod_labels())
    pdb = one("PodDisruptionBudget", "lmserve")["spec"]
    assert pdb["minAvailable"] == 2
    assert selects(pdb["selector"]["matchLabels"], pod_labels())


def test_service_monitor_scrapes_the_metrics_service_only() -> None:
    monitor = one("ServiceMonitor")["spec"]
    services = [
        s
        for s in documents_by_kind()["Service"]
        if selects(monitor["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    assert [s["metadata"]["name"] for s in services] == ["lmserve-metrics"]
    [service] = services
    names = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["endpoints"]} <= names
    # The alert rules expect job="lmserve": the job label comes from this Service label.
    assert service["metadata"]["labels"][monitor["jobLabel"]] == "lmserve"


def test_hpa_scales_the_deployment_on_cpu_and_pending_requests() -> None:
    hpa = one("HorizontalPodAutoscaler", "lmserve")["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "lmserve",
    }
    assert hpa["minReplicas"] == 3 and hpa["maxReplicas"] > hpa["minReplicas"]
    kinds = {m["type"]: m for m in hpa["metrics"]}
    assert kinds["Resource"]["resource"]["name"] == "cpu"
    assert kinds["Pods"]["pods"]["metric"]["name"] == "lmserve_pending_requests"
    assert container()["resources"]["requests"]["cpu"], "CPU utilization needs a CPU request"
