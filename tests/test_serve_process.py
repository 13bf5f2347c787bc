"""`rtserve serve` as a user runs it: a real process, a real port, SIGTERM to stop."""

import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtest.chaos import free_port
from tests.service_helpers import start_rtserve


def _redis_answers(socket_path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(1.0)
            client.connect(str(socket_path))
            client.sendall(b"PING\r\n")
            return client.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.mark.parametrize("redis_mode", ["embedded", "external"])
def test_serve_answers_health_ready_and_metrics_then_shuts_down_gracefully(redis_mode, redis_url, tmp_path):
    env = {"RTSERVE_MODEL_REPOSITORY": str(tmp_path / "empty-repository")}
    embedded_socket = tmp_path / "embedded-redis" / "redis.sock"
    env["RTSERVE_EMBEDDED_REDIS_DIR"] = str(embedded_socket.parent)  # read only when no URL is set
    if redis_mode == "external":
        env["RTSERVE_REDIS_URL"] = redis_url
    port = free_port()
    process = start_rtserve(env, port, output=subprocess.PIPE, ready_path="/healthz", timeout=30)
    try:
        base = f"http://127.0.0.1:{port}"
        ready = httpx.get(f"{base}/readyz", timeout=5)
        assert ready.status_code == 200, ready.text
        metrics = httpx.get(f"{base}/metrics", timeout=5)
        assert any(f.name.startswith("rtserve_") for f in text_string_to_metric_families(metrics.text))
        # the embedded server is a real redis-server on its private socket; none is started with a URL
        assert _redis_answers(embedded_socket) == (redis_mode == "embedded")
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=20)
    # uvicorn finishes in-flight work, runs the lifespan shutdown, then re-raises SIGTERM
    assert process.returncode in (0, -signal.SIGTERM), output
    assert "Application shutdown complete" in output
    if redis_mode == "embedded":
        assert "stopped embedded Redis" in output
        assert not _redis_answers(embedded_socket)  # stopped with the service, not left behind
