"""One folder per trained model: ``config.json`` + ``model.safetensors``.

``config.json`` holds the family name, the model config (a dataclass, as a
dict) and any extras the model needs to be served (scaler, label names,
training recipe and measured quality). ``model.safetensors`` holds only the
parameters training produced — for models built on the pip-installed MiniLM,
only what differs from it — so the committed weights stay small.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


@dataclasses.dataclass
class Checkpoint:
    family: str  # "rsa", "rtransformer", "vanilla", "rmt", "srformer"
    config: dict[str, Any]  # the family's config dataclass, as a dict
    state_dict: dict[str, torch.Tensor]
    extras: dict[str, Any]  # scaler, labels, recipe, metrics ...
    folder: Path | None = None

    def sha256(self) -> str:
        """Hash of the weights file: names the source of an export."""
        if self.folder is None:
            raise ValueError("checkpoint was not loaded from a folder")
        return hashlib.sha256((self.folder / WEIGHTS_FILE).read_bytes()).hexdigest()


def save_checkpoint(
    folder: str | Path,
    family: str,
    config: Any,
    state_dict: dict[str, torch.Tensor],
    extras: dict[str, Any] | None = None,
) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config_dict = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    document = {"family": family, "config": config_dict, "extras": extras or {}}
    (folder / CONFIG_FILE).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in state_dict.items()}
    save_file(tensors, str(folder / WEIGHTS_FILE))
    return folder


def load_checkpoint(folder: str | Path) -> Checkpoint:
    folder = Path(folder)
    config_path = folder / CONFIG_FILE
    if not config_path.exists():
        raise FileNotFoundError(f"{folder} is not a checkpoint: it has no {CONFIG_FILE}")
    document = json.loads(config_path.read_text())
    state_dict = load_file(str(folder / WEIGHTS_FILE))
    return Checkpoint(document["family"], document["config"], state_dict, document.get("extras", {}), folder)


def read_family(folder: str | Path) -> str:
    """The family of a checkpoint folder or of a model-repository entry (``manifest.json``)."""
    folder = Path(folder)
    for name in (CONFIG_FILE, "manifest.json"):
        path = folder / name
        if path.exists():
            return str(json.loads(path.read_text())["family"])
    raise FileNotFoundError(f"{folder} has neither {CONFIG_FILE} (checkpoint) nor manifest.json (export)")
