"""The RMT training command on a tiny Hyperpartisan-format folder: dev selection, and the train+dev refit."""

import json
from pathlib import Path

import pytest

from models.training.rmt import eval_main, train_main

WORDS = "the senate vote budget tax border court policy election reform".split()


def _write_corpus(folder: Path, n_articles: int = 12) -> None:
    articles, truth = [], []
    for i in range(n_articles):
        body = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(120 + 17 * i))  # 1-3 segments of 128 tokens
        articles.append(f'<article id="{i:07d}" title="Article {i}"><p>{body}</p></article>')
        truth.append(f'<article hyperpartisan="{"true" if i % 2 else "false"}" id="{i:07d}"/>')
    (folder / "articles.xml").write_text("<articles>" + "".join(articles) + "</articles>")
    (folder / "ground-truth.xml").write_text("<articles>" + "".join(truth) + "</articles>")
    ids = [f"{i:07d}" for i in range(n_articles)]
    (folder / "splits.json").write_text(json.dumps({"train": ids[:8], "dev": ids[8:10], "test": ids[10:]}))


@pytest.mark.parametrize("fit_on", ["train", "train+dev"])
def test_train_rmt_writes_a_checkpoint_per_recipe(tmp_path, capsys, fit_on):
    data, out = tmp_path / "data", tmp_path / "run"
    data.mkdir()
    _write_corpus(data)
    argv = ["rmt", "--data", str(data), "--out", str(out), "--segments", "3", "--memory-layer", "5",
            "--epochs", "2", "--batch-size", "4", "--cache-dir", str(tmp_path / "cache"), "--fit-on", fit_on]
    assert train_main(argv) == 0
    extras = json.loads((out / "config.json").read_text())["extras"]
    assert len(extras["history"]) == 2 and extras["recipe"]["fit_on"] == fit_on
    if fit_on == "train":  # the epoch with the best dev macro-F1, scored on the 2 dev articles
        assert set(extras["dev"]) == {"accuracy", "macro_f1"}
        assert extras["dev"]["macro_f1"] == max(h["dev_macro_f1"] for h in extras["history"])
    else:  # dev is training data: no dev scores, the last epoch is kept
        assert extras["dev"] == {} and extras["selected_epoch"] == 2
        assert not any("dev_macro_f1" in h for h in extras["history"])
    # eval reports what the checkpoint was trained on, so a dev score of a refit is not mistaken for held-out
    eval_main([str(out), "--data", str(data), "--split", "test"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["trained_on"] == fit_on
