"""The blind-judgement sheet: written blind, filled by a reader, un-blinded by `rtserve judgement score`."""

import json
from dataclasses import dataclass

import pytest

from rtserve.cli import main
from rtserve.judgement import CRITERIA, SheetError, key_path, merge, score, shown, write_sheet


@dataclass
class Pair:
    key: str
    document: str


PAIRS = [Pair(f"business/{i:03d}.txt", f"Document {i} says prices fell. Sales rose.") for i in range(6)]
SYSTEMS = {
    "model": [f"prices sales prices {i}." for i in range(6)],
    "lead_same_length": [f"Document {i} says prices fell." for i in range(6)],
    "reference": [f"Prices fell.Sales rose in {i}." for i in range(6)],
}
# what a reader would give each system, to be read back by the scorer
GIVEN = {"model": 1, "lead_same_length": 5, "reference": 4}


def _write(tmp_path, name="sheet.json", seed=3, corpus="bbc", count=4):
    return write_sheet(tmp_path / name, PAIRS, SYSTEMS, count=count, seed=seed,
                       about={"corpus": corpus, "split": "dev", "entry": "repo/srformer-news/1"})


def _fill(sheet_path, given=GIVEN):
    """A reader's scores, filled in by looking up the key (the test knows what a reader would not)."""
    sheet = json.loads(sheet_path.read_text())
    key = {entry["item"]: entry for entry in json.loads(key_path(sheet_path).read_text())["items"]}
    for item in sheet["items"]:
        for label, system in key[item["item"]]["systems"].items():
            item["scores"][label] = dict.fromkeys(CRITERIA, given[system])
    sheet_path.write_text(json.dumps(sheet))
    return sheet


def test_the_sheet_names_no_system_and_keeps_the_key_apart(tmp_path):
    sheet_path, key = _write(tmp_path)
    assert key == tmp_path / "sheet.key.json"
    text = sheet_path.read_text()
    sheet = json.loads(text)
    for secret in ("model", "lead", "reference", "business/", "srformer"):
        assert secret not in text, secret
    assert len(sheet["items"]) == 4 and sheet["instructions"]
    for item in sheet["items"]:
        assert sorted(item["candidates"]) == ["A", "B", "C"]
        assert item["document"].startswith("Document ")
        assert all(value is None for scores in item["scores"].values() for value in scores.values())
    # the reference's glued sentences are shown with a space, like every other candidate
    assert any("Prices fell. Sales rose in" in text for item in sheet["items"] for text in item["candidates"].values())
    # shuffled: the systems do not sit under the same letter on every item
    systems = [entry["systems"]["A"] for entry in json.loads(key.read_text())["items"]]
    assert len(set(systems)) > 1


def test_the_same_seed_writes_the_same_sheet(tmp_path):
    first, _ = _write(tmp_path, "one.json", seed=7)
    second, _ = _write(tmp_path, "two.json", seed=7)
    third, _ = _write(tmp_path, "three.json", seed=8)
    assert first.read_text() == second.read_text() != third.read_text()


def test_a_filled_sheet_round_trips_to_each_systems_mean(tmp_path, capsys):
    sheet_path, _ = _write(tmp_path)
    _fill(sheet_path)
    means = score(sheet_path)["means"]
    assert set(means) == {"bbc"}
    for system, value in GIVEN.items():
        assert means["bbc"][system] == {**dict.fromkeys(CRITERIA, float(value)), "documents": 4}
    assert main(["judgement", "score", str(sheet_path)]) == 0
    out = capsys.readouterr().out
    assert "| bbc | model | 1.00 | 1.00 | 1.00 | 4 |" in out


def test_a_sheet_with_missing_or_out_of_range_scores_is_refused_naming_the_item(tmp_path, capsys):
    sheet_path, _ = _write(tmp_path)
    sheet = _fill(sheet_path)
    sheet["items"][1]["scores"]["B"]["coherence"] = 6
    sheet["items"][2]["scores"]["A"]["fluency"] = None
    sheet["items"][3]["scores"]["C"]["faithfulness"] = 4.5
    sheet_path.write_text(json.dumps(sheet))
    with pytest.raises(SheetError) as refused:
        score(sheet_path)
    message = str(refused.value)
    assert "item 2, candidate B: coherence is 6, not a whole number from 1 to 5" in message
    assert "item 3, candidate A: fluency is missing" in message
    assert "item 4, candidate C: faithfulness is 4.5" in message
    assert main(["judgement", "score", str(sheet_path)]) == 2
    captured = capsys.readouterr()
    assert "item 2, candidate B" in captured.err and captured.out == ""


def test_a_key_written_with_another_sheet_is_refused(tmp_path):
    sheet_path, _ = _write(tmp_path, "one.json", seed=1)
    _, other_key = _write(tmp_path, "two.json", seed=2)
    _fill(sheet_path)
    with pytest.raises(SheetError, match="differ from the ones the key was written with|not in the key"):
        score(sheet_path, other_key)


def test_merged_sheets_are_scored_per_corpus(tmp_path):
    news, _ = _write(tmp_path, "news.json", corpus="bbc", count=3)
    pubmed, _ = _write(tmp_path, "pubmed.json", corpus="sumpubmed", count=2, seed=5)
    merged, _ = merge(tmp_path / "both.json", [news, pubmed], seed=0)
    assert len(json.loads(merged.read_text())["items"]) == 5
    _fill(merged)
    means = score(merged)["means"]
    assert means["bbc"]["model"]["documents"] == 3 and means["sumpubmed"]["reference"]["documents"] == 2


def test_every_candidate_is_laid_out_alike_in_case_and_spacing():
    # a lower-cased corpus's lead beside a served summary that capitalises: the case would name the system
    assert shown("the cells grew. <dig> of them died .") == shown("The cells grew. <dig> of them died .")
    assert shown("the cells grew. <dig> of them died .") == "The cells grew. <dig> of them died ."
    assert shown("the apical  and basolateral  domains grew.") == "The apical and basolateral domains grew."
