"""What every training recipe shares: seeding and the hardware line written into checkpoints."""

from __future__ import annotations

import os
import platform
import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's generators, so a recipe run with one seed repeats itself."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def hardware(threads: int, device: str = "cpu") -> str:
    """The machine a run trained on, as read from it (no hard-coded description)."""
    host = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"torch {torch.__version__}, torch threads={threads}")
    if device.startswith("cuda"):
        return f"{host}, GPU {torch.cuda.get_device_name(device)}"
    return f"{host}, CPU only"
