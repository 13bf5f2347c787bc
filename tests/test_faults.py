"""The fault suite: real `rtserve serve` processes, a real redis-server that is killed and restarted.

One bounded chaos run (loadtest/chaos.py, the same code as the load runner) covers 300 parallel creates
on one replica, sessions fed piece by piece over two replicas while one replica is SIGKILLed, Redis is
stopped and restarted and then SIGKILLed and restarted with AOF, and parallel duplicates. The other tests
take one fault each: a lock a dead replica left, Redis out of memory, slow clients, a SIGKILLed service
with its embedded Redis.
"""

import argparse
import asyncio
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from loadtest.chaos import RedisProcess, Replica, chaos, free_port, print_table
from tests.service_helpers import start_rtserve


@pytest.fixture(scope="module")
def tiny_repository(forecast_repository):
    """The shared tiny RSA forecaster (look-back 32), model ``rsa-tiny``, in ONNX."""
    return forecast_repository[0]


@pytest.mark.slow
def test_chaos_run_loses_nothing_applies_nothing_twice_and_leaves_no_orphans(tiny_repository, tmp_path):
    args = argparse.Namespace(sessions=24, pieces=8, creates=300, duplicates=30, appendfsync="everysec",
                              faults=True, fault_delay=0.4, repository=str(tiny_repository), model="rsa-tiny")
    report = asyncio.run(chaos(args, tmp_path))
    print_table(report)
    assert dict(report["_creates"]) == {"201": 300}, report["creates"]  # no false 503 under a burst
    assert report["_found"] == {"lost": 0, "duplicated": 0, "orphaned": 0}, report
    outcome = report["_duplicates"]
    assert outcome.get("200", 0) + outcome.get("replayed", 0) >= 1 and set(outcome) <= {"200", "replayed", "503"}
    assert outcome.get("200", 0) <= 1  # at most one of the parallel copies applied it
    # during the faults: 503 (Redis down) or a broken connection (replica killed), both retried; never 500
    assert set(report["_statuses"]) <= {"200", "503", "connection error"}, report["_statuses"]


@pytest.fixture(scope="module")
def replica(tiny_repository, tmp_path_factory):
    store = RedisProcess(tmp_path_factory.mktemp("faults-redis"))
    store.start()
    server = Replica(tiny_repository, store.url, "faults", env={"RTSERVE_REQUEST_READ_TIMEOUT_SECONDS": "1",
                                                              "RTSERVE_KEEP_ALIVE_TIMEOUT_SECONDS": "1"})
    server.start()
    yield server, store
    server.stop()
    store.stop()


def _rows(n=4):
    return [[float(i + j) for j in range(7)] for i in range(n)]


def test_a_lock_a_dead_replica_left_delays_its_session_under_two_seconds(replica):
    server, store = replica
    session = httpx.post(f"{server.url}/sessions", json={"task": "forecast"}).json()
    url = f"{server.url}/sessions/{session['id']}/segments"
    assert httpx.post(url, json={"seq": 1, "rows": _rows()}).status_code == 200
    # what a replica of this version leaves when it dies while computing piece 2: its lock, one lease long
    store.client().set(f"faults:{{{session['id']}}}:lock", "2:dead", px=1000)
    started = time.monotonic()
    answer = httpx.post(url, json={"seq": 2, "rows": _rows()}, timeout=10)
    waited = time.monotonic() - started
    assert answer.status_code == 200 and answer.json()["session"]["seq"] == 2
    assert waited < 2.0, f"{waited:.2f} s"


def test_redis_out_of_memory_is_503_and_not_ready_then_recovers(replica):
    server, store = replica
    admin = store.client()
    admin.config_set("maxmemory", 1)
    try:
        created = httpx.post(f"{server.url}/sessions", json={"task": "forecast"})
        assert created.status_code == 503 and created.headers["retry-after"], created.text
        assert created.headers["content-type"] == "application/json"
        ready = httpx.get(f"{server.url}/readyz")
        assert ready.status_code == 503 and ready.headers["retry-after"]
    finally:
        admin.config_set("maxmemory", 0)
    assert httpx.get(f"{server.url}/readyz").status_code == 200
    assert httpx.post(f"{server.url}/sessions", json={"task": "forecast"}).status_code == 201


def test_silent_and_half_sent_connections_are_closed(replica):
    server, _ = replica
    body = b'{"rows": [[1, 2, 3, 4, 5, 6, 7]]}'
    half = {
        "silent": b"",
        "half a header": b"POST /forecast HTTP/1.1\r\nHost: x\r\nContent-Type: app",
        "half a body": b"POST /forecast HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(body) + body[:10],
        "idle keep-alive": b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    }
    sockets = []
    for kind, data in half.items():
        for _ in range(25):
            client = socket.create_connection(("127.0.0.1", server.port))
            client.sendall(data)
            sockets.append((kind, client))
    time.sleep(2.5)  # read timeout 1 s, keep-alive 1 s
    held = []
    for kind, client in sockets:
        client.settimeout(1.0)
        try:
            received = b""
            while chunk := client.recv(65536):
                received += chunk
        except TimeoutError:
            held.append(kind)
        except ConnectionResetError:
            pass
        else:
            if kind == "half a body":
                assert received.startswith(b"HTTP/1.1 408"), received[:200]
        client.close()
    assert not held, f"{len(held)} connections still held: {sorted(set(held))}"


def test_a_service_killed_by_sigkill_leaves_no_redis_server(tiny_repository, tmp_path):
    port = free_port()
    settings = {"RTSERVE_MODEL_REPOSITORY": str(tiny_repository), "RTSERVE_EMBEDDED_REDIS_DIR": str(tmp_path / "redis"),
                "RTSERVE_LOG_LEVEL": "warning"}
    process = start_rtserve(settings, port)
    try:
        redis_pid = int((tmp_path / "redis" / "owner.pid").read_text().split()[1])
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    deadline = time.monotonic() + 3
    while Path(f"/proc/{redis_pid}").exists() and time.monotonic() < deadline:
        if Path(f"/proc/{redis_pid}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.05)
    alive = Path(f"/proc/{redis_pid}").exists() and Path(f"/proc/{redis_pid}/stat").read_text().split()[2] != "Z"
    assert not alive, "redis-server outlived the service killed by SIGKILL"
