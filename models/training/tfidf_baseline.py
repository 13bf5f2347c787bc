"""The TF-IDF baseline of the RMT classifier: word 1-2-grams (sublinear tf) + class-balanced logistic regression.

    python -m models.training.rmt tfidf --data ../shared/data/hyperpartisan
    python -m models.training.rmt tfidf --train train.jsonl --dev dev.jsonl --test test.jsonl --fit-on train
    python -m models.training.rmt tfidf-cv --data ../shared/data/hyperpartisan --folds 5 --out runs/cv/tfidf.json

``tfidf`` chooses C on dev and scores test once; it reads the same files as ``rtserve train rmt``.
``tfidf-cv`` scores it on the folds of the RMT's cross-validation (``models/training/rmt_cv.py``), C
chosen by an inner CV of each training part. The peer a user would pick instead of a trained model
(docs/classification.md); it is not served.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from models.data.files import label_set
from models.data.hyperpartisan import Article, load_split, metrics
from models.families import family
from models.training.common import command_parser, hardware, recipe_record
from models.training.rmt import labelled_articles
from models.training.rmt_cv import cv_folds, cv_report, fold_parts, print_cv, scored

if TYPE_CHECKING:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

TFIDF_C_GRID = (0.1, 1.0, 10.0, 100.0)  # LogisticRegression C searched on dev (tfidf) or by inner CV (tfidf-cv)


def tfidf_vectorizer() -> TfidfVectorizer:
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)


def tfidf_classifier(c: float) -> LogisticRegression:
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, class_weight="balanced", max_iter=2000)


def tfidf_pipeline(c: float) -> Pipeline:
    """TF-IDF word 1-2-grams (sublinear tf) + class-balanced logistic regression."""
    from sklearn.pipeline import make_pipeline

    return make_pipeline(tfidf_vectorizer(), tfidf_classifier(c))


def tfidf_choose_c(articles: list[Article], k: int, seed: int) -> tuple[float, dict[float, float]]:
    """C with the best mean macro-F1 over an inner stratified k-fold CV of ``articles`` only
    (the vectorizer is fitted once per inner split: it does not depend on C)."""
    folds = cv_folds(articles, k, seed)
    scores: dict[float, list[float]] = {c: [] for c in TFIDF_C_GRID}
    for i in range(k):
        fit, held = fold_parts(articles, folds, i)
        vectorizer = tfidf_vectorizer().fit([a.text for a in fit])
        x_fit, x_held = vectorizer.transform([a.text for a in fit]), vectorizer.transform([a.text for a in held])
        for c in TFIDF_C_GRID:
            predicted = tfidf_classifier(c).fit(x_fit, [a.label for a in fit]).predict(x_held).tolist()
            scores[c].append(metrics([a.label for a in held], predicted)["macro_f1"])
    means = {c: sum(v) / len(v) for c, v in scores.items()}
    return max(means, key=lambda c: means[c]), means  # ties: the smallest C (grid order)


def tfidf_cv_main(argv: Sequence[str]) -> int:
    """TF-IDF + LR on the folds of ``cv`` (same ``cv_folds``), C chosen inside each training part."""
    parser = command_parser("python -m models.training.rmt tfidf-cv")
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--fold-seed", type=int, default=0, help="seed of the fold assignment, as in cv")
    parser.add_argument("--inner-folds", type=int, default=3, help="inner CV of each training part that picks C")
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    args = parser.parse_args(argv)
    pool = load_split(args.data, "train") + load_split(args.data, "dev")
    test = load_split(args.data, "test")
    folds = cv_folds(pool, args.folds, args.fold_seed)
    started = time.time()
    result = {
        "model": "tfidf-1-2gram+logreg(balanced)", "recipe": recipe_record(args),
        "protocol": f"stratified {args.folds}-fold CV over train+dev ({len(pool)} articles), fold seed "
        f"{args.fold_seed}; C from {list(TFIDF_C_GRID)} by an inner {args.inner_folds}-fold CV of each training part",
        "readings": {"whole_text": "the whole article"}, "hardware": hardware(1), "fold_ids": folds, "folds": [],
    }
    for i in range(args.folds):
        fold_started = time.time()
        train, held = fold_parts(pool, folds, i)
        c, inner = tfidf_choose_c(train, args.inner_folds, args.fold_seed)
        pipe = tfidf_pipeline(c).fit([a.text for a in train], [a.label for a in train])
        fold = {"fold": i, "n_train": len(train), "n_heldout": len(held), "C": c, "inner_macro_f1_by_C": inner,
                "heldout": {}, "test": {}, "p_hyperpartisan": {}}
        for part, articles in (("heldout", held), ("test", test)):
            p = pipe.predict_proba([a.text for a in articles])[:, 1].tolist()
            fold[part]["whole_text"] = scored(articles, p)
            fold["p_hyperpartisan"][part] = {
                "whole_text": {a.id: round(x, 6) for a, x in zip(articles, p, strict=True)}}
        fold["train_seconds"] = round(time.time() - fold_started, 1)
        result["folds"].append(fold)
    # the recipe's final form: C by inner CV of all of train+dev, fitted on it, scored on test
    c, inner = tfidf_choose_c(pool, args.inner_folds, args.fold_seed)
    pipe = tfidf_pipeline(c).fit([a.text for a in pool], [a.label for a in pool])
    result["fit_train_dev"] = {"C": c, "inner_macro_f1_by_C": inner,
                               "test": scored(test, pipe.predict_proba([a.text for a in test])[:, 1].tolist())}
    result["seconds"] = round(time.time() - started, 1)
    cv_report(result, ["whole_text"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print_cv(result)
    print(json.dumps({**result["summary"], "fit_train_dev": result["fit_train_dev"], "seconds": result["seconds"]}))
    return 0


def tfidf_main(argv: Sequence[str]) -> int:
    """TF-IDF (word 1-2-grams) + logistic regression: C chosen on dev, then scored once on test.

    ``--c`` fixes the inverse regularisation; by default it is the C of the best dev macro-F1 over a
    small grid (fitted on train). ``--fit-on train+dev`` then refits that C on train and dev together
    (the Hyperpartisan protocol); ``--fit-on train`` keeps the model fitted on train, as ``rtserve train``
    keeps its dev-selected epoch.
    """
    parser = command_parser("python -m models.training.rmt tfidf")
    parser.add_argument("--data", type=Path, help="a Hyperpartisan folder (train, dev and test from splits.json)")
    parser.add_argument("--train", type=Path, help="JSON Lines of labelled documents (instead of --data)")
    parser.add_argument("--dev", type=Path, help="JSON Lines: C is chosen here")
    parser.add_argument("--test", type=Path, help="JSON Lines: scored once, with the chosen C")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--label-field", default="label")
    parser.add_argument("--fit-on", choices=["train", "train+dev"], default="train+dev")
    parser.add_argument("--c", type=float, default=None, help="LogisticRegression C (default: chosen on dev)")
    args = parser.parse_args(argv)
    if args.data is not None:
        train, dev, test = (load_split(args.data, s) for s in ("train", "dev", "test"))
    elif None in (args.train, args.dev, args.test):
        parser.error("give --train, --dev and --test (JSON Lines), or --data (a Hyperpartisan folder)")
    else:
        read = family("rmt").part("reader")
        examples = {part: read(path, text_field=args.text_field, label_field=args.label_field)
                    for part, path in (("train", args.train), ("dev", args.dev), ("test", args.test))}
        labels = label_set(args.train, examples["train"])
        train, dev, test = (labelled_articles(getattr(args, part), part, examples[part], labels)
                            for part in ("train", "dev", "test"))

    def texts(articles: list[Article]) -> list[str]:
        return [a.text for a in articles]

    def labels_of(articles: list[Article]) -> list[int]:
        return [a.label for a in articles]

    dev_by_c = {}
    for c in TFIDF_C_GRID if args.c is None else (args.c,):
        pipe = tfidf_pipeline(c).fit(texts(train), labels_of(train))
        dev_by_c[c] = metrics(labels_of(dev), pipe.predict(texts(dev)).tolist())
    args.c = max(dev_by_c, key=lambda c: dev_by_c[c]["macro_f1"])  # ties: the first (smallest) C
    fit = train + dev if args.fit_on == "train+dev" else train
    pipe = tfidf_pipeline(args.c).fit(texts(fit), labels_of(fit))
    scores = metrics(labels_of(test), pipe.predict(texts(test)).tolist())
    print(json.dumps({"model": "tfidf-1-2gram+logreg(balanced)", "C": args.c,
                      "dev_by_C": {str(c): v for c, v in dev_by_c.items()}, "dev": dev_by_c[args.c],
                      "fit": args.fit_on, "split": "test", "n": len(test), **scores}))
    return 0
