"""Blind judgement of summaries: a sheet a reader fills in, and ``rtserve judgement`` to un-blind it.

``rtserve eval <summarizer entry> --judgement-sheet FILE.json`` writes ``FILE.json``: documents with their
candidate summaries (the model's, a lead, the reference and the extractor) in a random order, labelled only A,
B, C..., and empty 1-5 scores for fluency, coherence and faithfulness. Which candidate is which goes to
``FILE.key.json`` alone, so the sheet can be handed to a reader (or a helper) who knows nothing of the systems.
The key also holds a hash of every candidate, so a key is never applied to a sheet it was not written with.

``rtserve judgement score FILE.json`` reads the filled sheet and its key, refuses a sheet with a missing or
out-of-range score (naming the item, the candidate and the criterion) and prints the mean score per system
and criterion, per corpus where the sheet mixes corpora. ``rtserve judgement merge`` joins sheets (one per
corpus, say) into one, reshuffled.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from models.cli_help import HelpFormatter

SHEET_FORMAT = "rtserve-judgement-sheet/1"
KEY_FORMAT = "rtserve-judgement-key/1"
CRITERIA = {
    "fluency": "Does it read as well-formed English (or the document's language): grammatical sentences, no "
               "broken or repeated phrases? 1 = word salad, 5 = reads like edited text.",
    "coherence": "Do the sentences fit together into a sensible whole, in a sensible order, without "
                 "contradicting one another? 1 = unrelated fragments, 5 = a well-organised summary.",
    "faithfulness": "Is everything it says supported by the document (no wrong numbers, names, quotes or "
                    "claims)? 1 = mostly unsupported or wrong, 5 = every statement is supported.",
}
LOWEST, HIGHEST = 1, 5
INSTRUCTIONS = (
    "Read each document, then each of its candidate summaries (labelled A, B, ...; their order is random and says "
    "nothing about where they came from). Score every candidate on each criterion with a whole number from "
    f"{LOWEST} to {HIGHEST}, replacing the null in 'scores'. Judge each candidate on its own against the "
    "document; a short candidate can score 5. 'notes' is free text. Do not try to find out which system "
    "wrote which candidate."
)


class SheetError(ValueError):
    """A sheet or key that cannot be scored; the message says what to fix."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def key_path(sheet: Path) -> Path:
    """``FILE.key.json`` beside ``FILE.json``."""
    return sheet.with_name(sheet.name.removesuffix(".json") + ".key.json")


def _empty_scores(labels: Sequence[str]) -> dict[str, dict[str, None]]:
    return {label: dict.fromkeys(CRITERIA) for label in labels}


def _sheet(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"format": SHEET_FORMAT, "instructions": INSTRUCTIONS, "criteria": CRITERIA,
            "scale": [LOWEST, HIGHEST], "items": items}


def shown(summary: str) -> str:
    """A candidate as the reader sees it: its sentences (:func:`models.sentences.sentences`), each opening with
    a capital, white space runs made one space, joined by one space, the same for every system, so that layout
    and case give none away (BBC's references glue sentences together: "stabilise.China's"; a lower-cased
    corpus's lead and reference open their sentences in lower case and keep its double spaces where a served
    summary capitalises them and writes one)."""
    from models.sentences import capitalised, sentences

    return " ".join(capitalised(" ".join(sentence.split())) for sentence in sentences(summary))


