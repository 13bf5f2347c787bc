"""What a retried piece is recognised by: a digest of its content, the same on every replica."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson

ROWS_TAG = b"rows float64<"  # what a rows digest hashes first, then the shape, then the values' bytes


def piece_digest(piece: Any) -> str:
    """The sha256 of the piece: for rows (a float64 array, or lists of numbers), of their shape and their float64
    little-endian bytes, with no number written as text; for a text, of the text as orjson writes it."""
    if isinstance(piece, np.ndarray | list):
        rows = np.ascontiguousarray(piece, dtype="<f8")
        digest = hashlib.sha256(ROWS_TAG)
        digest.update(b"%d %d:" % (rows.shape[0], rows.shape[1] if rows.ndim > 1 else 0))
        digest.update(rows.data)
        return digest.hexdigest()
    return hashlib.sha256(orjson.dumps(piece)).hexdigest()


def earlier_digests(piece: Any) -> Iterator[str]:
    """The digests earlier releases recorded for the piece: the sha256 of it as orjson writes it, then as the
    standard library's json writes it, so that a retry spanning a rolling upgrade is still recognised."""
    if isinstance(piece, np.ndarray | list):
        yield hashlib.sha256(orjson.dumps(piece, option=orjson.OPT_SERIALIZE_NUMPY)).hexdigest()
    yield json_piece_digest(piece)


def json_piece_digest(piece: Any) -> str:
    """The sha256 of the piece as the standard library's json writes it."""
    plain = piece.tolist() if isinstance(piece, np.ndarray) else piece
    return hashlib.sha256(json.dumps(plain, separators=(",", ":")).encode()).hexdigest()


def same_piece(recorded: str, digest: str, piece: Any) -> bool:
    """Whether ``piece`` (whose :func:`piece_digest` is ``digest``) is the piece a session recorded as
    ``recorded``, by this release's digest or an earlier one's."""
    return bool(recorded) and (digest == recorded or recorded in earlier_digests(piece))
