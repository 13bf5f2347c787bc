"""The user's own data files: JSON Lines of labelled texts or of source/summary pairs, and CSV series.

These are the readers a family's record names (``reader`` in :mod:`models.families`) for
``rtserve train <family> --train FILE --dev FILE`` and ``rtserve eval ... --data FILE``:

- classify: JSON Lines, one object a line, with a text field and a label field (``"text"`` and
  ``"label"`` unless named); the labels are whatever strings (or integers) the training file holds.
- summarize: JSON Lines with a source field and a summary field (``"source"``, ``"summary"``).
- forecast: CSV with a header row; any numeric columns, in time order, one row a time step.

A file that cannot be read as asked raises :class:`DataFileError`, whose message names the file and
the line (1-based, as an editor shows it) and says what to change; the command prints it and exits
without a traceback. Blank lines in JSON Lines files are skipped (an editor's trailing newline).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class DataFileError(ValueError):
    """A data file that cannot be used as asked; the message names the file, the line where there is one, and
    what is wrong there."""

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        self.path, self.line = str(path), line
        super().__init__(f"{path}, line {line}: {message}" if line else f"{path}: {message}")


@dataclass(frozen=True)
class LabelledText:
    text: str
    label: str  # as the file names it; integers are kept as their decimal text
    line: int  # 1-based line in its file


@dataclass(frozen=True)
class TextPair:
    source: str  # the document to summarize
    summary: str  # its reference summary
    line: int


def _open_text(path: str | Path) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise DataFileError(path, None, "no such file" if not path.exists() else "is a folder, not a file")
    return path.read_bytes()


def json_objects(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line of a JSON Lines file."""
    found = False
    for number, raw in enumerate(_open_text(path).split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataFileError(path, number, f"is not UTF-8 (byte {error.start + 1} of the line)") from None
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFileError(path, number, f"is not valid JSON: {error.msg} at column {error.colno}") from None
        if not isinstance(value, dict):
            raise DataFileError(path, number, f"holds a JSON {_json_type(value)}; each line must be one object, "
                                "e.g. {\"text\": \"...\", \"label\": \"...\"}")
        found = True
        yield number, value
    if not found:
        raise DataFileError(path, None, "holds no examples (no non-blank line)")


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _field(path: str | Path, number: int, row: dict[str, Any], name: str, flag: str) -> Any:
    if name not in row:
        raise DataFileError(path, number, f"has no field {name!r} (it has {sorted(row)}); name the field with {flag}")
    return row[name]


def _text(path: str | Path, number: int, row: dict[str, Any], name: str, flag: str) -> str:
    value = _field(path, number, row, name, flag)
    if not isinstance(value, str):
        raise DataFileError(path, number, f"field {name!r} is a JSON {_json_type(value)}, not a string")
    if not value.strip():
        raise DataFileError(path, number, f"field {name!r} is empty")
    return value


def read_labelled_texts(path: str | Path, text_field: str = "text", label_field: str = "label") -> list[LabelledText]:
    """Every ``{text_field: str, label_field: str | int}`` object of a JSON Lines file, in file order."""
    examples = []
    for number, row in json_objects(path):
        text = _text(path, number, row, text_field, "--text-field")
        label = _field(path, number, row, label_field, "--label-field")
        if isinstance(label, bool) or not isinstance(label, str | int):
            raise DataFileError(path, number, f"label field {label_field!r} is a JSON {_json_type(label)}; "
                                "a label is a string or an integer")
        label = str(label)
        if not label.strip():
            raise DataFileError(path, number, f"label field {label_field!r} is empty")
        examples.append(LabelledText(text, label, number))
    return examples


def label_set(path: str | Path, examples: Sequence[LabelledText]) -> list[str]:
    """The labels a classifier trained on ``examples`` tells apart: every one they hold, sorted."""
    labels = sorted({example.label for example in examples})
    if len(labels) < 2:
        raise DataFileError(path, None, f"holds a single label, {labels[0]!r}: a classifier needs examples of at "
                            "least two")
    return labels


def check_labels(path: str | Path, examples: Sequence[LabelledText], labels: Sequence[str]) -> None:
    """Every example's label is one the model knows (a dev or test file against the training labels)."""
    known = set(labels)
    for example in examples:
        if example.label not in known:
            raise DataFileError(path, example.line, f"label {example.label!r} is not one the model was trained on "
                                f"({list(labels)})")


def read_text_pairs(path: str | Path, source_field: str = "source", summary_field: str = "summary") -> list[TextPair]:
    """Every ``{source_field: str, summary_field: str}`` object of a JSON Lines file, in file order."""
    return [TextPair(_text(path, number, row, source_field, "--source-field"),
                     _text(path, number, row, summary_field, "--summary-field"), number)
            for number, row in json_objects(path)]


# ---- series -------------------------------------------------------------------------------------------


@dataclass
class SeriesTable:
    values: Any  # (T, C) float64 numpy array, raw units, in the order of ``columns``
    columns: list[str]  # the C columns the model reads, in row order
    targets: list[str]  # the columns it forecasts (some of ``columns``), in the order asked
    path: str

    @property
    def target_indices(self) -> list[int]:
        return [self.columns.index(name) for name in self.targets]

    def check_length(self, lookback: int, horizon: int) -> None:
        """At least one window: ``lookback`` rows of history and ``horizon`` rows after them."""
        if len(self.values) < lookback + horizon:
            raise DataFileError(self.path, None, f"has {len(self.values)} rows, too few for a look-back of {lookback} "
                                f"plus a horizon of {horizon}: a window needs {lookback + horizon}")


def _number(cell: str) -> float | None:
    try:
        value = float(cell)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def read_series(path: str | Path, columns: Sequence[str] | None = None,
                targets: Sequence[str] | None = None) -> SeriesTable:
    """The chosen columns of a CSV file with a header row, as float64 rows in file order.

    ``columns`` default to every column whose first row is a number (a date or an id column is left out);
    ``targets`` default to all of them. Every cell of a chosen column must be a finite number.
    """
    import numpy as np

    text = _open_text(path)
    try:
        lines = text.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as error:
        raise DataFileError(path, text[: error.start].count(b"\n") + 1, "is not UTF-8") from None
    rows = [(number, row) for number, row in enumerate(csv.reader(lines), start=1)
            if any(cell.strip() for cell in row)]
    if not rows:
        raise DataFileError(path, None, "is empty: a CSV file with a header row is expected")
    header_line, header = rows[0]
    header = [name.strip() for name in header]
    rows = rows[1:]
    if not rows:
        raise DataFileError(path, header_line, "the header has no rows after it")
    if all(_number(name) is not None for name in header):
        raise DataFileError(path, header_line, f"the first row {header} is all numbers; the file needs a header row "
                            "naming the columns")
    for name in [*(columns or []), *(targets or [])]:
        if name not in header:
            raise DataFileError(path, header_line, f"has no column {name!r}; the header has {header}")
    if columns:
        chosen = list(columns)
    else:
        first_line, first = rows[0]
        chosen = [name for name, cell in zip(header, first, strict=False) if _number(cell) is not None]
        if not chosen:
            raise DataFileError(path, first_line, f"no column holds a number; the header has {header}")
    picked = list(dict.fromkeys(targets or chosen))
    missing = [name for name in picked if name not in chosen]
    if missing:
        raise DataFileError(path, None, f"target {missing[0]!r} is not among the columns the model reads ({chosen}); "
                            "add it to --columns")
    where = [header.index(name) for name in chosen]
    values = np.empty((len(rows), len(chosen)), dtype=np.float64)
    for index, (number, row) in enumerate(rows):
        if len(row) != len(header):
            raise DataFileError(path, number, f"has {len(row)} cells; the header has {len(header)}")
        for column, position in enumerate(where):
            value = _number(row[position])
            if value is None:
                cell = row[position].strip()
                what = "is empty" if not cell else f"holds {cell!r}, not a finite number"
                raise DataFileError(path, number, f"column {chosen[column]!r} {what}; fill or drop that row")
            values[index, column] = value
    return SeriesTable(values, chosen, picked, str(path))
