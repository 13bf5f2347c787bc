"""Applying a piece to a session exactly once, on any replica.

1. One round trip (``SessionStore.begin``): meta, state and last result, and the
   session's short lock when ``seq`` is the next piece.
2. ``seq`` equal to the last applied one: a retry — return the stored result
   (refused if the piece differs). Anything but last + 1: 409 with the
   expected number. The lock held by another request: wait for its commit (or
   for its lease to lapse, when its replica died).
3. Compute the step, refreshing the lock's lease while it runs; commit with the compare-and-set script, which also
   releases the lock and returns the new meta (one more round trip). A commit
   that loses the race returns what the winner stored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from service.metrics import ServiceMetrics
from service.runtime.pipeline import Finished, InputError, reads_nothing
from service.runtime.registry import LoadedModel, ModelRegistry
from service.sessions import (
    SequenceConflict,
    SessionFinished,
    SessionLimit,
    SessionMeta,
    SessionNotFound,
    SessionStore,
    piece_digest,
    same_piece,
)


@dataclass
class Applied:
    meta: SessionMeta
    result: dict[str, Any]
    replayed: bool  # True when this was a retry answered from the stored result


@dataclass
class Finishing:
    model: LoadedModel
    meta: SessionMeta  # after finishing (for a stream: once its tokens are all out)
    finished: Finished
    replayed: bool = False  # the session was already finished: its stored result


class SessionFlow:
    def __init__(self, sessions: SessionStore, registry: ModelRegistry, metrics: ServiceMetrics) -> None:
        self.sessions = sessions
        self.registry = registry
        self.metrics = metrics

    async def create(self, model: LoadedModel, owner: str, quota: str | None = None) -> SessionMeta:
        return await self.sessions.create(model.ref, model.task, owner, model.new_state(), quota)

    def model_of(self, meta: SessionMeta) -> LoadedModel:
        return self.registry.resolve(meta.model, meta.task)

    async def apply(
        self, session_id: str, owner: str, seq: int, text: str | None, rows: list[list[float]] | None,
        note_model: Callable[[str], None] | None = None,
    ) -> Applied:
        """Apply piece ``seq`` (``text`` or ``rows``, whichever the session's model reads)."""
        for _ in range(3):  # a lost race or a lapsed lock sends us round again, with fresh state
            meta, state, last_result, token = await self.sessions.begin(session_id, owner, seq)
            if note_model is not None:
                note_model(meta.model)
            try:
                model = self.model_of(meta)
                piece = self._piece(model, meta, text, rows)
                digest = piece_digest(piece)
                replay = self._check_sequence(meta, seq, digest, piece, last_result)
                if replay is not None:
                    return replay
                if token is None:  # another request is applying this session's next piece right now
                    await self.sessions.wait_for(session_id, seq)
                    continue
                async with self.sessions.holding(session_id, token):
                    consumed = await model.consume(state, piece)
            except BaseException:
                if token is not None:
                    await self.sessions.release(session_id, token)
                raise
            outcome, fresh = await self.sessions.commit(meta, seq, digest, consumed, token)
            if outcome == 1:
                assert fresh is not None
                self.metrics.labelled(self.metrics.session_state_bytes, model.ref).observe(fresh.state_bytes)
                return Applied(fresh, consumed.result, replayed=False)
            if outcome == -1:
                raise SessionNotFound(f"session {session_id} expired while the piece was applied")
            if outcome == -2:
                raise SessionFinished(f"session {session_id} is finished; start a new session")
        meta, _, last_result, _ = await self.sessions.snapshot(session_id, owner)
        replay = self._check_sequence(meta, seq, digest, piece, last_result)
        if replay is not None:
            return replay
        raise SequenceConflict(f"piece {seq} could not be applied, try again", expected=meta.seq + 1)

    @staticmethod
    def _piece(model: LoadedModel, meta: SessionMeta, text: str | None, rows: list[list[float]] | None) -> Any:
        """The piece the session's model reads: ``text`` or ``rows``, never both."""
        kind = model.pipeline.input_kind
        piece, other = (rows, text) if kind == "rows" else (text, rows)
        if piece is None or other is not None:
            wrong = "text" if kind == "rows" else "rows"
            raise InputError(f"this is a {meta.task} session: send `{kind}`, not `{wrong}`")
        return piece

    def _check_sequence(
        self, meta: SessionMeta, seq: int, digest: str, piece: Any, last_result: dict[str, Any] | None
    ) -> Applied | None:
        retried = seq == meta.seq and seq > 0 and same_piece(meta.piece_sha, digest, piece)
        if meta.status == "finished" and not retried:
            raise SessionFinished(f"session {meta.id} is finished; start a new session")
        if seq == meta.seq and seq > 0:  # a retry; after finish its stored result is the final one
            if not retried:
                raise SequenceConflict(
                    f"piece {seq} was already applied with different content; send piece {meta.seq + 1} next",
                    expected=meta.seq + 1,
                )
            return Applied(meta, last_result or {}, replayed=True)
        if seq != meta.seq + 1:
            kind = "stale" if seq < meta.seq else "out of order"
            raise SequenceConflict(
                f"piece {seq} is {kind}: this session has applied {meta.seq} pieces, send seq {meta.seq + 1}",
                expected=meta.seq + 1,
            )
        if meta.seq >= self.sessions.settings.max_segments_per_session:
            raise SessionLimit(
                f"session {meta.id} reached {self.sessions.settings.max_segments_per_session} pieces; finish it"
            )
        return None

    async def finish(
        self, session_id: str, owner: str, stream: bool = False, options: dict[str, Any] | None = None
    ) -> Finishing:
        """The final result. On a finished session: the stored one again (``replayed``). With ``stream`` the
        tokens are in ``finished.tokens`` and ``meta`` is the one after finishing once they are all out."""
        meta, state, last_result, chunks = await self.sessions.snapshot(session_id, owner, with_chunks=True)
        model = self.model_of(meta)
        if meta.status == "finished":
            return Finishing(model, meta, Finished(last_result or {}), replayed=True)
        finished = await model.finish(state, chunks, last_result, stream=stream, options=options)
        if reads_nothing(finished.result):  # single pieces may be empty, a whole document may not
            raise SequenceConflict(f"session {session_id} has no text the model reads yet (its pieces are empty, or "
                                   "only whitespace or control characters): send its text in pieces, then finish "
                                   "(the session stays open)", expected=meta.seq + 1)
        if finished.tokens is None:
            return Finishing(model, await self._store_final(meta, finished.result), finished)
        finishing = Finishing(model, meta, finished)
        finished.tokens = self._store_after_stream(finishing, finished.tokens)
        return finishing

    async def _store_after_stream(self, finishing: Finishing, tokens: AsyncIterator[str]) -> AsyncIterator[str]:
        async for token in tokens:
            yield token
        # the pipeline fills the result as it streams
        finishing.meta = await self._store_final(finishing.meta, finishing.finished.result)

    async def _store_final(self, meta: SessionMeta, result: dict[str, Any]) -> SessionMeta:
        outcome, fresh = await self.sessions.finish(meta, result)
        if outcome == 0:
            raise SequenceConflict("a piece arrived while the session was finishing; finish again", meta.seq + 1)
        if outcome == -1 or fresh is None:
            raise SessionNotFound(f"session {meta.id} expired while finishing")
        return fresh

    async def delete(self, meta: SessionMeta) -> None:
        """Drop the session ``meta`` describes (read by :meth:`status`, which refuses strangers)."""
        await self.sessions.delete(meta)

    async def refresh_active_sessions(self) -> None:
        """Set the active-sessions gauge from the shared Redis index (called at scrape time)."""
        counts = await self.sessions.live_counts(sorted(self.registry.models))
        for model, count in counts.items():
            self.metrics.active_sessions.labels(model=model).set(count)

    async def status(self, session_id: str, owner: str) -> SessionMeta:
        return await self.sessions.meta(session_id, owner)
