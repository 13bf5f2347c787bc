"""The user's own data files: what the readers take, the errors they give (file and line), the command's
exit without a traceback, and a classifier trained from JSON Lines, exported and served with its labels."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from models.checkpoint import load_checkpoint
from models.data.files import (
    DataFileError,
    check_labels,
    label_set,
    read_labelled_texts,
    read_series,
    read_text_pairs,
)
from rtserve.cli import main as rtserve

TOPICS = {
    "sport": "match goal team player season coach league win".split(),
    "weather/climate": "rain storm wind cloud sun forecast cold snow".split(),
    "music": "song album band guitar concert singer tour chart".split(),
}
COMMON = "the a of and to in on with for by".split()


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def topic_corpus(path: Path, count: int, seed: int, text_field: str = "text", label_field: str = "label") -> Path:
    """Documents of 40-130 words, half of them words of their label's topic."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        label = list(TOPICS)[index % len(TOPICS)]
        words = [rng.choice(TOPICS[label] if rng.random() < 0.5 else COMMON) for _ in range(rng.randint(40, 130))]
        rows.append({text_field: " ".join(words), label_field: label, "id": index})
    return write_jsonl(path, rows)


# ---- JSON Lines ------------------------------------------------------------------------------------------


def test_labelled_texts_keep_the_files_labels_and_lines(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"body": "first", "topic": "b"}, "", {"body": "second", "topic": 3},
                                              {"body": "third", "topic": "a", "extra": [1]}])
    examples = read_labelled_texts(path, text_field="body", label_field="topic")
    assert [(e.text, e.label, e.line) for e in examples] == [("first", "b", 1), ("second", "3", 3), ("third", "a", 4)]
    assert label_set(path, examples) == ["3", "a", "b"]


@pytest.mark.parametrize(("line", "fields", "message"), [
    ('{"text": "x", "label": "a"', {}, "line 2: is not valid JSON"),
    ('["x", "a"]', {}, "line 2: holds a JSON array; each line must be one object"),
    ('{"body": "x", "label": "a"}', {}, "line 2: has no field 'text' (it has ['body', 'label']); name the field "
     "with --text-field"),
    ('{"text": "x"}', {}, "line 2: has no field 'label'"),
    ('{"text": 7, "label": "a"}', {}, "line 2: field 'text' is a JSON number, not a string"),
    ('{"text": "  ", "label": "a"}', {}, "line 2: field 'text' is empty"),
    ('{"text": "x", "label": null}', {}, "line 2: label field 'label' is a JSON null"),
    ('{"text": "x", "label": 1.5}', {}, "line 2: label field 'label' is a JSON number"),
    ('{"doc": "x", "label": "a"}', {"text_field": "doc", "label_field": "y"}, "line 2: has no field 'y' (it has "
     "['doc', 'label']); name the field with --label-field"),
])
def test_a_bad_line_is_named(tmp_path, line, fields, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"text": "fine", "label": "a", "doc": "fine", "y": "a"}, line])
    with pytest.raises(DataFileError) as error:
        read_labelled_texts(path, **fields)
    assert str(error.value).startswith(f"{path}, ") and message in str(error.value)
    assert error.value.line == 2


def test_files_that_hold_nothing_usable_are_refused(tmp_path):
    with pytest.raises(DataFileError, match="no such file"):
        read_labelled_texts(tmp_path / "missing.jsonl")
    with pytest.raises(DataFileError, match="holds no examples"):
        read_labelled_texts(write_jsonl(tmp_path / "blank.jsonl", ["", "  "]))
    (tmp_path / "latin1.jsonl").write_bytes(b'{"text": "ok", "label": "a"}\n{"text": "caf\xe9", "label": "a"}\n')
    with pytest.raises(DataFileError, match=r"line 2: is not UTF-8"):
        read_labelled_texts(tmp_path / "latin1.jsonl")
    one = write_jsonl(tmp_path / "one.jsonl", [{"text": "x", "label": "only"}, {"text": "y", "label": "only"}])
    with pytest.raises(DataFileError, match="holds a single label, 'only': a classifier needs examples of at least "
                       "two"):
        label_set(one, read_labelled_texts(one))


