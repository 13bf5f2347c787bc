"""Writes the BBC News Summary folder as a user's JSON Lines corpus: train.jsonl, dev.jsonl, test.jsonl.

    python examples/bbc-topics/make_jsonl.py ../shared/data/bbc-news-summary --out /work/userdata/bbc-topics

One article a line, ``{"text": title + "\\n" + body, "label": category, "summary": ..., "key": ...}``
(the key is ``<category>/<NNN>.txt``); the five categories (business, entertainment, politics, sport,
tech) are the labels. The split is this script's own, not the folder's ``splits.json``: stratified by
category, seeded (``--seed``), 60 / 20 / 20 per cent, so the test part is large enough (about 400
articles) that one point of accuracy is four articles. The corpus repeats some articles word for word;
only the first of each text (in key order) is kept, so no test article is also a training one.
Standard library only: it stands for the script a user would write to get their data into
rtserve's format.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ARTICLES, SUMMARIES = "News Articles", "Summaries"


def read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace").strip()  # one sport article has a Latin-1 byte


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="the BBC News Summary folder (holds 'News Articles/')")
    parser.add_argument("--out", type=Path, required=True, help="folder for train.jsonl, dev.jsonl, test.jsonl")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split")
    parser.add_argument("--dev", type=float, default=0.2, help="share of each category in dev")
    parser.add_argument("--test", type=float, default=0.2, help="share of each category in test")
    args = parser.parse_args()
    parts: dict[str, list[dict[str, str]]] = {"train": [], "dev": [], "test": []}
    seen: set[str] = set()
    for folder in sorted((args.data / ARTICLES).iterdir()):
        files = []
        for path in sorted(folder.glob("*.txt")):
            text = read(path)
            if text not in seen:
                seen.add(text)
                files.append(path)
        random.Random(f"{args.seed}-{folder.name}").shuffle(files)
        n_dev, n_test = round(args.dev * len(files)), round(args.test * len(files))
        for index, path in enumerate(files):
            part = "dev" if index < n_dev else "test" if index < n_dev + n_test else "train"
            key = f"{folder.name}/{path.name}"
            parts[part].append({"text": read(path), "label": folder.name,
                                "summary": read(args.data / SUMMARIES / key), "key": key})
    kept = sum(len(rows) for rows in parts.values())
    print(f"{kept} distinct articles ({len(list((args.data / ARTICLES).glob('*/*.txt'))) - kept} repeats left out)")
    args.out.mkdir(parents=True, exist_ok=True)
    for part, rows in parts.items():
        random.Random(f"{args.seed}-{part}").shuffle(rows)  # categories interleaved, as a user's file would be
        with open(args.out / f"{part}.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        print(f"{args.out / f'{part}.jsonl'}: {len(rows)} articles")


if __name__ == "__main__":
    main()
