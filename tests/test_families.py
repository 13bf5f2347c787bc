"""One record per family: the registry of built-in and installed families, and what it keeps out of the
generic layers."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from models.families import BUILT_IN, CLASSIFY, TASKS, Family, UnknownFamily, families, family, load_part, refresh
from service.metrics import ServiceMetrics
from service.runtime.registry import ModelRegistry, UnknownModel
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("record", BUILT_IN, ids=[record.name for record in BUILT_IN])
def test_every_part_of_a_built_in_family_is_what_its_field_says(record):
    import dataclasses
    import inspect

    import torch
    from pydantic import BaseModel

    assert callable(record.part("adapter")) and inspect.signature(record.part("adapter")).parameters
    pipeline = record.part("pipeline")
    assert inspect.isclass(pipeline) and pipeline.task == record.task
    assert pipeline.input_kind in ("text", "rows")
    assert issubclass(record.part("finish"), BaseModel) and "session" in record.part("finish").model_fields
    recipe = record.part("recipe")
    assert callable(recipe.train_main) and callable(recipe.eval_main)
    assert inspect.iscoroutinefunction(record.part("evaluate"))
    assert callable(record.part("reader"))
    if record.config is not None:
        assert dataclasses.is_dataclass(record.part("config"))
        assert issubclass(record.part("model"), torch.nn.Module)


def test_reading_the_registry_imports_no_model_or_service_code():
    script = ("import sys; from models.families import families; names = [f.name for f in families()]; "
              "print(sorted(({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy', 'service', 'export', "
              "'onnxruntime', 'rtserve'}) | ({m for m in sys.modules if m.startswith('models.')} - "
              "{'models.families'})), names)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    heavy, names = done.stdout.strip().split("] ")
    assert heavy == "[" and "'rmt'" in names and "'srformer'" in names


def test_a_record_names_its_task_and_import_paths():
    with pytest.raises(ValueError, match="task 'translate' is not one of"):
        Family("x", task="translate", adapter="a:b", pipeline="a:b", finish="a:b")
    with pytest.raises(ValueError, match="is not an import path"):
        Family("x", adapter="not a path", recipe=None, **CLASSIFY)
    with pytest.raises(LookupError, match="family 'y' has no evaluate"):
        Family("y", adapter="a:b", **(CLASSIFY | {"evaluate": None})).part("evaluate")


def test_an_unknown_family_is_named_with_the_families_there_are():
    with pytest.raises(UnknownFamily, match=r"no model family 'nope'.*'rmt'.*rtserve\.families"):
        family("nope")


def _install(site: Path, distribution: str, entry_points: str, modules: dict[str, str]) -> None:
    """A distribution as pip leaves it in site-packages: its modules and a dist-info with entry points."""
    info = site / f"{distribution}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    for name, source in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path standing in for site-packages; the registry is read again before and after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    refresh()
    yield tmp_path
    monkeypatch.undo()
    for name in [m for m in sys.modules if m.startswith("fake_family")]:
        del sys.modules[name]
    refresh()


RECORD = """
from models.families import Family
from models.families import CLASSIFY

