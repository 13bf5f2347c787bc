"""Every source module is named in tests/README.md, the map from each part of rtserve to the tests that show it
works: a module added later is found there, with its tests."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("service", "models", "export", "rtserve", "loadtest")


def named(path: Path, text: str) -> bool:
    """Whether the map names ``path`` (``service/routers/streams.py``): by its path within its package
    (``routers/streams.py``), its file name, or a folder above it (``routers/``, ``service/sessions/`` as
    ``sessions/``)."""
    inside = path.relative_to(ROOT / path.relative_to(ROOT).parts[0])
    candidates = {f"`{inside.as_posix()}`", f"`{path.relative_to(ROOT).as_posix()}`", f"`{path.name}`"}
    candidates |= {f"`{folder.as_posix()}/`" for folder in inside.parents if folder != Path(".")}
    candidates |= {f"`{path.relative_to(ROOT).parts[0]}/{folder.as_posix()}/`" for folder in inside.parents
                   if folder != Path(".")}
    if path.parent == ROOT / "export":
        candidates.add("`export/`")
    return any(candidate in text for candidate in candidates)


def test_every_source_module_is_on_the_test_map():
    text = (ROOT / "tests" / "README.md").read_text()
    modules = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
               if path.name != "__init__.py"]
    assert len(modules) > 100
    missing = [str(path.relative_to(ROOT)) for path in modules if not named(path, text)]
    assert not missing, f"not on tests/README.md: {missing}"


def test_every_test_file_on_the_map_exists():
    text = (ROOT / "tests" / "README.md").read_text()
    import re

    listed = set(re.findall(r"`(test_[a-z0-9_]+\.py)`", text))
    assert listed and not [name for name in sorted(listed) if not (ROOT / "tests" / name).exists()]
