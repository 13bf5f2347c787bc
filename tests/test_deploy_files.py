"""Docker cannot run on the development machines: the deployment files are checked by parsing them."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_compose_runs_rtserve_on_a_gpu_with_redis_and_prometheus():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"rtserve", "redis", "prometheus"} <= set(services)
    rtserve = services["rtserve"]
    assert rtserve["environment"]["RTSERVE_REDIS_URL"].startswith("redis://redis:")
    devices = rtserve["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert "/readyz" in " ".join(rtserve["healthcheck"]["test"])
    assert rtserve["depends_on"]["redis"]["condition"] == "service_healthy"
    mounted = services["prometheus"]["volumes"][0].split(":")[0]
    assert (ROOT / mounted).resolve() == (ROOT / "deploy" / "prometheus.yml").resolve()


def test_prometheus_scrapes_the_rtserve_service():
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    job = next(job for job in config["scrape_configs"] if job["job_name"] == "rtserve")
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["rtserve:8000"]


def test_dockerfile_installs_the_gpu_runtime_and_serves_the_exported_repository():
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    assert lines[[i for i, line in enumerate(lines) if line.startswith("FROM")][0]].startswith("FROM nvidia/cuda:")
    text = "\n".join(lines)
    assert "ORT=gpu" in text, "the image must install onnxruntime-gpu"
    assert "rtserve export --all weights" in text
    assert 'CMD [".venv/bin/rtserve", "serve"]' in text
    for copied in ("rtserve", "service", "models", "export"):
        assert f"COPY {copied} ./{copied}" in text
        assert (ROOT / copied).is_dir()


def test_pyproject_pins_cpu_torch_and_separates_the_onnxruntime_builds():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch==2.13.0" in project["dependencies"]
    for requirement in project["dependencies"]:
        assert "==" in requirement, f"unpinned dependency: {requirement}"
    extras = project["optional-dependencies"]
    assert any(r.startswith("onnxruntime==") for r in extras["cpu"])
    assert any(r.startswith("onnxruntime-gpu==") for r in extras["gpu"])
    assert project["scripts"]["rtserve"] == "rtserve.cli:main"
