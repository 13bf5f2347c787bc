"""`rtserve eval` on an exported entry (the serving path) reproduces the checkpoint's figures."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ETTH1 = Path(__file__).resolve().parents[2] / "shared" / "data" / "ETT-small" / "ETTh1.csv"


def _eval(target: Path, *extra: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "rtserve.cli", "eval", str(target), *extra],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not ETTH1.exists(), reason=f"dataset not found at {ETTH1} (../shared/data)")
def test_forecaster_entry_scores_like_its_checkpoint(forecast_repository):
    repository, checkpoint = forecast_repository
    entry = repository / "rsa-tiny" / "1"
    eager = _eval(checkpoint, "--data", str(ETTH1), "--split", "val")
    exported = _eval(entry, "--data", str(ETTH1), "--split", "val")
    assert exported["windows"] == eager["windows"] > 0
    assert exported["mse"] == pytest.approx(eager["mse"], rel=1e-5)
    assert exported["mae"] == pytest.approx(eager["mae"], rel=1e-5)


def _tiny_bbc(root: Path) -> Path:
    """A BBC-layout folder of 12 made-up articles whose summaries are their sentences about a verdict."""
    import random

    rng = random.Random(0)
    filler = "market officials river season board report city plan office growth team week".split()
    keys = []
    for i in range(12):
        key = f"business/{i + 1:03d}.txt"
        parts = [" ".join(rng.choice(filler) for _ in range(7)).capitalize() + "." for _ in range(6)]
        verdict = f"The board gave its verdict on the {rng.choice(filler)} plan."
        parts.insert(rng.randrange(1, 6), verdict)
        for folder, text in (("News Articles", f"Title {i}\n\n" + " ".join(parts)), ("Summaries", verdict)):
            (root / folder / "business").mkdir(parents=True, exist_ok=True)
            (root / folder / key).write_text(text)
        keys.append(key)
    (root / "splits.json").write_text(json.dumps({"train": keys[:9], "dev": keys[9:], "test": []}))
    return root


@pytest.mark.slow
def test_summarizer_entry_reports_the_readers_measures_beside_the_baselines(summarize_repository, tmp_path):
    from rtserve.judgement import score

    repository, _ = summarize_repository
    data = _tiny_bbc(tmp_path / "bbc")
    sheet = tmp_path / "sheet.json"
    report = _eval(repository / "srformer-tiny" / "1", "--data", str(data), "--split", "dev",
                   "--decoding", "free", "--judgement-sheet", str(sheet), "--judgement-count", "2",
                   "--summaries-out", str(tmp_path / "summaries.jsonl"))
    systems = report["systems"]
    assert report["pairs"] == 3 and report["corpus"] == "bbc" and report["options"] == {"decoding": "free"}
    assert set(systems) == {"model", "lead_same_length", "lead_3", "extractor", "reference"}
    assert report["rouge1"] == systems["model"]["rouge1"]
    assert report["extractor"]["trained"] and report["extractor"]["documents"] == 9
    for name in ("lead_same_length", "lead_3", "extractor"):
        assert systems[name]["verbatim_sentences"] == 1.0 and systems[name]["cased_as_source"] == 1.0
    assert "rouge1" not in systems["reference"] and systems["reference"]["verbatim_sentences"] == 1.0
    rows = [json.loads(line) for line in (tmp_path / "summaries.jsonl").read_text().splitlines()]
    assert [row["key"] for row in rows] == ["business/010.txt", "business/011.txt", "business/012.txt"]
    assert set(rows[0]) == {"key", "model", "lead_same_length", "lead_3", "extractor", "reference"}
    assert all(row["model"] and row["reference"] in row["extractor"] for row in rows)  # its first pick: the verdict
    # the sheet: two documents, model / same-length lead / reference / extractor behind A, B, C, D
    items = json.loads(sheet.read_text())["items"]
    assert len(items) == 2
    key = json.loads(sheet.with_name("sheet.key.json").read_text())
    assert {frozenset(entry["systems"].values()) for entry in key["items"]} == {
        frozenset({"model", "lead_same_length", "reference", "extractor"})}
    with pytest.raises(ValueError, match="item 1, candidate A: fluency is missing"):
        score(sheet)
