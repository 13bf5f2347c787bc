"""The Kubernetes base (deploy/k8s/base), rendered and validated offline: core resources against the
Kubernetes JSON schemas that kubernetes-validate ships (strict: unknown fields fail), the Prometheus
Operator resources by their shape, and the probes and drain timings against the service itself."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "deploy" / "k8s" / "base"
K8S_VERSION = "1.32.0"
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}  # CRDs: not in the Kubernetes schemas


def rendered() -> list[dict]:
    """The base as ``kubectl apply -k`` sends it: its resources, in order (the kustomization has no transformers)."""
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert set(kustomization) == {"apiVersion", "kind", "resources"}, "a transformer: render with kubectl kustomize"
    return [doc for name in kustomization["resources"] for doc in yaml.safe_load_all((BASE / name).read_text())]


def by_kind() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in rendered()}


def test_kubectl_kustomize_renders_the_same_resources():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not on PATH: the base is checked resource by resource only")
    output = subprocess.run([kubectl, "kustomize", str(BASE)], capture_output=True, text=True, check=True).stdout
    key = lambda doc: (doc["kind"], doc["metadata"]["name"])  # noqa: E731
    assert sorted(yaml.safe_load_all(output), key=key) == sorted(rendered(), key=key)


def test_every_core_resource_is_valid_against_the_kubernetes_schema():
    checked = []
    for doc in rendered():
        if doc["kind"] in OPERATOR_KINDS:
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked.append(doc["kind"])
    assert sorted(checked) == sorted(["ConfigMap", "Secret", "Deployment", "Service", "HorizontalPodAutoscaler",
                                      "PodDisruptionBudget"])


def test_the_schema_check_catches_a_misplaced_field():
    deployment = by_kind()["Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_the_deployment_asks_for_a_gpu_and_probes_real_routes():
    from service.app import create_app

    routes = {path for path, ops in create_app().openapi()["paths"].items() if "get" in ops}
    container = by_kind()["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] in routes
        assert container[probe]["httpGet"]["port"] == container["ports"][0]["name"]


def test_the_grace_period_covers_the_services_own_drain_grace_and_close():
    """On SIGTERM the service drains (RTSERVE_SHUTDOWN_DRAIN_SECONDS), gives requests in flight
    RTSERVE_SHUTDOWN_TIMEOUT_SECONDS, answers what is left before uvicorn's own deadline (CUT_MARGIN_SECONDS later)
    and closes models and Redis: the kubelet's SIGKILL must come after all of it. No preStop sleep adds a second
    drain before the SIGTERM."""
    from service.settings import Settings
    from service.shutdown import CUT_MARGIN_SECONDS

    resources = by_kind()
    pod = resources["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "preStop" not in container.get("lifecycle", {})
    settings = resources["ConfigMap"]["data"]
    drain = float(settings["RTSERVE_SHUTDOWN_DRAIN_SECONDS"])
    grace = float(settings["RTSERVE_SHUTDOWN_TIMEOUT_SECONDS"])
    assert drain >= 5  # kube-proxy and ingress controllers take seconds to drop a terminating pod
    assert pod["terminationGracePeriodSeconds"] >= drain + grace + CUT_MARGIN_SECONDS + 5
    unknown = [name for name in {**resources["ConfigMap"]["data"], **resources["Secret"]["stringData"]}
               if name.removeprefix("RTSERVE_").lower() not in Settings.model_fields]
    assert not unknown, f"not settings: {unknown}"
    refs = {(kind, ref["name"]) for source in container["envFrom"] for kind, ref in source.items()}
    assert refs == {("configMapRef", resources["ConfigMap"]["metadata"]["name"]),
                    ("secretRef", resources["Secret"]["metadata"]["name"])}


def test_the_hpa_scales_the_deployment_on_the_metric_the_adapter_serves():
    resources = by_kind()
    hpa = resources["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == resources["Deployment"]["metadata"]["name"]
    metric = hpa["metrics"][0]["pods"]["metric"]["name"]
    adapter = yaml.safe_load((ROOT / "deploy" / "k8s" / "prometheus-adapter-values.yaml").read_text())
    (rule,) = adapter["rules"]["custom"]
    assert rule["name"]["as"] == metric
    assert rule["seriesQuery"].startswith("rtserve_batch_queue_seconds_bucket")  # a family the service exports
    assert '"rtserve_batch_queue_seconds"' in (ROOT / "service" / "metrics.py").read_text()
    assert resources["PodDisruptionBudget"]["spec"]["minAvailable"] < hpa["minReplicas"]


def test_the_operator_resources_have_their_crd_shape_and_the_compose_rules():
    resources = by_kind()
    monitor = resources["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"] == resources["Service"]["spec"]["selector"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == resources["Service"]["spec"]["ports"][0]["name"] and endpoint["path"] == "/metrics"
    rule = resources["PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    compose_rules = yaml.safe_load((ROOT / "deploy" / "alerts.yml").read_text())
    assert rule["spec"]["groups"] == compose_rules["groups"], "regenerate prometheusrule.yaml from alerts.yml"


def test_the_redis_cluster_values_keep_sessions():
    values = yaml.safe_load((ROOT / "deploy" / "k8s" / "redis-cluster-values.yaml").read_text())
    config = dict(line.split(" ", 1) for line in values["redis"]["configmap"].splitlines())
    assert config["maxmemory-policy"] == "noeviction" and config["appendonly"] == "yes"
    assert config["appendfsync"] == "everysec"
    assert values["cluster"]["nodes"] == 6 and values["cluster"]["replicas"] == 1
    assert by_kind()["ConfigMap"]["data"]["RTSERVE_REDIS_CLUSTER"] == "true"


# ---- KServe (deploy/kserve) ----------------------------------------------------------------------------------------
KSERVE = ROOT / "deploy" / "kserve"
NAME = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}
METADATA = {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
    "name": NAME, "namespace": NAME, "labels": {"type": "object"}, "annotations": {"type": "object"}}}
# The fields of KServe's CRDs (serving.kserve.io, KServe 0.13+) that these manifests use, each where the CRD has it:
# kubernetes-validate ships no CRD schemas, so a misspelt or misplaced field fails here as the API server's strict
# validation would. The containers are checked against Kubernetes' own Container schema below.
SERVING_RUNTIME = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "serving.kserve.io/v1alpha1"}, "kind": {"const": "ServingRuntime"},
        "metadata": METADATA,
        "spec": {"type": "object", "required": ["supportedModelFormats", "containers"], "additionalProperties": False,
                 "properties": {
                     "supportedModelFormats": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "required": ["name"], "additionalProperties": False,
                         "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                                        "autoSelect": {"type": "boolean"}, "priority": {"type": "integer"}}}},
                     "protocolVersions": {"type": "array", "items": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]}},
                     "multiModel": {"type": "boolean"}, "disabled": {"type": "boolean"},
                     "containers": {"type": "array", "minItems": 1, "items": {"type": "object"}}}}}}
PREDICTOR_MODEL = ("modelFormat", "runtime", "protocolVersion", "storageUri")  # ModelSpec's own; the rest: Container
INFERENCE_SERVICE = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "serving.kserve.io/v1beta1"}, "kind": {"const": "InferenceService"},
        "metadata": METADATA,
        "spec": {"type": "object", "required": ["predictor"], "additionalProperties": False, "properties": {
            "predictor": {"type": "object", "required": ["model"], "additionalProperties": False, "properties": {
                "minReplicas": {"type": "integer", "minimum": 0}, "maxReplicas": {"type": "integer", "minimum": 1},
                "terminationGracePeriodSeconds": {"type": "integer"}, "serviceAccountName": NAME,
                "model": {"type": "object", "required": ["modelFormat"], "properties": {
                    "modelFormat": {"type": "object", "required": ["name"], "additionalProperties": False,
                                    "properties": {"name": {"type": "string"}, "version": {"type": "string"}}},
                    "runtime": NAME, "protocolVersion": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]},
                    "storageUri": {"type": "string"}}}}}}}}}


def kserve() -> tuple[dict, dict]:
    return (yaml.safe_load((KSERVE / "servingruntime.yaml").read_text()),
            yaml.safe_load((KSERVE / "inferenceservice.yaml").read_text()))


def as_pod(container: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": {"containers": [container]}}


def test_the_kserve_runtime_and_inference_service_have_their_crd_shape_and_valid_containers():
    import jsonschema

    runtime, service = kserve()
    jsonschema.validate(runtime, SERVING_RUNTIME)
    jsonschema.validate(service, INFERENCE_SERVICE)
    for container in runtime["spec"]["containers"]:
        kubernetes_validate.validate(as_pod(container), K8S_VERSION, strict=True)
    model = service["spec"]["predictor"]["model"]
    overrides = {key: value for key, value in model.items() if key not in PREDICTOR_MODEL}
    kubernetes_validate.validate(as_pod({"name": "kserve-container", **overrides}), K8S_VERSION, strict=True)
    with pytest.raises(jsonschema.ValidationError):  # the check catches a misplaced field
        misplaced = {**service["spec"]["predictor"], "protocolVersion": "v2"}  # belongs to the model
        jsonschema.validate({**service, "spec": {"predictor": misplaced}}, INFERENCE_SERVICE)


def test_the_inference_service_speaks_v2_through_the_rtserve_runtime_with_the_bases_settings():
    from service.app import create_app
    from service.settings import Settings
    from service.shutdown import CUT_MARGIN_SECONDS

    runtime, service = kserve()
    model = service["spec"]["predictor"]["model"]
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"] and model["protocolVersion"] == "v2"
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    (container,) = runtime["spec"]["containers"]
    assert container["name"] == "kserve-container"
    routes = {path for path, ops in create_app().openapi()["paths"].items() if "get" in ops}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] in routes and container[probe]["httpGet"]["path"].startswith("/v2/")
    environment = {item["name"]: item["value"] for item in container["env"]}
    assert all(name.removeprefix("RTSERVE_").lower() in Settings.model_fields for name in environment)
    (port,) = container["ports"]
    assert port["containerPort"] == int(environment["RTSERVE_PORT"]) and port["name"] == "http1"
    resources = by_kind()  # Redis, keys and the shutdown timings: the Kubernetes base's ConfigMap and Secret
    refs = {(kind, ref["name"]) for source in container["envFrom"] for kind, ref in source.items()}
    assert refs == {("configMapRef", resources["ConfigMap"]["metadata"]["name"]),
                    ("secretRef", resources["Secret"]["metadata"]["name"])}
    settings = resources["ConfigMap"]["data"]
    needed = (float(settings["RTSERVE_SHUTDOWN_DRAIN_SECONDS"]) + float(settings["RTSERVE_SHUTDOWN_TIMEOUT_SECONDS"])
              + CUT_MARGIN_SECONDS + 5)
    assert service["spec"]["predictor"]["terminationGracePeriodSeconds"] >= needed


def test_the_kubernetes_base_serves_kserve_grpc_on_its_grpc_port():
    resources = by_kind()
    (container,) = resources["Deployment"]["spec"]["template"]["spec"]["containers"]
    ports = {port["name"]: port for port in container["ports"]}
    assert ports["grpc"]["containerPort"] == int(resources["ConfigMap"]["data"]["RTSERVE_GRPC_PORT"])
    service_ports = {port["name"]: port for port in resources["Service"]["spec"]["ports"]}
    assert service_ports["grpc"]["targetPort"] == "grpc"
