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



def test_random_segments_draws_a_count_per_article_and_step(tmp_path, monkeypatch):
    from models.rmt import RMT

    data = tmp_path / "data"
    data.mkdir()
    _write_corpus(data)  # 8 training articles of 1-2 segments
    seen: list[list[int]] = []
    forward = RMT.forward_segments

    def recording(self, segs, counts, **kwargs):
        if self.training:
            seen.append(counts.tolist())
        return forward(self, segs, counts, **kwargs)

    monkeypatch.setattr(RMT, "forward_segments", recording)

    def epochs_of_counts(*flags: str) -> list[list[int]]:
        seen.clear()
        out = tmp_path / ("run" + "".join(flags))
        argv = ["rmt", "--data", str(data), "--out", str(out), "--segments", "3", "--memory-layer", "5",
                "--epochs", "3", "--batch-size", "4", "--cache-dir", str(tmp_path / "cache"), *flags]
        assert train_main(argv) == 0
        assert json.loads((out / "config.json").read_text())["extras"]["recipe"]["random_segments"] == bool(flags)
        return [sorted(c for step in seen[e * 2 : e * 2 + 2] for c in step) for e in range(3)]

    as_trained = epochs_of_counts()
    assert len(seen) == 6 and as_trained[0] == as_trained[1] == as_trained[2]  # each article: min(3, its length)
    drawn = epochs_of_counts("--random-segments")
    assert all(len(e) == 8 and min(e) >= 1 for e in drawn)
    # a draw never reads more than the article has, and some read fewer than as trained
    assert all(sum(e) < sum(as_trained[0]) for e in drawn)
    assert len({tuple(e) for e in drawn}) > 1  # drawn again at every step
