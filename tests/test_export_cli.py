"""`rtserve export` as a user runs it: the graphs the configured backend loads and no others, one readable line per
model as it starts and as it ends (JSON on stdout for scripts), and entries whose files any user can read."""

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from export import exporter
from export.cli import FORMATS, main

GRAPH_SUFFIXES = {".onnx": "onnx", ".ts": "torchscript"}


@pytest.fixture
def checkpoint(tiny_models, tmp_path):
    """A copy of the tiny forecaster's checkpoint whose weights only their owner may read (as a training run
    under a strict umask leaves them)."""
    folder = Path(shutil.copytree(tiny_models.checkpoint("rsa-tiny"), tmp_path / "weights" / "rsa-tiny"))
    (folder / "model.safetensors").chmod(0o600)
    return folder


def export(argv, umask, capsys, monkeypatch, **env):
    for name in ("RTSERVE_BACKEND", "RTSERVE_MODEL_BACKENDS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = os.umask(umask)
    try:
        assert main([*argv, "--cpu-threads", "1"]) == 0
    finally:
        os.umask(before)
    return capsys.readouterr()


def graphs_in(entry):
    return {GRAPH_SUFFIXES[path.suffix] for path in entry.iterdir() if path.suffix in GRAPH_SUFFIXES}


def modes(entry):
    return {str(path.relative_to(entry)): stat.S_IMODE(path.stat().st_mode) for path in entry.rglob("*")}


def test_export_writes_only_the_onnx_graphs_the_default_backend_loads_and_says_so(checkpoint, tmp_path, capsys,
                                                                                    monkeypatch):
    out = tmp_path / "repository"
    printed = export([str(checkpoint), "--out", str(out)], 0o022, capsys, monkeypatch)
    entry = out / "rsa-tiny" / "1"
    assert graphs_in(entry) == {"onnx"}
    assert {kind for graph in json.loads((entry / "manifest.json").read_text())["graphs"] for kind in graph["files"]} \
        == {"onnx"}
    lines = printed.err.splitlines()
    assert "rtserve export: [1/1] rsa-tiny: onnx ..." in lines
    assert any(line.startswith("rtserve export: [1/1] rsa-tiny: done in ") and line.endswith(f"s -> {entry}")
               for line in lines), lines
    [written] = [json.loads(line) for line in printed.out.splitlines()]
    assert written["entry"] == str(entry) and written["formats"] == ["onnx"]


def test_every_file_of_an_exported_entry_is_readable_by_every_user_the_umask_allows(checkpoint, tmp_path, capsys,
                                                                                      monkeypatch):
    for umask, file_mode, folder_mode in ((0o022, 0o644, 0o755), (0o027, 0o640, 0o750)):
        out = tmp_path / f"repository-{umask:o}"
        export([str(checkpoint), "--out", str(out), "--format", "torchscript"], umask, capsys, monkeypatch)
        entry = out / "rsa-tiny" / "1"
        found = modes(entry)
        assert {"initial_state.safetensors", "checkpoint/model.safetensors", "manifest.json", "step.ts"} <= set(found)
        wrong = {name: oct(mode) for name, mode in found.items()
                 if mode != (folder_mode if (entry / name).is_dir() else file_mode)}
        assert not wrong, (oct(umask), wrong)


@pytest.mark.parametrize(("env", "argv", "expected"), [
    ({"RTSERVE_BACKEND": "torchscript"}, [], {"torchscript"}),
    ({"RTSERVE_BACKEND": "torchscript", "RTSERVE_MODEL_BACKENDS": '{"rsa-tiny": "torch"}'}, [], set()),
    ({}, ["--format", "onnx,torchscript"], {"onnx", "torchscript"}),
], ids=["torchscript-backend", "torch-backend-for-this-model", "asked-for-both"])
def test_export_writes_torchscript_when_the_backend_loads_it_or_when_asked(env, argv, expected, checkpoint, tmp_path,
                                                                           capsys, monkeypatch):
    out = tmp_path / "repository"
    export([str(checkpoint), "--out", str(out), *argv], 0o022, capsys, monkeypatch, **env)
    assert graphs_in(out / "rsa-tiny" / "1") == expected


def test_a_folder_that_is_no_checkpoint_is_one_line_and_exit_status_1(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main([str(tmp_path)])
    assert done.value.code == f"rtserve export: {tmp_path} is not a checkpoint folder: it has no config.json"


def test_the_command_knows_every_format_the_exporter_writes():
    assert FORMATS == exporter.FORMATS


def test_missing_exports_only_an_entry_that_lacks_the_graphs_its_backend_loads_and_keeps_the_others(
        checkpoint, tmp_path, capsys, monkeypatch):
    out = tmp_path / "repository"
    entry = out / "rsa-tiny" / "1"
    export(["--all", str(checkpoint.parent), "--out", str(out), "--missing"], 0o022, capsys, monkeypatch)
    assert graphs_in(entry) == {"onnx"}
    written = (entry / "step.onnx").stat().st_mtime_ns
    printed = export(["--all", str(checkpoint.parent), "--out", str(out), "--missing"], 0o022, capsys, monkeypatch)
    assert printed.out == "" and (entry / "step.onnx").stat().st_mtime_ns == written
    assert printed.err.strip() == f"rtserve export: every entry in {out}/ holds the graphs its backend loads"
    # the settings now serve it with TorchScript: its graphs are added, the ONNX ones kept
    export(["--all", str(checkpoint.parent), "--out", str(out), "--missing"], 0o022, capsys, monkeypatch,
           RTSERVE_MODEL_BACKENDS='{"rsa-tiny": "torchscript"}')
    assert graphs_in(entry) == {"onnx", "torchscript"}
