"""The Triton server of the bench's Triton side: finding the peer venv (``make peers``) and running its
``tritonserver`` on loopback.

The venv is ``--triton-venv``, else ``RTSERVE_BENCH_TRITON_VENV``, else ``.venv-peers``: nvidia-pytriton 0.7.0
ships a CPU-capable ``tritonserver`` (Triton 2.51) and the python backend; its numpy<2 pin is why it is not in
rtserve's venv. :func:`find_triton` says why the side cannot run where the venv is missing or incomplete.
:class:`TritonServer` starts ``tritonserver`` (explicit model control, HTTP only, on free loopback ports) with
``PEER_SITE_PACKAGES`` set for the python model (the stub ignores PYTHONPATH), waits until every model is ready
and stops it with SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.harness import HOST, BenchError, Client, Server, free_port

VENV_VARIABLE = "RTSERVE_BENCH_TRITON_VENV"
DEFAULT_VENV = Path(".venv-peers")
HOW_TO_GET_IT = "`make peers` creates .venv-peers (or pass --triton-venv / set RTSERVE_BENCH_TRITON_VENV)"
PEER_PACKAGES = ("numpy", "onnxruntime", "safetensors", "tokenizers")  # what model.py imports in the stub


def triton_venv(option: Path | None) -> Path:
    return option or Path(os.environ.get(VENV_VARIABLE) or DEFAULT_VENV)


@dataclass(frozen=True)
class TritonInstall:
    venv: Path
    site_packages: Path
    server: Path  # the tritonserver binary

    @property
    def backends(self) -> Path:
        return self.server.parents[1] / "backends"

    @property
    def caches(self) -> Path:
        return self.server.parents[1] / "caches"


def find_triton(venv: Path) -> TritonInstall | str:
    """The install in ``venv``, or why there is none usable (a sentence)."""
    python = venv / "bin" / "python"
    if not python.exists():
        return f"no Triton venv at {venv}"
    try:
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        return f"{python} does not run: {error}"
    site_packages = Path(site)
    server = site_packages / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    if not server.exists():
        return f"no tritonserver in {venv} (nvidia-pytriton is not installed there)"
    install = TritonInstall(venv, site_packages, server)
    if not (install.backends / "python" / "triton_python_backend_stub").exists():
        return f"the python backend's stub is not in place in {install.backends / 'python'}"
    missing = [name for name in PEER_PACKAGES if not (site_packages / name).is_dir()]
    if missing:
        return f"{venv} lacks {', '.join(missing)}"
    return install


class TritonServer(Server):
    """``tritonserver`` serving ``models`` of ``repository`` on a free loopback HTTP port."""

    def __init__(self, install: TritonInstall, repository: Path, models: Sequence[str], log_path: Path,
                 grpc: bool = False) -> None:
        """``grpc``: serve KServe v2's gRPC too, on another free loopback port (``grpc_url``)."""
        port, grpc_port = free_port(), free_port() if grpc else 0
        self.grpc_url = f"{HOST}:{grpc_port}" if grpc else None
        grpc_options = [f"--grpc-address={HOST}", f"--grpc-port={grpc_port}"] if grpc else ["--allow-grpc=false"]
        command = [
            str(install.server), f"--model-repository={repository}", "--model-control-mode=explicit",
            *(f"--load-model={name}" for name in models),
            f"--backend-directory={install.backends}", f"--cache-directory={install.caches}",
            f"--http-address={HOST}", f"--http-port={port}", *grpc_options, "--allow-metrics=false",
            "--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0", "--exit-on-error=true",
        ]
        env = dict(os.environ, PEER_SITE_PACKAGES=str(install.site_packages))
        super().__init__(command, env, port, log_path)
        self.models = list(models)

    async def wait_models(self, client: Client, timeout: float) -> str:
        """Wait until every model is ready; Triton's version."""
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            if self.process.poll() is not None:
                raise BenchError(f"tritonserver exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                ready = [(await client.get(f"/v2/models/{name}/ready"))[0] == 200 for name in self.models]
                if all(ready):
                    return str((await client.get_json("/v2")).get("version", "?"))
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            await asyncio.sleep(0.5)
        raise BenchError(f"tritonserver's models were not ready within {timeout:.0f} s:\n{self.log_tail()}")