def test_a_label_the_model_does_not_know_is_named_with_its_line(tmp_path):
    dev = write_jsonl(tmp_path / "dev.jsonl", [{"text": "x", "label": "a"}, {"text": "y", "label": "c"}])
    with pytest.raises(DataFileError, match=r"dev.jsonl, line 2: label 'c' is not one the model was trained on"):
        check_labels(dev, read_labelled_texts(dev), ["a", "b"])


def test_text_pairs_read_their_named_fields(tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"article": "long text", "abstract": "short"}])
    (pair,) = read_text_pairs(path, source_field="article", summary_field="abstract")
    assert (pair.source, pair.summary, pair.line) == ("long text", "short", 1)
    with pytest.raises(DataFileError, match="line 1: has no field 'source'.*--source-field"):
        read_text_pairs(path)


# ---- CSV series ------------------------------------------------------------------------------------------


def write_csv(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_series_take_the_numeric_columns_and_a_target_set(tmp_path):
    path = write_csv(tmp_path / "s.csv", ["time,load,temp,site", "2024-01-01,1.5,20,north", "2024-01-02,2.5,21,north"])
    series = read_series(path)
    assert series.columns == ["load", "temp"] and series.targets == ["load", "temp"]
    assert series.values.tolist() == [[1.5, 20.0], [2.5, 21.0]]
    chosen = read_series(path, columns=["temp", "load"], targets=["load"])
    assert chosen.columns == ["temp", "load"] and chosen.targets == ["load"] and chosen.target_indices == [1]
    assert chosen.values.tolist() == [[20.0, 1.5], [21.0, 2.5]]


@pytest.mark.parametrize(("lines", "columns", "targets", "message"), [
    (["t,a,b", "1,2,3", "2,x,4"], None, None, "line 3: column 'a' holds 'x', not a finite number"),
    (["t,a,b", "1,2,3", "2,,4"], None, None, "line 3: column 'a' is empty"),
    (["t,a,b", "1,2,3", "2,nan,4"], None, None, "line 3: column 'a' holds 'nan', not a finite number"),
    (["t,a,b", "1,2,3", "2,4"], None, None, "line 3: has 2 cells; the header has 3"),
    (["t,a,b", "1,2,3"], ["a", "c"], None, "line 1: has no column 'c'; the header has ['t', 'a', 'b']"),
    (["t,a,b", "1,2,3"], None, ["z"], "line 1: has no column 'z'"),
    (["t,a,b", "1,2,3"], ["a"], ["b"], "target 'b' is not among the columns the model reads (['a'])"),
    (["1,2,3", "2,3,4"], None, None, "line 1: the first row ['1', '2', '3'] is all numbers"),
    (["t,a,b"], None, None, "line 1: the header has no rows after it"),
])
def test_a_bad_series_file_is_named(tmp_path, lines, columns, targets, message):
    path = write_csv(tmp_path / "bad.csv", lines)
    with pytest.raises(DataFileError, match=None) as error:
        read_series(path, columns, targets)
    assert str(error.value).startswith(f"{path}") and message in str(error.value)


def test_too_few_rows_for_a_window_is_named(tmp_path):
    series = read_series(write_csv(tmp_path / "short.csv", ["a,b", *(f"{i},{i}" for i in range(10))]))
    series.check_length(6, 4)
    with pytest.raises(DataFileError, match="short.csv: has 10 rows, too few for a look-back of 8 plus a horizon of 4"):
        series.check_length(8, 4)


# ---- the command -----------------------------------------------------------------------------------------


def test_the_command_prints_the_bad_line_and_exits_without_a_traceback(tmp_path, capsys):
    train = topic_corpus(tmp_path / "train.jsonl", 6, seed=0)
    dev = write_jsonl(tmp_path / "dev.jsonl", [{"text": "goal", "label": "sport"}, '{"text": "snow", "label":'])
    code = rtserve(["train", "rmt", "--train", str(train), "--dev", str(dev), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.strip() == f"rtserve train: {dev}, line 2: is not valid JSON: Expecting value at column 26"
    single = write_jsonl(tmp_path / "single.jsonl", [{"text": "goal", "label": "sport"}] * 3)
    code = rtserve(["train", "rmt", "--train", str(single), "--dev", str(dev), "--out", str(tmp_path / "run")])
    assert code == 1 and "holds a single label, 'sport'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_eval_of_a_path_that_is_not_a_model_says_so(tmp_path, capsys):
    assert rtserve(["eval", str(tmp_path / "nothing"), "--data", "test.jsonl"]) == 1
    assert capsys.readouterr().err.strip() == (f"rtserve eval: {tmp_path / 'nothing'} is not a checkpoint folder or a "
                                               "model-repository entry")


def test_train_takes_either_files_or_a_folder(tmp_path, capsys):
    train = topic_corpus(tmp_path / "train.jsonl", 6, seed=0)
    with pytest.raises(SystemExit):
        rtserve(["train", "rmt", "--train", str(train), "--out", str(tmp_path / "run")])
    assert "--train needs --dev" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        rtserve(["train", "rmt", "--out", str(tmp_path / "run")])
    assert "give --train FILE --dev FILE" in capsys.readouterr().err


@pytest.mark.slow
def test_a_classifier_from_jsonl_is_exported_and_served_with_the_users_labels(tmp_path, capsys, redis_url,
                                                                               key_prefix):
    from tests.service_helpers import make_client

    train = topic_corpus(tmp_path / "train.jsonl", 24, seed=0, text_field="body", label_field="topic")
    dev = topic_corpus(tmp_path / "dev.jsonl", 9, seed=1, text_field="body", label_field="topic")
    fields = ["--text-field", "body", "--label-field", "topic"]
    run, repository = tmp_path / "run", tmp_path / "repository"
    assert rtserve(["train", "rmt", "--train", str(train), "--dev", str(dev), *fields, "--out", str(run),
                    "--segments", "2", "--segment-size", "32", "--memory-size", "4", "--epochs", "2",
                    "--batch-size", "6", "--cache-dir", str(tmp_path / "cache")]) == 0
    config = json.loads((run / "config.json").read_text())
    labels = sorted(TOPICS)
    assert config["extras"]["label_names"] == labels and config["config"]["num_labels"] == 3
    assert rtserve(["export", str(run), "--name", "topics", "--format", "onnx", "--out", str(repository)]) == 0
    manifest = json.loads((repository / "topics" / "1" / "manifest.json").read_text())
    assert manifest["settings"]["labels"] == labels
    capsys.readouterr()
    assert rtserve(["eval", str(repository / "topics" / "1"), "--data", str(dev), *fields]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scores["documents"] == 9 and 0 <= scores["accuracy"] <= 1
    assert rtserve(["eval", str(run), "--data", str(dev)]) == 0  # the checkpoint knows the fields it was trained on
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["n"] == 9

    text = json.loads(dev.read_text().splitlines()[0])["body"]
    with make_client(repository, redis_url, key_prefix) as client:
        answer = client.post("/classify", json={"text": text, "model": "topics"}).json()
    assert answer["label"] in labels
    assert sorted(answer["probabilities"]) == labels
    assert abs(sum(answer["probabilities"].values()) - 1) < 1e-4


def test_every_built_in_family_names_the_reader_of_its_task():
    from models.data import files
    from models.families import BUILT_IN

    readers = {"classify": files.read_labelled_texts, "summarize": files.read_text_pairs,
               "forecast": files.read_series}
    for record in BUILT_IN:
        assert record.part("reader") is readers[record.task], record.name


def test_the_tfidf_baseline_reads_the_same_files_and_scores_test_once(tmp_path, capsys):
    from models.training.tfidf_baseline import tfidf_main

    parts = {part: topic_corpus(tmp_path / f"{part}.jsonl", n, seed) for part, n, seed in
             (("train", 30, 0), ("dev", 9, 1), ("test", 12, 2))}
    assert tfidf_main(["--train", str(parts["train"]), "--dev", str(parts["dev"]), "--test", str(parts["test"]),
                       "--fit-on", "train"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["n"] == 12 and result["fit"] == "train" and set(result["dev_by_C"]) == {"0.1", "1.0", "10.0", "100.0"}
    assert result["dev"] == result["dev_by_C"][str(result["C"])]
    assert result["accuracy"] > 0.6  # three topics of distinct words: far above chance (1/3)


# ---- series and summaries, end to end --------------------------------------------------------------------


def series_csv(path: Path, start: int, rows: int, seed: int) -> Path:
    """Hourly-looking series of a shop: a daily cycle in `footfall`, a slower one in `temperature`, noise in
    `queue`, and a text column the reader leaves out."""
    import math

    rng = random.Random(seed)
    lines = ["hour,store,footfall,temperature,queue"]
    for t in range(start, start + rows):
        lines.append(f"h{t},central,{100 + 30 * math.sin(t / 3.8) + rng.gauss(0, 3):.2f},"
                     f"{15 + 6 * math.cos(t / 11) + rng.gauss(0, 0.5):.2f},{rng.random() * 5:.2f}")
    return write_csv(path, lines)


def test_a_forecaster_trains_on_csv_files_with_a_target_set_and_scores_a_test_file(tmp_path, capsys):
    train, dev, test = (series_csv(tmp_path / f"{part}.csv", start, rows, seed) for part, start, rows, seed in
                        (("train", 0, 240, 0), ("dev", 240, 80, 1), ("test", 320, 80, 2)))
    run = tmp_path / "run"
    assert rtserve(["train", "rsa", "--train", str(train), "--dev", str(dev), "--columns", "footfall,temperature,queue",
                    "--targets", "temperature,footfall", "--lookback", "16", "--horizon", "4", "--epochs", "1",
                    "--d-model", "16", "--d-ff", "32", "--layers", "1", "--patch-len", "4", "--stride", "4",
                    "--out", str(run)]) == 0
    extras = json.loads((run / "config.json").read_text())["extras"]
    assert extras["variables"] == ["footfall", "temperature", "queue"]
    assert extras["targets"] == ["temperature", "footfall"] and extras["protocol"] == "files"
    assert set(extras["metrics"]) == {"val"} and extras["metrics"]["val"]["windows"] == 80 - 16 - 4 + 1
    capsys.readouterr()
    assert rtserve(["eval", str(run), "--data", str(test)]) == 0
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scored["windows"] == 61 and scored["targets"] == ["temperature", "footfall"] and scored["mse"] > 0
    short = series_csv(tmp_path / "short.csv", 0, 12, 3)
    assert rtserve(["eval", str(run), "--data", str(short)]) == 1
    assert "short.csv: has 12 rows, too few for a look-back of 16 plus a horizon of 4" in capsys.readouterr().err


@pytest.mark.slow
def test_a_forecaster_from_csv_is_exported_and_served_answering_its_targets(tmp_path, capsys, redis_url, key_prefix):
    from tests.service_helpers import make_client

    train, dev = series_csv(tmp_path / "train.csv", 0, 240, 0), series_csv(tmp_path / "dev.csv", 240, 80, 1)
    run, repository = tmp_path / "run", tmp_path / "repository"
    assert rtserve(["train", "linear", "--train", str(train), "--dev", str(dev), "--targets", "footfall",
                    "--lookback", "16", "--horizon", "4", "--out", str(run)]) == 0
    assert rtserve(["export", str(run), "--name", "shop", "--format", "onnx", "--out", str(repository)]) == 0
    settings = json.loads((repository / "shop" / "1" / "manifest.json").read_text())["settings"]
    assert settings["variables"] == ["footfall", "temperature", "queue"] and settings["targets"] == ["footfall"]
    capsys.readouterr()
    assert rtserve(["eval", str(repository / "shop" / "1"), "--data", str(dev)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["windows"] == 61

    rows = [[float(cell) for cell in line.split(",")[2:]] for line in dev.read_text().splitlines()[1:17]]
    with make_client(repository, redis_url, key_prefix) as client:
        answer = client.post("/forecast", json={"rows": rows, "model": "shop"}).json()
        narrow = client.post("/forecast", json={"rows": [row[:2] for row in rows], "model": "shop"})
    assert answer["variables"] == ["footfall"] and answer["horizon"] == 4
    assert len(answer["forecast"]) == 4 and all(len(row) == 1 for row in answer["forecast"])
    assert 40 < answer["forecast"][0][0] < 160  # footfall's scale, not temperature's or the queue's
    assert narrow.status_code == 422 and "['footfall', 'temperature', 'queue']" in narrow.text


@pytest.mark.slow
def test_a_summarizer_from_jsonl_is_exported_and_served(tmp_path, capsys, monkeypatch, redis_url, key_prefix):
    from models.training import srformer
    from tests.service_helpers import make_client

    monkeypatch.setattr(srformer, "CACHE_ROOT", tmp_path / "cache")  # the encoder cache, in the test's folder

    rng = random.Random(0)
    words = "the council approved a new budget for schools and roads after a long debate on monday".split()

    def sentence() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(6, 10))).capitalize() + "."

    def pairs(path: Path, count: int) -> Path:
        rows = []
        for _ in range(count):
            sentences = [sentence() for _ in range(6)]
            rows.append({"article": " ".join(sentences), "abstract": " ".join(rng.sample(sentences, 2))})
        return write_jsonl(path, rows)

    train, dev = pairs(tmp_path / "train.jsonl", 12), pairs(tmp_path / "dev.jsonl", 3)
    fields = ["--source-field", "article", "--summary-field", "abstract"]
    run, repository = tmp_path / "run", tmp_path / "repository"
    assert rtserve(["train", "srformer", "--train", str(train), "--dev", str(dev), *fields, "--out", str(run),
                    "--d-model", "32", "--layers", "1", "--heads", "2", "--epochs", "1", "--max-source", "64",
                    "--max-target", "16", "--dev-limit", "2", "--batch-size", "4", "--device", "cpu"]) == 0
    # the salience head was fitted on the same files, so the model serves sentence copy, as the bundled ones do
    salience = load_checkpoint(run).extras["salience"]
    assert salience["lexical"] and salience["train_documents"] == 12 and salience["dev_documents"] == 3
    assert rtserve(["export", str(run), "--name", "notes", "--format", "onnx", "--out", str(repository)]) == 0
    capsys.readouterr()
    assert rtserve(["eval", str(repository / "notes" / "1"), "--data", str(dev), *fields]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scores["pairs"] == 3 and 0 <= scores["rouge1"] <= 1
    assert scores["systems"]["model"]["verbatim_sentences"] == 1.0
    # the checkpoint, scored before export, writes what the entry serves
    assert rtserve(["eval", str(run), "--data", str(dev), *fields]) == 0
    eager = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert eager["decoding"] == "sentence" and eager["rouge1"] == pytest.approx(scores["rouge1"], abs=1e-4)
    # without a head (--salience none) the model serves free generation, and asking eval to copy says why not
    bare = tmp_path / "bare"
    assert rtserve(["train", "srformer", "--train", str(train), "--dev", str(dev), *fields, "--out", str(bare),
                    "--d-model", "32", "--layers", "1", "--heads", "2", "--epochs", "1", "--max-source", "64",
                    "--max-target", "16", "--dev-limit", "2", "--batch-size", "4", "--device", "cpu",
                    "--salience", "none"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        rtserve(["eval", str(bare), "--data", str(dev), *fields, "--decoding", "sentence"])
    assert refused.value.code == 2 and "has no salience head" in capsys.readouterr().err
    article = json.loads(dev.read_text().splitlines()[0])["article"]
    with make_client(repository, redis_url, key_prefix) as client:
        answer = client.post("/summarize", json={"text": article, "model": "notes"})
    assert answer.status_code == 200 and answer.json()["decoding"] == "sentence"
    summary = answer.json()["summary"]
    assert summary and all(f"{s}." in article for s in summary.rstrip(".").split(". "))
