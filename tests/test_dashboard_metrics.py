"""Every rtserve metric and route label that the Grafana dashboard and the alert rules query is one that a
running service exposes: an app over one tiny model of each task gets one request of each kind, then its
/metrics exposition is parsed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "rtserve.json"
GPU_ONLY = ("rtserve_gpu_", "rtserve_energy_joules")  # NVML families: absent, not zero, without a GPU
TEXT = "The senator said on Monday that the bill would pass the house. Critics disagreed. " * 4


@pytest.fixture(scope="module")
def repository(every_task_repository):
    return every_task_repository, None


def queried_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [target["expr"] for panel in panels for target in panel["targets"]]
    for name in ("alerts.yml",):
        rules = yaml.safe_load((ROOT / "deploy" / name).read_text())
        exprs += [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    return exprs


def test_the_dashboard_uses_the_provisioned_datasource_and_shows_what_operators_need():
    provisioned = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = provisioned["datasources"][0]["uid"]
    dashboard = json.loads(DASHBOARD.read_text())
    text = json.dumps(dashboard["panels"])
    assert {panel["datasource"]["uid"] for panel in dashboard["panels"]} == {uid}
    for family in ("rtserve_request_duration_seconds_bucket", "rtserve_batch_size_sum", "rtserve_batch_queue_seconds",
                   "rtserve_active_sessions", "rtserve_session_state_bytes", "rtserve_gpu_power_watts",
                   "rtserve_energy_joules_total", "rtserve_redis_operation_duration_seconds",
                   "rtserve_event_loop_lag_seconds"):
        assert family in text, f"no panel shows {family}"
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/rtserve.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_every_queried_rtserve_metric_and_route_is_exposed_by_a_running_service(client):
    assert client.get("/healthz").status_code == 200 and client.get("/readyz").status_code == 200
    assert client.post("/classify", json={"text": TEXT}).status_code == 200
    assert client.post("/summarize", json={"text": TEXT, "max_length": 8}).status_code == 200
    rows = [[float(i % 7 + j) for j in range(7)] for i in range(40)]
    assert client.post("/forecast", json={"rows": rows}).status_code == 200
    session = client.post("/sessions", json={"task": "forecast"}).json()["id"]
    assert client.post(f"/sessions/{session}/segments", json={"seq": 1, "rows": rows}).status_code == 200
    assert client.get(f"/sessions/{session}").status_code == 200
    assert client.post(f"/sessions/{session}/finish").status_code == 200
    assert client.delete(f"/sessions/{session}").status_code == 204
    exposition = client.get("/metrics").text
    samples = {sample.name: sample for family in text_string_to_metric_families(exposition)
               for sample in family.samples}
    routes = {sample.labels.get("route") for family in text_string_to_metric_families(exposition)
              for sample in family.samples if "route" in sample.labels}

    queried = {name for expr in queried_expressions() for name in re.findall(r"\brtserve_[a-z_]+", expr)}
    assert len(queried) >= 10
    gpu_only = {name for name in queried if name.startswith(GPU_ONLY)}
    missing = sorted(name for name in queried - gpu_only if name not in samples)
    assert not missing, f"queried but not in /metrics: {missing}"
    source = (ROOT / "service" / "metrics.py").read_text() + (ROOT / "service" / "gpu_metrics.py").read_text()
    for name in gpu_only:  # exposed only where NVML sees a GPU: at least the family is the one the code exports
        family = re.sub(r"_total$", "", name)
        assert f'"{family}"' in source, f"{name}: no such family in service/metrics.py or service/gpu_metrics.py"
    for expr in queried_expressions():
        for alternatives in re.findall(r'route=~"([^"]+)"', expr):
            for route in alternatives.replace("\\\\", "\\").split("|"):
                pattern = re.compile(route)
                assert any(pattern.fullmatch(r) for r in routes if r), f"no route label matches {route!r}"
