"""Where a model runs and in what precision: the settings' words turned into a checked device.

``resolve_device("auto" | "cpu" | "cuda" | "cuda:N", backend)`` answers ``"cpu"`` or
``"cuda:N"``. ``auto`` means ``cuda:0`` when the model's backend can reach a GPU, else the CPU;
an explicit ``cuda`` that cannot be honoured raises :class:`DeviceConfigError`, which fails
startup instead of quietly serving from the CPU.

What "can reach a GPU" means depends on the backend: ONNX Runtime needs its GPU build
(``CUDAExecutionProvider`` among its providers) and a device that NVML counts; torch and
TorchScript need ``torch.cuda``. The ONNX path never imports torch.
"""

from __future__ import annotations

import os
import re
from typing import Any

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
PRECISIONS = ("fp32", "fp16", "bf16")
# which precisions each backend can run: ONNX Runtime's float16 converter has no bf16, and the
# TorchScript files are traced in fp32 with their float32 casts baked in (a cast module fails
# with "mat1 and mat2 must have the same dtype"); eager torch runs all three
BACKEND_PRECISIONS = {"onnx": ("fp32", "fp16"), "torchscript": ("fp32",), "torch": PRECISIONS}


class DeviceConfigError(RuntimeError):
    """A device or precision the settings ask for and this host or backend cannot give: fail startup."""


def check_device(value: str) -> str:
    """``value`` as the settings accept it (``auto``, ``cpu``, ``cuda``, ``cuda:N``), or ValueError."""
    text = value.strip().lower()
    if not DEVICE_PATTERN.fullmatch(text):
        raise ValueError(f"device {value!r} is not one of auto, cpu, cuda, cuda:N (N = 0, 1, ...)")
    return text


def device_index(device: str) -> int:
    """N of ``"cuda:N"``; 0 for ``"cuda"`` (and for ``"cpu"``, where it is not used)."""
    return int(device.partition(":")[2] or 0)


def check_precision(value: str) -> str:
    text = value.strip().lower()
    if text not in PRECISIONS:
        raise ValueError(f"precision {value!r} is not one of {', '.join(PRECISIONS)}")
    return text


def visible_nvml_gpus() -> int:
    """GPUs NVML counts, narrowed by ``CUDA_VISIBLE_DEVICES`` when it is set; 0 without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
    except Exception:  # no library, no driver
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return count
    entries = []
    for entry in (entry.strip() for entry in visible.split(",")):
        if not entry or entry.startswith("-"):  # CUDA stops at the first invalid entry ("-1" hides all)
            break
        entries.append(entry)
    return min(count, len(entries))


def onnx_providers() -> list[str]:
    """ONNX Runtime's providers; none where it is not installed (a torch-only GPU host)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return []
    return list(ort.get_available_providers())


def cuda_device_count(backend: str) -> tuple[int, str]:
    """How many CUDA devices ``backend`` can use here, and why, in words, when none."""
    if backend == "onnx":
        providers = onnx_providers()
        if "CUDAExecutionProvider" not in providers:
            return 0, (f"onnxruntime has no CUDAExecutionProvider (providers {providers}: the CPU build; "
                       "`make ORT=gpu` installs onnxruntime-gpu)")
        count = visible_nvml_gpus()
        return count, "" if count else "onnxruntime has the CUDA provider but NVML sees no GPU"
    import torch

    if not torch.cuda.is_available():
        return 0, f"torch.cuda.is_available() is False (torch {torch.__version__})"
    return torch.cuda.device_count(), ""


def resolve_device(requested: str, backend: str = "onnx", model: str = "the model") -> str:
    """``"cpu"`` or ``"cuda:N"`` for a model whose settings ask for ``requested`` on ``backend``."""
    requested = check_device(requested)
    if requested == "cpu":
        return "cpu"
    count, why = cuda_device_count(backend)
    if requested == "auto":
        return "cuda:0" if count > 0 else "cpu"
    index = device_index(requested)
    if index >= count:
        seen = why or f"only {count} CUDA device(s) are visible"
        raise DeviceConfigError(
            f"model {model} is configured for cuda:{index} on the {backend} backend but that device is not "
            f"visible: {seen}. Set RTSERVE_DEVICE=cpu (or auto), or override this model with "
            f'RTSERVE_MODEL_DEVICES=\'{{"{model}": "cpu"}}\'.'
        )
    return f"cuda:{index}"


def check_backend_precision(backend: str, precision: str, model: str = "the model") -> str:
    precision = check_precision(precision)
    if precision not in BACKEND_PRECISIONS[backend]:
        able = [name for name, allowed in BACKEND_PRECISIONS.items() if precision in allowed]
        raise DeviceConfigError(
            f"model {model} is configured for {precision} on the {backend} backend, which runs "
            f"{', '.join(BACKEND_PRECISIONS[backend])}; {precision} needs the {' or '.join(able)} backend "
            f"(RTSERVE_MODEL_BACKENDS) or another RTSERVE_MODEL_PRECISIONS entry."
        )
    return precision


def torch_dtype(precision: str) -> Any:
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
