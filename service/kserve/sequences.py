"""Triton's sequence extension over rtserve's sessions.

A request whose ``parameters.sequence_id`` is set (a uint64 other than 0, or a non-empty string) is a piece of that
sequence, and the sequence is one rtserve session, in Redis like any other (any replica continues it, a restart of
every replica loses nothing acknowledged):

- **Its id** is derived from the API key's owner, the model's name and the sequence id (:func:`session_id_of`): the
  same sequence id under two keys is two sessions, and a key never reaches another's. ``GET /sessions/{id}`` shows it
  (the answer's ``parameters.session_id`` says which). Without API keys every client shares the one owner, so clients
  share sequence ids, as Triton's correlation ids are shared.
- ``sequence_start: true`` creates it, replacing a session open under that id (a new incarnation: a piece of the
  earlier one still in flight commits nothing), then applies the piece. ``sequence_end: true`` applies the piece, then
  finishes the session and answers the finish result: the one-shot answer for the whole input.
- **Order.** The protocol numbers no pieces: a piece is the session's next one, in the order the commits land
  (:meth:`SessionFlow.apply_next`); the compare-and-set orders concurrent pieces of one sequence. A gRPC stream applies
  each sequence's pieces in the order it carries them.
- **Exactly-once** (rtserve's extension): ``parameters.sequence_seq`` numbers the piece (1 for the start, +1 per
  piece), which is then applied as ``POST /sessions/{id}/segments`` applies its ``seq``: a retry of the last applied
  number is answered from the stored result (``parameters.replayed``), a gap or a stale number is a 409. A start
  retried with ``sequence_seq`` 1 and the same input is answered from its stored result instead of starting again.
- A piece without ``sequence_start`` for a sequence that has no open session (never started, ended, expired after
  ``RTSERVE_SESSION_TTL_SECONDS`` idle, past ``RTSERVE_SESSION_MAX_LIFETIME_SECONDS``) is refused with Triton's message
  (404; 409 once it ended).
"""

from __future__ import annotations

import base64
import functools
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.runtime.pipeline import InputError
from service.runtime.registry import LoadedModel
from service.session_flow import Applied, SessionFlow
from service.sessions import SequenceConflict, SessionFinished, SessionMeta, SessionNotFound, SessionStatus

UINT64_MAX = 2**64 - 1


class SequenceNotStarted(SessionNotFound):
    """A piece of a sequence with no open session, without ``sequence_start`` (HTTP 404)."""


class SequenceEnded(SessionFinished):
    """A piece of a sequence that ended, without ``sequence_start`` (HTTP 409)."""


@dataclass(frozen=True)
class SequenceControl:
    """A request's sequence parameters."""

    id: int | str
    start: bool = False
    end: bool = False
    seq: int | None = None  # rtserve's sequence_seq: the piece's number, for exactly-once

    @classmethod
    def of(cls, parameters: dict[str, Any]) -> SequenceControl | None:
        """The control of a request's parameters; None for a request outside any sequence."""
        sequence_id = parameters.get("sequence_id")
        start, end, seq = (parameters.get(name) for name in ("sequence_start", "sequence_end", "sequence_seq"))
        for name, flag in (("sequence_start", start), ("sequence_end", end)):
            if flag is not None and type(flag) is not bool:
                raise InputError(f"parameters.{name} must be true or false")
        if seq is not None and (type(seq) is not int or seq < 1):
            raise InputError("parameters.sequence_seq must be an integer from 1 (1 for the sequence's first piece)")
        if sequence_id is None or sequence_id == 0 or sequence_id == "":
            if start or end or seq is not None:
                raise InputError("sequence_start, sequence_end and sequence_seq need parameters.sequence_id (a uint64 "
                                 "other than 0, or a non-empty string)")
            return None
        if type(sequence_id) is int:
            if not 0 < sequence_id <= UINT64_MAX:
                raise InputError(f"parameters.sequence_id {sequence_id} is not a uint64")
        elif type(sequence_id) is not str:
            raise InputError("parameters.sequence_id must be a uint64 or a string")
        return cls(sequence_id, bool(start), bool(end), seq)