def _write(path: Path, items: list[dict[str, Any]], keys: list[dict[str, Any]]) -> tuple[Path, Path]:
    """The sheet of ``items`` to ``path`` and its key (``keys``, item by item) beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_sheet(items), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    key = key_path(path)
    key.write_text(json.dumps({"format": KEY_FORMAT, "sheet": path.name, "items": keys}, indent=2,
                              ensure_ascii=False) + "\n", encoding="utf-8")
    return path, key


def write_sheet(path: Path, pairs: Sequence[Any], candidates: Mapping[str, Sequence[str]], count: int, seed: int,
                about: Mapping[str, Any]) -> tuple[Path, Path]:
    """Write ``count`` documents of ``pairs`` (chosen and ordered by ``seed``), each with one candidate per
    system of ``candidates`` (system name -> a summary per pair), shuffled, labelled A, B, C... and laid out
    alike (:func:`shown`); the key to ``key_path(path)``. ``about`` (corpus, data, split, entry...) goes into
    the key only."""
    rng = random.Random(seed)
    chosen = rng.sample(range(len(pairs)), min(count, len(pairs)))
    systems = list(candidates)
    labels = [chr(ord("A") + i) for i in range(len(systems))]
    items, keys = [], []
    for number, index in enumerate(chosen, start=1):
        order = rng.sample(systems, len(systems))
        texts = {label: shown(candidates[system][index]) for label, system in zip(labels, order, strict=True)}
        items.append({"item": number, "document": pairs[index].document, "candidates": texts,
                      "scores": _empty_scores(labels), "notes": ""})
        keys.append({"item": number, **about, "document_key": pairs[index].key,
                     "systems": dict(zip(labels, order, strict=True)),
                     "candidate_sha256": {label: _digest(text) for label, text in texts.items()}})
    return _write(path, items, keys)


def _read(path: Path, kind: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SheetError(f"no {kind} at {path}") from None
    except json.JSONDecodeError as error:
        raise SheetError(f"{path} is not valid JSON: {error}") from None
    expected = SHEET_FORMAT if kind == "sheet" else KEY_FORMAT
    if not isinstance(data, dict) or data.get("format") != expected:
        raise SheetError(f"{path} is not a judgement {kind} (its 'format' should be {expected!r})")
    return data


def _check(sheet: Mapping[str, Any], key: Mapping[str, Any]) -> list[str]:
    """Every problem that stops the sheet being scored, one line each."""
    problems: list[str] = []
    keyed = {entry["item"]: entry for entry in key["items"]}
    items = sheet.get("items")
    if not isinstance(items, list) or not items:
        return ["the sheet has no items"]
    seen = set()
    for item in items:
        number = item.get("item")
        where = f"item {number}"
        if number not in keyed:
            problems.append(f"{where}: not in the key (a key written with another sheet?)")
            continue
        seen.add(number)
        entry = keyed[number]
        candidates = item.get("candidates", {})
        if set(candidates) != set(entry["systems"]) or any(
                _digest(text) != entry["candidate_sha256"][label] for label, text in candidates.items()):
            problems.append(f"{where}: its candidates differ from the ones the key was written with")
            continue
        scores = item.get("scores")
        if not isinstance(scores, dict):
            problems.append(f"{where}: no 'scores'")
            continue
        for label in sorted(entry["systems"]):
            given = scores.get(label)
            if not isinstance(given, dict):
                problems.append(f"{where}, candidate {label}: no scores")
                continue
            for criterion in CRITERIA:
                value = given.get(criterion)
                if value is None:
                    problems.append(f"{where}, candidate {label}: {criterion} is missing")
                elif isinstance(value, bool) or not isinstance(value, int) or not LOWEST <= value <= HIGHEST:
                    problems.append(f"{where}, candidate {label}: {criterion} is {value!r}, not a whole number "
                                    f"from {LOWEST} to {HIGHEST}")
    missing = sorted(set(keyed) - seen)
    if missing:
        problems.append(f"items {missing} of the key are not on the sheet")
    return problems


def score(sheet_path: Path, key_file: Path | None = None) -> dict[str, Any]:
    """Means per corpus, system and criterion of a filled sheet; SheetError if any score is missing or out of
    range, or the key does not belong to the sheet."""
    sheet = _read(sheet_path, "sheet")
    key = _read(key_file or key_path(sheet_path), "key")
    problems = _check(sheet, key)
    if problems:
        shown = "\n  ".join(problems[:30]) + (f"\n  ... and {len(problems) - 30} more" if len(problems) > 30 else "")
        raise SheetError(f"{sheet_path} cannot be scored:\n  {shown}")
    keyed = {entry["item"]: entry for entry in key["items"]}
    values: dict[str, dict[str, dict[str, list[int]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for item in sheet["items"]:
        entry = keyed[item["item"]]
        for label, system in entry["systems"].items():
            for criterion in CRITERIA:
                values[entry.get("corpus", "?")][system][criterion].append(item["scores"][label][criterion])
    means = {corpus: {system: {criterion: round(sum(v) / len(v), 2) for criterion, v in by_criterion.items()}
                      | {"documents": len(next(iter(by_criterion.values())))}
                      for system, by_criterion in by_system.items()}
             for corpus, by_system in values.items()}
    return {"sheet": str(sheet_path), "items": len(sheet["items"]), "means": means}


def table(scores: Mapping[str, Any]) -> str:
    """The means as a Markdown table: one row per corpus and system."""
    rows = [f"| corpus | system | {' | '.join(CRITERIA)} | documents |", "|---" * (len(CRITERIA) + 3) + "|"]
    for corpus, by_system in scores["means"].items():
        for system, means in by_system.items():
            cells = " | ".join(f"{means[c]:.2f}" for c in CRITERIA)
            rows.append(f"| {corpus} | {system} | {cells} | {means['documents']} |")
    return "\n".join(rows)


def merge(out: Path, sheets: Sequence[Path], seed: int) -> tuple[Path, Path]:
    """One sheet (and key) of the items of ``sheets`` (each with its key beside it), in a random order."""
    pooled = []
    for path in sheets:
        sheet, key = _read(path, "sheet"), _read(key_path(path), "key")
        keyed = {entry["item"]: entry for entry in key["items"]}
        pooled += [(item, keyed[item["item"]]) for item in sheet["items"]]
    random.Random(seed).shuffle(pooled)
    items, keys = [], []
    for number, (item, entry) in enumerate(pooled, start=1):
        items.append({**item, "item": number})
        keys.append({**entry, "item": number})
    return _write(out, items, keys)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="rtserve judgement", formatter_class=HelpFormatter,
                                     description="Blind judgement sheets of summaries "
                                     "(written by `rtserve eval ... --judgement-sheet FILE.json`).")
    verbs = parser.add_subparsers(dest="verb", required=True)
    scoring = verbs.add_parser("score", formatter_class=HelpFormatter,
                               help="un-blind a filled sheet: mean 1-5 score per system and criterion")
    scoring.add_argument("sheet", help="the filled sheet (JSON)")
    scoring.add_argument("--key", help="the sheet's key (default: <sheet>.key.json beside it)")
    scoring.add_argument("--json", action="store_true", help="print JSON instead of a table")
    merging = verbs.add_parser("merge", formatter_class=HelpFormatter,
                               help="join sheets (each with its key beside it) into one, reshuffled")
    merging.add_argument("out", help="the joined sheet; its key is written beside it")
    merging.add_argument("sheets", nargs="+", help="the sheets to join")
    merging.add_argument("--seed", type=int, default=0, help="the order of the joined sheet's items")
    args = parser.parse_args(list(argv))
    try:
        if args.verb == "score":
            scores = score(Path(args.sheet), Path(args.key) if args.key else None)
            print(json.dumps(scores) if args.json else table(scores))
        else:
            sheet, key = merge(Path(args.out), [Path(p) for p in args.sheets], args.seed)
            print(f"rtserve judgement: wrote {sheet} and its key {key}", file=sys.stderr)
    except SheetError as error:
        print(f"rtserve judgement: {error}", file=sys.stderr)
        return 2
    return 0
