"""Cross-validation folds of the RMT recipe (models/training/rmt_cv.py) and of the TF-IDF baseline
(models/training/tfidf_baseline.py)."""

import json
import random

import pytest

from models.data.hyperpartisan import Article
from models.training.rmt_cv import cv_ensemble_main, cv_folds, fold_parts, member_reading
from models.training.tfidf_baseline import tfidf_cv_main


def _articles(n: int = 95, seed: int = 0) -> list[Article]:
    rng = random.Random(seed)
    return [Article(f"{i:07d}", f"text {i}", int(rng.random() < 0.37)) for i in range(n)]


def test_folds_are_disjoint_cover_and_stratified():
    articles = _articles()
    folds = cv_folds(articles, 5, seed=0)
    ids = [i for f in folds for i in f]
    assert len(ids) == len(set(ids)) and set(ids) == {a.id for a in articles}  # disjoint, cover exactly
    assert max(map(len, folds)) - min(map(len, folds)) <= 1
    label = {a.id: a.label for a in articles}
    for wanted in (0, 1):  # every fold holds its share of each label, within one article
        counts = [sum(label[i] == wanted for i in f) for f in folds]
        assert max(counts) - min(counts) <= 1
    train, held = fold_parts(articles, folds, 2)
    assert {a.id for a in held} == set(folds[2]) and not {a.id for a in train} & set(folds[2])
    assert len(train) + len(held) == len(articles)


def test_folds_are_deterministic_and_seeded():
    articles = _articles()
    shuffled = random.Random(1).sample(articles, len(articles))
    assert cv_folds(articles, 5, seed=0) == cv_folds(shuffled, 5, seed=0)  # order of the input does not matter
    assert cv_folds(articles, 5, seed=0) != cv_folds(articles, 5, seed=1)


def test_tfidf_cv_scores_every_fold_on_a_tiny_corpus(tmp_path, capsys):
    rng = random.Random(0)
    articles, truth, ids = [], [], []
    for i in range(30):
        label = i % 3 == 0
        words = rng.choices(["outrage", "traitors", "disgrace"] if label else ["budget", "committee", "report"], k=30)
        body = " ".join(words + rng.choices(["the", "a", "vote", "city"], k=30))
        articles.append(f'<article id="{i:07d}" title="t{i}"><p>{body}</p></article>')
        truth.append(f'<article hyperpartisan="{"true" if label else "false"}" id="{i:07d}"/>')
        ids.append(f"{i:07d}")
    (tmp_path / "articles.xml").write_text("<articles>" + "".join(articles) + "</articles>")
    (tmp_path / "ground-truth.xml").write_text("<articles>" + "".join(truth) + "</articles>")
    (tmp_path / "splits.json").write_text(json.dumps({"train": ids[:20], "dev": ids[20:25], "test": ids[25:]}))
    out = tmp_path / "cv.json"
    assert tfidf_cv_main(["--data", str(tmp_path), "--folds", "3", "--inner-folds", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["fold_ids"] == cv_folds([a for a in _load(tmp_path)], 3, 0)  # the folds cv uses
    assert len(result["folds"]) == 3 and sum(f["n_heldout"] for f in result["folds"]) == 25
    for f in result["folds"]:  # held-out probabilities for exactly the held-out ids, and for all of test
        assert sorted(f["p_hyperpartisan"]["heldout"]["whole_text"]) == result["fold_ids"][f["fold"]]
        assert len(f["p_hyperpartisan"]["test"]["whole_text"]) == 5
    assert result["summary"]["heldout_whole_text"]["macro_f1"]["mean"] > 0.9  # separable words
    assert "heldout_whole_text" in capsys.readouterr().out
    # an ensemble of a run with itself scores as the run: probabilities are averaged per article
    ensemble = tmp_path / "ensemble.json"
    assert cv_ensemble_main([str(out), str(out), "--data", str(tmp_path), "--out", str(ensemble)]) == 0
    assert json.loads(ensemble.read_text())["summary"] == result["summary"]


def test_a_run_with_one_reading_joins_every_reading_of_an_ensemble():
    """TF-IDF's single reading (the whole text) is averaged into each of an RMT run's readings."""
    rmt = {"as_trained": {"a": 0.2}, "all_cached": {"a": 0.4}}
    tfidf = {"whole_text": {"a": 0.9}}
    assert member_reading(rmt, "all_cached") == {"a": 0.4}
    assert member_reading(tfidf, "as_trained") == member_reading(tfidf, "all_cached") == {"a": 0.9}
    with pytest.raises(ValueError, match="no reading"):
        member_reading(rmt, "whole_text")


def _load(folder):
    from models.data.hyperpartisan import load_split

    return load_split(folder, "train") + load_split(folder, "dev")
