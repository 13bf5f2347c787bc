"""What every training recipe shares: its commands' parsers, seeding, and the recipe and hardware lines written
into checkpoints."""

from __future__ import annotations

import argparse
import os
import platform
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from models.cli_help import HelpFormatter


def command_parser(prog: str, description: str | None = None,
                   parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """The parser of a recipe's command (``rtserve train <family>``, ``rtserve eval``, ...): every flag's help
    ends with its default, once, where it has one (:class:`models.cli_help.HelpFormatter`)."""
    return argparse.ArgumentParser(prog=prog, description=description, parents=list(parents),
                                   formatter_class=HelpFormatter)


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


def recipe_record(args: argparse.Namespace) -> dict[str, object]:
    """A run's command-line flags as JSON values (paths as strings), for its checkpoint or result file."""
    return {name: str(value) if isinstance(value, Path) else value for name, value in vars(args).items()}
