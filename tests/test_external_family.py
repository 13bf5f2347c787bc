"""A family written outside this repository (examples/rtserve-gru-classifier, a GRU long-document classifier)
is installed with pip, trained, exported, scored and served by rtserve, with no edit to rtserve: it joins
through its package's ``rtserve.families`` entry point.

pip installs it into a folder of its own (``--target``) that the commands below get on ``PYTHONPATH``, so
the suite's environment is left as it was; the build runs on a copy of the example (setuptools writes
beside the sources)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "rtserve-gru-classifier"
pytestmark = pytest.mark.slow

POSITIVE = "excellent wonderful superb delightful brilliant lovely great fine".split()
NEGATIVE = "terrible awful dreadful horrible poor bad dismal nasty".split()
FILLER = ("the a report said on monday that people in the city and the market were talking about it again "
          "today").split()


def write_corpus(path: Path, count: int, seed: int) -> None:
    """Documents of 20-160 words (several 32-token segments), a sixth of them words of their label's tone."""
    rng = random.Random(seed)
    with path.open("w") as out:
        for index in range(count):
            label = "positive" if index % 2 else "negative"
            tone = POSITIVE if label == "positive" else NEGATIVE
            words = [rng.choice(tone) if rng.random() < 0.15 else rng.choice(FILLER)
                     for _ in range(rng.randint(20, 160))]
            out.write(json.dumps({"text": " ".join(words), "label": label}) + "\n")


def rtserve(env: dict[str, str], cwd: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "rtserve", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """The example installed by pip into ``site/``, and the environment that puts it on the path."""
    root = tmp_path_factory.mktemp("external-family")
    shutil.copytree(EXAMPLE, root / "source", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(root / "site"), str(root / "source")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    write_corpus(root / "train.jsonl", 80, seed=0)
    write_corpus(root / "dev.jsonl", 40, seed=1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTSERVE_")} | {"PYTHONPATH": str(root / "site")}
    return root, env


@pytest.fixture(scope="module")
def trained(workspace):
    root, env = workspace
    out = rtserve(env, root, "train", "gru-classifier", "--train", str(root / "train.jsonl"), "--dev",
                  str(root / "dev.jsonl"), "--out", str(root / "checkpoint"), "--epochs", "8", "--segment-size",
                  "32", "--hidden", "32", "--embed", "32")
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def entry(workspace, trained):
    root, env = workspace
    rtserve(env, root, "export", str(root / "checkpoint"), "--name", "gru-tiny", "--out", str(root / "repository"))
    return root / "repository" / "gru-tiny" / "1"


def test_the_installed_family_is_listed_and_trains_to_a_score(workspace, trained):
    root, env = workspace
    assert "gru-classifier" in rtserve(env, root, "train", "--help")
    assert trained["labels"] == ["negative", "positive"]
    assert trained["dev_accuracy"] >= 0.75  # chance is 0.5; held-out documents


def test_the_exported_entry_scores_as_its_checkpoint(workspace, entry):
    root, env = workspace
    manifest = json.loads((entry / "manifest.json").read_text())
    assert (manifest["family"], manifest["task"]) == ("gru-classifier", "classify")
    assert (entry / "step.onnx").exists() and manifest["settings"]["labels"] == ["negative", "positive"]
    served = json.loads(rtserve(env, root, "eval", str(entry), "--data", str(root / "dev.jsonl")).splitlines()[-1])
    eager = json.loads(rtserve(env, root, "eval", str(root / "checkpoint"), "--data",
                               str(root / "dev.jsonl")).splitlines()[-1])
    assert served["documents"] == eager["documents"] == 40
    assert abs(served["accuracy"] - eager["accuracy"]) <= 1 / 40  # ONNX against eager: at most one flip


SERVE = """
import json, sys
from fastapi.testclient import TestClient
from service.app import create_app
from service.settings import Settings

repository, redis_url, prefix, text = sys.argv[1:]
settings = Settings(model_repository=repository, redis_url=redis_url, redis_key_prefix=prefix, backend="onnx")
with TestClient(create_app(settings)) as client:
    models = client.get("/models").json()
    whole = client.post("/classify", json={"text": text, "model": "gru-tiny"}).json()
    session = client.post("/sessions", json={"model": "gru-tiny"}).json()["id"]
    pieces = [text[i : i + 37] for i in range(0, len(text), 37)]
    for seq, piece in enumerate(pieces, start=1):
        assert client.post(f"/sessions/{session}/segments", json={"seq": seq, "text": piece}).status_code == 200
    streamed = client.post(f"/sessions/{session}/finish").json()
print(json.dumps({"models": models, "whole": whole, "streamed": streamed, "torch": "torch" in sys.modules}))
"""


def test_the_service_serves_it_and_a_streamed_document_equals_the_whole(workspace, entry, redis_url, key_prefix):
    root, env = workspace
    text = (root / "dev.jsonl").read_text().splitlines()[3]
    text = json.loads(text)["text"] + " " + json.loads((root / "dev.jsonl").read_text().splitlines()[5])["text"]
    done = subprocess.run([sys.executable, "-c", SERVE, str(root / "repository"), redis_url, key_prefix, text],
                          env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    (model,) = report["models"]
    assert (model["name"], model["family"], model["task"]) == ("gru-tiny", "gru-classifier", "classify")
    whole, streamed = report["whole"], report["streamed"]
    assert whole["label"] in ("negative", "positive") and whole["segments"] >= 3
    assert streamed["label"] == whole["label"] and streamed["segments"] == whole["segments"]
    for label, p in whole["probabilities"].items():
        assert abs(streamed["probabilities"][label] - p) <= 1e-5
    assert report["torch"] is False  # served on ONNX Runtime: the family's record pulls in no torch
