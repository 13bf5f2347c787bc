"""Cross-validated scores of an RMT recipe beside TF-IDF + logistic regression on the same folds.

    python docs/rmt_cv_summary.py                                  # the shipped classifier's recipe
    python docs/rmt_cv_summary.py docs/rmt-cv/L5-s8-seed0.json docs/rmt-cv/L5-s8-seed1.json ...

Reads the result files `python -m models.training.rmt cv` and `tfidf-cv` wrote (docs/rmt-cv/): each holds,
per fold of the 475 Hyperpartisan train+dev articles, the held-out fold's accuracy and macro-F1. Prints, for
each way the RMT runs were read (`as_trained`: the segments they were trained on; `all_cached`: the first 16
segments, the whole article for 90-96% of them, the closest to the served classifier, which reads every
segment), the mean ± sample standard deviation over every fold of every run given (several runs: several
seeds), TF-IDF's over the same folds, and the RMT minus TF-IDF macro-F1, paired fold by fold. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent / "rmt-cv"
SHIPPED_RECIPE = HERE / "L4-s8-seed0.json"  # recipe B (--memory-layer 4), 8 segments: weights/rmt-hyperpartisan
METRICS = ("accuracy", "macro_f1")


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, default=[SHIPPED_RECIPE], help="cv result files (seeds)")
    parser.add_argument("--baseline", type=Path, default=HERE / "tfidf.json", help="tfidf-cv result file")
    args = parser.parse_args()
    runs = [json.loads(path.read_text()) for path in args.runs]
    baseline = json.loads(args.baseline.read_text())
    if any(run["fold_ids"] != baseline["fold_ids"] for run in runs):
        parser.error("the runs and the baseline were not scored on the same folds")
    tfidf = {fold["fold"]: fold["heldout"]["whole_text"] for fold in baseline["folds"]}
    print(f"{len(runs)} run(s) x {len(tfidf)} folds; {runs[0]['protocol']}")
    print("| reading | held-out accuracy | held-out macro-F1 | TF-IDF + LR accuracy | TF-IDF + LR macro-F1 "
          "| macro-F1 minus TF-IDF, paired |")
    print("|---|---|---|---|---|---|")
    for reading, meaning in runs[0]["readings"].items():
        rmt = {m: [f["heldout"][reading][m] for run in runs for f in run["folds"]] for m in METRICS}
        base = {m: [scores[m] for scores in tfidf.values()] for m in METRICS}  # each fold once
        paired = [f["heldout"][reading]["macro_f1"] - tfidf[f["fold"]]["macro_f1"]
                  for run in runs for f in run["folds"]]
        print(f"| {reading} ({meaning}) | {spread(rmt['accuracy'])} | {spread(rmt['macro_f1'])} "
              f"| {spread(base['accuracy'])} | {spread(base['macro_f1'])} | {spread(paired)} |")


if __name__ == "__main__":
    main()
