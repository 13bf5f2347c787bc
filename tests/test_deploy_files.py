"""The deployment files, checked without a Docker engine: compose against the compose-spec JSON schema plus
what the schema cannot know (settings, routes, mounted files), Prometheus config and rules with promtool,
and every Grafana panel's metric against the /metrics of a running service."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from importlib.resources import files
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILES = ("docker-compose.yml", "docker-compose.cpu.yml")


class _ComposeLoader(yaml.SafeLoader):
    """YAML as Compose reads it: ``!reset`` / ``!override`` (Compose 2.24+) kept as markers for the merge."""


class Reset:
    def __repr__(self) -> str:
        return "!reset"


class Override:
    def __init__(self, value: object) -> None:
        self.value = value


_ComposeLoader.add_constructor("!reset", lambda loader, node: Reset())
_ComposeLoader.add_constructor(
    "!override",
    lambda loader, node: Override(loader.construct_mapping(node, deep=True) if isinstance(node, yaml.MappingNode)
                                  else loader.construct_sequence(node, deep=True)),
)


def load_compose(name: str) -> dict:
    return yaml.load((ROOT / name).read_text(), Loader=_ComposeLoader)


def merge(base: object, override: object) -> object:
    """Compose's merge for what these files use: mappings merge key by key, ``!reset`` removes, ``!override``
    and everything else replaces (the files override no ports, volumes or other merged sequences)."""
    if isinstance(override, Override):
        return copy.deepcopy(override.value)
    if isinstance(base, dict) and isinstance(override, dict):
        merged = copy.deepcopy(base)
        for key, value in override.items():
            if isinstance(value, Reset):
                merged.pop(key, None)
            else:
                merged[key] = merge(base.get(key), value)
        return merged
    return copy.deepcopy(override)


def without_markers(value: object) -> object:
    if isinstance(value, dict):
        return {k: without_markers(v) for k, v in value.items() if not isinstance(v, Reset)}
    if isinstance(value, list):
        return [without_markers(v) for v in value]
    return value.value if isinstance(value, Override) else value


def compose_schema() -> dict:
    # the compose-spec schema as check-jsonschema vendors it (its source: github.com/compose-spec/compose-spec)
    text = files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text()
    return json.loads(text)


def configs() -> dict[str, dict]:
    """The GPU configuration (the base file) and the CPU one (base + override), merged as Compose would."""
    base = load_compose("docker-compose.yml")
    return {"gpu": without_markers(base), "cpu": without_markers(merge(base, load_compose("docker-compose.cpu.yml")))}


def replicas(config: dict) -> dict[str, dict]:
    return {name: service for name, service in config["services"].items()
            if "rtserve" in service.get("networks", {}).get("default", {}).get("aliases", [])}


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_each_compose_file_is_valid_against_the_compose_spec_schema(name):
    jsonschema.validate(without_markers(load_compose(name)), compose_schema())


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_the_merged_compose_configuration_is_valid_against_the_compose_spec_schema(kind):
    jsonschema.validate(configs()[kind], compose_schema())


def test_compose_schema_check_catches_a_misspelt_key():
    broken = configs()["gpu"]
    broken["services"]["redis"]["healthcheck"]["intervall"] = "5s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, compose_schema())


def test_compose_runs_two_gpu_replicas_each_with_its_own_gpu_and_the_cpu_override_none():
    gpu, cpu = replicas(configs()["gpu"]), replicas(configs()["cpu"])
    assert len(gpu) >= 2 and set(gpu) == set(cpu)
    device_ids = []
    for service in gpu.values():
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        device_ids.append(device["device_ids"][0])
        assert service["environment"]["RTSERVE_DEVICE"] == "cuda"
        assert service["build"]["args"]["ORT"] == "gpu"
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
    assert len(set(device_ids)) == len(device_ids), f"two replicas reserve the same GPU: {device_ids}"
    for service in cpu.values():
        assert "devices" not in service["deploy"]["resources"]["reservations"]
        assert service["environment"]["RTSERVE_DEVICE"] == "cpu" and service["build"]["args"]["ORT"] == "cpu"
        assert service["environment"]["RTSERVE_REDIS_URL"] == "redis://redis:6379/0"  # the rest is kept


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_every_rtserve_variable_in_compose_is_a_setting_with_a_valid_value(kind, monkeypatch):
    from service.settings import Settings

    for service in replicas(configs()[kind]).values():
        environment = service["environment"]
        unknown = [name for name in environment if name.startswith("RTSERVE_")
                   and name.removeprefix("RTSERVE_").lower() not in Settings.model_fields]
        assert not unknown, f"not settings of service/settings.py: {unknown}"
        for name, value in environment.items():
            monkeypatch.setenv(name, str(value))
        settings = Settings()  # raises on a value the setting refuses
        assert settings.redis_url and settings.host == "127.0.0.1"  # RTSERVE_HOST=0.0.0.0 comes from the image
    assert "RTSERVE_HOST=0.0.0.0" in (ROOT / "Dockerfile").read_text()


def _get_routes() -> set[str]:
    from service.app import create_app

    paths = create_app().openapi()["paths"]  # the routes the app serves (routers are nested objects)
    return {path for path, operations in paths.items() if "get" in operations}


def test_every_healthcheck_that_calls_rtserve_asks_a_real_route():
    routes = _get_routes()
    checked = 0
    for kind, config in configs().items():
        for name, service in config["services"].items():
            test = " ".join(service.get("healthcheck", {}).get("test", []))
            for url in re.findall(r"https?://[^\s\"']+", test):
                if name in replicas(config) or name == "nginx":  # nginx forwards to the replicas
                    path = "/" + url.split("://", 1)[1].split("/", 1)[1]
                    assert path in routes, f"{kind} {name}: healthcheck asks {path}, not a route of the service"
                    checked += 1
    assert checked >= 6  # two replicas and nginx, in both configurations
    assert {"/readyz", "/healthz"} <= routes


def test_compose_mounts_only_files_of_the_repository():
    for service in configs()["gpu"]["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{source} is mounted but not in the repository"


def test_compose_redis_keeps_sessions_aof_everysec_noeviction_on_a_volume():
    redis = configs()["gpu"]["services"]["redis"]
    command = redis["command"]
    option = {command[i]: command[i + 1] for i in range(1, len(command) - 1) if command[i].startswith("--")}
    assert option["--appendonly"] == "yes" and option["--appendfsync"] == "everysec"
    assert option["--maxmemory-policy"] == "noeviction" and option["--maxmemory"]
    assert redis["volumes"][0].split(":") == ["redis-data", "/data"]
    exporter = configs()["gpu"]["services"]["redis-exporter"]
    assert exporter["environment"]["REDIS_ADDR"] == "redis://redis:6379"


def test_nginx_passes_a_sessions_stream_upgrade_through():
    text = (ROOT / "deploy" / "nginx.conf").read_text()
    location = re.search(r"location ~ \^/sessions/\[\^/\]\+/stream\$ \{(.*?)\n        \}", text, re.S)
    assert location, "no location for /sessions/{id}/stream"
    block = location.group(1)
    for line in ("proxy_set_header Upgrade $http_upgrade;", 'proxy_set_header Connection "upgrade";',
                 "proxy_set_header Host $host;", "proxy_pass http://rtserve;"):
        assert line in block, line


def test_nginx_balances_over_every_replica_and_passes_sse_through_unbuffered():
    text = (ROOT / "deploy" / "nginx.conf").read_text()
    assert re.search(r"server rtserve:8000 resolve;", text)
    assert "proxy_buffering off;" in text and "proxy_http_version 1.1;" in text
    assert "X-Forwarded-For" in text
    keepalive = float(re.search(r"keepalive_timeout (\d+)s;", text).group(1))
    for service in replicas(configs()["gpu"]).values():  # nginx lets go of an idle connection before the replica
        assert keepalive < float(service["environment"].get("RTSERVE_KEEP_ALIVE_TIMEOUT_SECONDS", 5.0))


def test_nginx_resends_a_503_to_another_replica_except_a_create_that_reached_one():
    text = (ROOT / "deploy" / "nginx.conf").read_text()
    server = text[text.index("server {"):]
    assert re.search(r"^        proxy_next_upstream error timeout http_503 non_idempotent;", server, re.M)
    create = server[server.index("location = /sessions {"):]
    create = create[: create.index("}")]
    assert "proxy_next_upstream error timeout;" in create  # POST: only when it never reached a replica


def test_compose_gives_a_stopping_replica_its_drain_and_grace_before_sigkill():
    from service.shutdown import CUT_MARGIN_SECONDS

    for service in replicas(configs()["gpu"]).values():
        environment = service["environment"]
        drain = float(environment["RTSERVE_SHUTDOWN_DRAIN_SECONDS"])
        grace = float(environment["RTSERVE_SHUTDOWN_TIMEOUT_SECONDS"])
        stop = float(service["stop_grace_period"].removesuffix("s"))
        assert drain > 0 and stop >= drain + grace + CUT_MARGIN_SECONDS + 2
    for service in replicas(configs()["gpu"]).values():
        assert service["environment"]["FORWARDED_ALLOW_IPS"] == "*"  # uvicorn takes the client address from it
        assert "ports" not in service  # reachable through nginx only


def test_prometheus_finds_every_replica_by_dns_and_scrapes_redis_exporter():
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    (dns,) = jobs["rtserve"]["dns_sd_configs"]
    assert dns["names"] == ["rtserve"] and dns["type"] == "A" and dns["port"] == 8000
    assert jobs["rtserve"]["metrics_path"] == "/metrics"
    assert jobs["redis"]["static_configs"][0]["targets"] == ["redis-exporter:9121"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in configs()["gpu"]["services"]["prometheus"]["volumes"]}
    for rule_file in config["rule_files"]:
        assert (ROOT / mounts[rule_file]).is_file()


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool not on PATH: install it (Debian: apt-get install -y prometheus) to check the "
                    "Prometheus config and alert rules")
    return found


def test_promtool_accepts_the_prometheus_config_and_the_alert_rules():
    for command in (["check", "config", "--syntax-only", "prometheus.yml"], ["check", "rules", "alerts.yml"]):
        result = subprocess.run([promtool(), *command], cwd=ROOT / "deploy", capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_fire_on_the_series_they_watch():
    """promtool's rule unit tests (deploy/alerts_test.yml): error rate, Redis down and full, queue time."""
    result = subprocess.run([promtool(), "test", "rules", "alerts_test.yml"], cwd=ROOT / "deploy",
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_cover_errors_latency_queue_loop_lag_redis_and_gpu_power():
    rules = yaml.safe_load((ROOT / "deploy" / "alerts.yml").read_text())
    exprs = {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}
    assert "rtserve_requests_total" in exprs["RtserveHighErrorRate"]
    assert "rtserve_request_duration_seconds_bucket" in exprs["RtserveHighP99Latency"]
    assert "rtserve_batch_queue_seconds_bucket" in exprs["RtserveHighQueueTime"]
    assert "rtserve_event_loop_lag_seconds_bucket" in exprs["RtserveEventLoopBehind"]
    assert "redis_up" in exprs["RedisDown"]
    assert "redis_memory_max_bytes" in exprs["RedisNearMemoryLimit"]
    assert "rtserve_gpu_power_watts" in exprs["RtserveGpuPowerNearLimit"]


def test_dockerfile_builds_the_gpu_image_by_default_and_the_cpu_one_by_build_args():
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    text = "\n".join(lines)
    assert "ARG BASE_IMAGE=nvidia/cuda:" in text and "FROM ${BASE_IMAGE}" in text
    assert "ARG ORT=gpu" in text and "make ORT=${ORT}" in text
    assert "rtserve export --all weights" in text
    assert 'CMD [".venv/bin/rtserve", "serve"]' in text
    for copied in ("rtserve", "service", "models", "export"):
        assert f"COPY {copied} ./{copied}" in text
        assert (ROOT / copied).is_dir()


def test_pyproject_pins_cpu_torch_and_separates_the_onnxruntime_builds():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch==2.13.0" in project["dependencies"]
    for requirement in project["dependencies"] + project["optional-dependencies"]["dev"]:
        assert "==" in requirement, f"unpinned dependency: {requirement}"
    extras = project["optional-dependencies"]
    assert any(r.startswith("onnxruntime==") for r in extras["cpu"])
    assert any(r.startswith("onnxruntime-gpu==") for r in extras["gpu"])
    assert project["scripts"]["rtserve"] == "rtserve.cli:main"


def test_the_image_compose_and_nginx_serve_kserve_grpc_on_8001():
    assert re.search(r"^EXPOSE .*\b8001\b", (ROOT / "Dockerfile").read_text(), re.M)
    assert "RTSERVE_GRPC_PORT=8001" in (ROOT / "Dockerfile").read_text()
    for kind, config in configs().items():
        for service in replicas(config).values():
            assert service["environment"]["RTSERVE_GRPC_PORT"] == "8001" and "8001" in service["expose"], kind
        assert "8081:8081" in config["services"]["nginx"]["ports"]
    text = (ROOT / "deploy" / "nginx.conf").read_text()
    assert re.search(r"server rtserve:8001 resolve;", text) and "grpc_pass grpc://rtserve_grpc;" in text
    assert re.search(r"listen 8081;\s+http2 on;", text)
    v2 = text[text.index("location /v2/ {"):]
    assert "proxy_next_upstream error timeout;" in v2[: v2.index("}")]  # a piece without a number: never resent
