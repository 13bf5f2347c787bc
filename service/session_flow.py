"""Applying a piece to a session exactly once, on any replica.

1. Read meta, state and last result in one transaction.
2. ``seq`` equal to the last applied one: a retry — return the stored result
   (refused if the piece differs). Anything but last + 1: 409 with the
   expected number.
3. Take the session's short lock so concurrent copies of the same piece wait
   for one computation; compute the step; commit with the compare-and-set
   script. A commit that loses the race returns what the winner stored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from service.metrics import ServiceMetrics
from service.runtime.pipeline import Finished
from service.runtime.registry import LoadedModel, ModelRegistry
from service.sessions import (
    SequenceConflict,
    SessionFinished,
    SessionLimit,
    SessionMeta,
    SessionNotFound,
    SessionStore,
    piece_digest,
)


@dataclass
class Applied:
    meta: SessionMeta
    result: dict[str, Any]
    replayed: bool  # True when this was a retry answered from the stored result


class SessionFlow:
    def __init__(self, sessions: SessionStore, registry: ModelRegistry, metrics: ServiceMetrics) -> None:
        self.sessions = sessions
        self.registry = registry
        self.metrics = metrics

    async def create(self, model: LoadedModel, owner: str) -> SessionMeta:
        return await self.sessions.create(model.ref, model.task, owner, model.pipeline.new_state())

    def model_of(self, meta: SessionMeta) -> LoadedModel:
        return self.registry.resolve(meta.model, meta.task)

    async def apply(self, session_id: str, owner: str, seq: int, piece: Any) -> Applied:
        digest = piece_digest(piece)
        for _ in range(3):  # a lost race or a lapsed lock sends us round again, with fresh state
            meta, state, last_result = await self.sessions.snapshot(session_id, owner)
            replay = self._check_sequence(meta, seq, digest, last_result)
            if replay is not None:
                return replay
            token = await self.sessions.acquire(session_id, seq)
            if token is None:  # another request is applying this session's next piece right now
                await self.sessions.wait_for(session_id, owner, seq)
                continue
            try:
                model = self.model_of(meta)
                consumed = await model.pipeline.consume(state, piece)
                outcome = await self.sessions.commit(meta, seq, digest, consumed)
            finally:
                await self.sessions.release(session_id, token)
            if outcome == 1:
                self.metrics.segments.labels(model=model.ref).inc(consumed.segments)
                fresh = await self.sessions.touch(meta)
                self.metrics.session_state_bytes.labels(model=model.ref).observe(fresh.state_bytes)
                return Applied(fresh, consumed.result, replayed=False)
            if outcome == -1:
                raise SessionNotFound(f"session {session_id} expired while the piece was applied")
            if outcome == -2:
                raise SessionFinished(f"session {session_id} is finished; start a new session")
        meta, _, last_result = await self.sessions.snapshot(session_id, owner)
        replay = self._check_sequence(meta, seq, digest, last_result)
        if replay is not None:
            return replay
        raise SequenceConflict(f"piece {seq} could not be applied, try again", expected=meta.seq + 1)

    def _check_sequence(
        self, meta: SessionMeta, seq: int, digest: str, last_result: dict[str, Any] | None
    ) -> Applied | None:
        if meta.status == "finished":
            raise SessionFinished(f"session {meta.id} is finished; start a new session")
        if seq == meta.seq and seq > 0:
            if digest != meta.piece_sha:
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
    ) -> tuple[SessionMeta, Finished]:
        meta, state, last_result = await self.sessions.snapshot(session_id, owner)
        if meta.status == "finished":
            return meta, Finished(last_result or {})
        model = self.model_of(meta)
        chunks = await self.sessions.chunks(session_id)
        finished = await model.pipeline.finish(state, chunks, last_result, stream=stream, options=options)
        if finished.tokens is None:
            await self._store_final(meta, finished.result)
            return meta, finished
        return meta, Finished(finished.result, self._store_after_stream(meta, finished))

    async def _store_after_stream(self, meta: SessionMeta, finished: Finished) -> AsyncIterator[str]:
        assert finished.tokens is not None
        async for token in finished.tokens:
            yield token
        await self._store_final(meta, finished.result)  # the pipeline fills result as it streams

    async def _store_final(self, meta: SessionMeta, result: dict[str, Any]) -> None:
        outcome = await self.sessions.finish(meta, result)
        if outcome == 0:
            raise SequenceConflict("a piece arrived while the session was finishing; finish again", meta.seq + 1)
        elif outcome == -1:
            raise SessionNotFound(f"session {meta.id} expired while finishing")

    async def delete(self, session_id: str, owner: str) -> None:
        await self.sessions.delete(session_id, owner)

    async def refresh_active_sessions(self) -> None:
        """Set the active-sessions gauge from the shared Redis index (called at scrape time)."""
        counts = await self.sessions.live_counts(sorted(self.registry.models))
        for model, count in counts.items():
            self.metrics.active_sessions.labels(model=model).set(count)

    async def status(self, session_id: str, owner: str) -> SessionMeta:
        return await self.sessions.meta(session_id, owner)
