"""The import arrows of the source tree point one way (docs/architecture.md, "Layers"): each folder has one job.

    service/        -> models (families' streams, serving adapters, searches), never models.training
    export/         -> models; never service/
    models/serving  -> models families; never models.training or service
    models (families, streams, searches) -> never models.training, models.serving, service, export
    models/data     -> no model family, recipe or service
    models/families  -> nothing of rtserve at all: a record names its parts by import path (the bottom layer)
    models/srformer, models/salience_head -> never their loaders (models/srformer_weights: checkpoints, MiniLM)
    service, models, export -> never rtserve/ (the command and the client sit on top)

Read from the source (every import statement, including those inside functions), not from what
happens to be imported at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def modules_under(folder: str, exclude: tuple[str, ...] = ()) -> list[Path]:
    return [p for p in sorted((ROOT / folder).rglob("*.py")) if not any(part in p.parts for part in exclude)]


FAMILY_SIDE = [p for p in sorted((ROOT / "models").glob("*.py")) if p.name != "families.py"]
RULES = [
    ("service", modules_under("service"), ("models.training", "export", "rtserve.evaluate")),
    ("export", modules_under("export"), ("service", "rtserve")),
    ("models/serving", modules_under("models/serving"), ("models.training", "service", "export")),
    ("models (families)", FAMILY_SIDE, ("models.training", "models.serving", "models.data", "service", "export")),
    ("models/data", modules_under("models/data"), ("models.training", "models.serving", "service", "export",
                                                   "models.rmt", "models.srformer", "models.rsa", "torch")),
    ("models/training", modules_under("models/training"), ("service", "export")),
    ("family records", [ROOT / "models" / "families.py"],
     ("torch", "numpy", "models", "service", "export", "rtserve", "loadtest")),
    ("nothing below the command imports it", [*modules_under("service"), *modules_under("models"),
                                              *modules_under("export")], ("rtserve",)),
    # a model is defined apart from where its weights come from (models/srformer_weights.py)
    ("SRformer model apart from its loaders", [ROOT / "models" / "srformer.py", ROOT / "models" / "salience_head.py"],
     ("models.srformer_weights", "models.checkpoint", "models.minilm")),
    # what the service runs on the ONNX path (the streams, the search, sentence copy and letter case): numpy only,
    # so serving needs no PyTorch install
    ("torch-free streams", [ROOT / "models" / f"{name}.py" for name in
                            ("tensor_spec", "text_stream", "summary_stream", "classifier_stream", "decoding",
                             "copy_units", "sentence_choice", "letter_case")],
     ("torch", "models.segment", "models.rmt", "models.srformer", "models.minilm")),
]


# Inside service/, bottom to top: the foundation (settings, metrics, logging, the garbage collector, the Redis
# connection, codecs), then the runtime (models, pipelines, batchers, backends) and the session store (scripts, leases,
# commits, kept states) side by side, then the session flow over both, then HTTP (middleware, errors, the fast path,
# routers, the app).
FOUNDATION = ("settings", "devices", "metrics", "gpu_metrics", "logs", "loop_lag", "collector", "tensor_codec",
              "result_json", "state_store", "embedded_redis", "schemas")
SERVICE = sorted({p.stem for p in (ROOT / "service").glob("*.py")} | {p.name for p in (ROOT / "service").iterdir()
                                                                      if p.is_dir() and (p / "__init__.py").exists()})


def service_modules_but(*allowed: str) -> tuple[str, ...]:
    """Every ``service.<x>`` a module may not import: all but the foundation and ``allowed``."""
    return tuple(f"service.{name}" for name in SERVICE if name not in (*FOUNDATION, *allowed, "__init__"))


SERVICE_RULES = [
    ("the foundation imports only the foundation", [ROOT / "service" / f"{name}.py" for name in FOUNDATION],
     service_modules_but()),
    ("the runtime imports no session store and no HTTP", modules_under("service/runtime"),
     service_modules_but("runtime")),
    ("the session store imports no runtime and no HTTP", modules_under("service/sessions"),
     service_modules_but("sessions")),
    ("the flow imports no HTTP", [ROOT / "service" / "session_flow.py"],
     service_modules_but("runtime", "sessions")),
    ("only the app includes routers", [p for p in modules_under("service") if p.parent.name != "routers"
                                       and p.name != "app.py"], ("service.routers",)),
    ("the API keys are below the sessions", [ROOT / "service" / "auth.py"], ("service.sessions",)),
]


@pytest.mark.parametrize(("room", "files", "forbidden"), SERVICE_RULES, ids=[rule[0] for rule in SERVICE_RULES])
def test_inside_the_service_imports_point_one_way(room: str, files: list[Path], forbidden: tuple[str, ...]) -> None:
    test_imports_point_one_way(room, files, forbidden)


@pytest.mark.parametrize(("room", "files", "forbidden"), RULES, ids=[rule[0] for rule in RULES])
def test_imports_point_one_way(room: str, files: list[Path], forbidden: tuple[str, ...]) -> None:
    assert files, f"no modules found for {room}"
    wrong = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in imports_of(path)
        if any(name == bad or name.startswith(bad + ".") for bad in forbidden)
    }
    assert not wrong, "\n".join(sorted(wrong))