@functools.lru_cache(maxsize=65536)  # a sequence's every piece asks
def session_id_of(owner: str, model: str, sequence_id: int | str) -> str:
    """The session of a sequence: ``v2`` and 32 URL-safe characters of sha256(owner, model name, the id and its
    type), the same on every replica."""
    kind = "u" if isinstance(sequence_id, int) else "s"
    digest = hashlib.sha256(f"{owner}\x00{model}\x00{kind}:{sequence_id}".encode("utf-8", "surrogatepass")).digest()
    return "v2" + base64.urlsafe_b64encode(digest[:24]).decode()


@dataclass
class Step:
    """What one request of a sequence did: its session, and the answer (the running result, or the final one)."""

    session_id: str
    meta: SessionMeta
    result: dict[str, Any]
    replayed: bool

    def parameters(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "sequence_seq": self.meta.seq, "replayed": self.replayed}


class Sequences:
    def __init__(self, flow: SessionFlow) -> None:
        self.flow = flow

    async def piece(self, model: LoadedModel, owner: str, quota: str, control: SequenceControl,
                    piece: str | np.ndarray, options: dict[str, Any]) -> Step:
        """Apply one request of a sequence (module docstring); the finish answer when it ends the sequence."""
        session_id = session_id_of(owner, model.name, control.id)
        text, rows = (piece, None) if isinstance(piece, str) else (None, piece)
        if control.start:
            applied = await self._start(model, session_id, owner, quota, control, text, rows)
        else:
            applied = await self._next(model, session_id, owner, control, text, rows)
        if not control.end:
            return Step(session_id, applied.meta, applied.result, applied.replayed)
        end = await self.flow.finish(session_id, owner, options=options)
        return Step(session_id, end.meta, end.final.result, applied.replayed and end.replayed)

    async def _start(self, model: LoadedModel, session_id: str, owner: str, quota: str, control: SequenceControl,
                     text: str | None, rows: list[list[float]] | None) -> Applied:
        if control.seq is not None:
            if control.seq != 1:
                raise InputError(f"a sequence_start request is its sequence's first piece: send sequence_seq 1, not "
                                 f"{control.seq}")
            try:  # a retried start: answered from what it stored (or applied now, if it created the session only)
                applied = await self.flow.apply(session_id, owner, 1, text, rows)
                if applied.meta.status is SessionStatus.OPEN or control.end:
                    return applied
            except (SessionNotFound, SessionFinished, SequenceConflict):
                pass  # another sequence under this id: started again
        await self.flow.create(model, owner, quota, session_id=session_id)
        return await self.flow.apply(session_id, owner, 1, text, rows)

    async def _next(self, model: LoadedModel, session_id: str, owner: str, control: SequenceControl,
                    text: str | None, rows: list[list[float]] | None) -> Applied:
        try:
            if control.seq is None:
                return await self.flow.apply_next(session_id, owner, text, rows)
            return await self.flow.apply(session_id, owner, control.seq, text, rows)
        except SessionNotFound:
            raise SequenceNotStarted(
                f"{_triton_words(control.id, model.name)}: no sequence {control.id!r} is open for this API key (never "
                "started, ended, or expired idle after RTSERVE_SESSION_TTL_SECONDS): send its first piece with "
                "parameters.sequence_start true") from None
        except SessionFinished as finished:
            error = SequenceEnded(f"{_triton_words(control.id, model.name)}: sequence {control.id!r} ended "
                                  "(sequence_end); send sequence_start true to start it again")
            error.model_ref = finished.model_ref
            raise error from None


def _triton_words(sequence_id: int | str, model: str) -> str:
    """Triton's own message for a piece of a sequence it holds no slot for (what its clients look for)."""
    return (f"inference request for sequence {sequence_id} to model '{model}' must specify the START flag on the "
            "first request of the sequence")