FAMILY = Family("fake-classifier", adapter="fake_family_adapter:servable", **CLASSIFY)
WRONG_NAME = Family("other-name", adapter="fake_family_adapter:servable", **CLASSIFY)
NOT_A_RECORD = {"name": "fake"}
"""


def test_a_family_installed_by_another_package_joins_the_registry(site):
    _install(site, "fake_family", """
        [rtserve.families]
        fake-classifier = fake_family_record:FAMILY
    """, {"fake_family_record": RECORD})
    refresh()
    record = family("fake-classifier")
    assert record.task == "classify" and record in families("classify")
    assert [f.name for f in families()][: len(BUILT_IN)] == [f.name for f in BUILT_IN]
    assert "fake_family_adapter" not in sys.modules  # a part is imported only when used


def test_a_broken_entry_point_is_named_and_hides_no_other_family(site):
    _install(site, "fake_family", """
        [rtserve.families]
        fake-missing = fake_family_missing:FAMILY
        rmt = fake_family_record:FAMILY
        other = fake_family_record:WRONG_NAME
        plain = fake_family_record:NOT_A_RECORD
        fake-classifier = fake_family_record:FAMILY
    """, {"fake_family_record": RECORD})
    refresh()
    assert family("fake-classifier").name == "fake-classifier"
    assert family("rmt") in BUILT_IN  # a package cannot replace a built-in family
    with pytest.raises(UnknownFamily, match="cannot be loaded: ModuleNotFoundError"):
        family("fake-missing")
    with pytest.raises(UnknownFamily, match="names family 'other-name'"):
        family("other")
    with pytest.raises(UnknownFamily, match="is a dict, not a models.families.Family"):
        family("plain")


async def test_a_model_of_a_family_not_installed_is_reported_and_the_others_load(forecast_repository, tmp_path):
    repository = tmp_path / "repository"
    shutil.copytree(forecast_repository[0], repository)
    stranger = repository / "stranger"
    shutil.copytree(repository / "rsa-tiny", stranger)
    manifest_path = stranger / "1" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "name": "stranger", "family": "gru-forecaster"}))
    registry = ModelRegistry(Settings(model_repository=repository), ServiceMetrics())
    await registry.load_all()
    assert sorted(registry.models) == ["rsa-tiny:1"]
    assert "no model family 'gru-forecaster'" in registry.errors["stranger:1"]
    await registry.close()


async def test_a_model_named_without_a_version_is_its_latest_version_by_number(forecast_repository, tmp_path):
    repository = tmp_path / "repository"
    shutil.copytree(forecast_repository[0], repository)
    for version in ("9", "10"):
        shutil.copytree(repository / "rsa-tiny" / "1", repository / "rsa-tiny" / version)
    registry = ModelRegistry(Settings(model_repository=repository), ServiceMetrics())
    await registry.load_all()
    assert registry.resolve("rsa-tiny", None).ref == "rsa-tiny:10"  # 10 after 9, as numbers
    assert registry.resolve("rsa-tiny", "forecast").ref == "rsa-tiny:10"
    assert registry.resolve("rsa-tiny:9", None).ref == "rsa-tiny:9"
    assert registry.resolve("rsa-tiny:", None).ref == "rsa-tiny:10"
    with pytest.raises(UnknownModel, match="serves 'forecast', not 'classify'"):
        registry.resolve("rsa-tiny", "classify")
    with pytest.raises(UnknownModel, match="has no version '2'"):
        registry.resolve("rsa-tiny:2", None)
    await registry.close()


# modules that serve every task alike: a comparison with a task's name there is a per-task branch
GENERIC = ["service/routers/sessions.py", "service/session_flow.py", "service/runtime/registry.py",
           "service/runtime/pipeline.py", "service/app.py", "service/sse.py",
           "models/serving/servable.py", "export/exporter.py", "service/routers/v2.py",
           *(f"service/kserve/{name}.py" for name in ("tensors", "signature", "sequences", "inference", "protobuf",
                                                       "grpc_service", "schemas"))]


@pytest.mark.parametrize("path", GENERIC)
def test_generic_layers_have_no_per_task_branch(path):
    tree = ast.parse((ROOT / path).read_text())
    branches = [
        f"{path}:{node.lineno}" for node in ast.walk(tree)
        if isinstance(node, ast.Compare) and any(
            isinstance(side, ast.Constant) and side.value in TASKS for side in [node.left, *node.comparators])
        or isinstance(node, ast.Dict) and any(isinstance(key, ast.Constant) and key.value in TASKS for key in node.keys)
    ]
    assert not branches, branches


def test_load_part_takes_a_module_or_an_attribute():
    assert load_part("json") is json and load_part("json:dumps") is json.dumps
