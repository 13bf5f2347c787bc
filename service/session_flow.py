"""Applying a piece to a session exactly once, on any replica, whatever the transport (HTTP or a stream).

1. A session this replica applied the last piece of is in its cache (:mod:`service.sessions.cache`): when ``seq`` is
   its next piece, the piece is computed from the kept state at once, with no read of the session first. A model
   whose step is light (an RSA step) takes no lock for it: computing it twice, on a retry sent elsewhere meanwhile,
   costs less than the lock's round trip; a heavy one asks for the lock first (one round trip, no read).
2. Otherwise one round trip (``SessionStore.begin``) reads meta, the state (for the next piece) and the last result
   (for a retry), and takes the session's short lock when the piece is the next one. ``seq`` equal to the last
   applied one is a retry: the stored result answers it (refused if the piece differs). Anything but last + 1 is
   a 409 with the expected number. The lock held by another request: wait for its commit (or for its lease to lapse,
   when its replica died). The lock held by a session stream: go ahead (the commit orders the two).
3. Compute the step (the lock's lease renewed while it runs), then commit with the compare-and-set script, in the
   same round trip as the other commits of its batch. A commit that finds the session moved on (another request
   applied a piece first, from the cache's stale state or on another replica) wrote nothing: the piece goes round
   again from a fresh read, where it is the retry of what the other applied (answered ``replayed``), or a 409.

Errors raised once the session was read carry its model (``model_ref``), for the request metrics.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from service import result_json
from service.metrics import ServiceMetrics
from service.runtime.pipeline import Arrays, FinalResult, InputError, reads_nothing
from service.runtime.registry import LoadedModel, ModelRegistry
from service.sessions import (
    LostRace,
    Piece,
    SequenceConflict,
    SessionFinished,
    SessionLimit,
    SessionMeta,
    SessionStatus,
    SessionStore,
)
from service.sessions.cache import Kept, StateCache
from service.sessions.digest import piece_digest, same_piece
from service.sessions.lease import stream_token

INDEX_TOUCH_SECONDS = 60.0  # a kept session's index entries move to its new idle expiry at most this often
ROUNDS = 3  # reads of a session a piece may take before it is refused as a conflict
NEXT_ROUNDS = 16  # the same for a piece without a number (apply_next), which concurrent pieces may each push back


@dataclass
class Applied:
    meta: SessionMeta
    result: dict[str, Any]
    replayed: bool  # True when this was a retry answered from the stored result
    result_json: bytes = b""  # ``result`` as JSON when already serialized (its commit's), else empty


@dataclass
class SessionEnd:
    """A finish: the session's model, its meta after finishing (for a stream: once its tokens are all out), and
    the pipeline's final result."""

    model: LoadedModel
    meta: SessionMeta
    final: FinalResult
    replayed: bool = False  # the session was already finished: its stored result


@contextmanager
def about(meta: SessionMeta) -> Iterator[None]:
    """Errors raised in the body name the session's model (``model_ref``), unless they name one already."""
    try:
        yield
    except Exception as error:
        if getattr(error, "model_ref", None) is None:
            error.model_ref = meta.model  # type: ignore[attr-defined]
        raise


class SessionFlow:
    def __init__(self, sessions: SessionStore, registry: ModelRegistry, metrics: ServiceMetrics,
                 cache: StateCache) -> None:
        self.sessions = sessions
        self.registry = registry
        self.metrics = metrics
        self.cache = cache

    async def create(self, model: LoadedModel, owner: str, quota: str | None = None,
                     session_id: str | None = None) -> SessionMeta:
        """A new session, kept here with its initial state: its first piece (or its stream) on this replica reads
        nothing back. ``session_id``: under that id (a KServe v2 sequence's), replacing a session there (a new
        incarnation, :meth:`SessionStore.create`)."""
        state = model.new_state()
        meta = await self.sessions.create(model.ref, model.task, owner, state, quota, session_id)
        self.cache.keep(meta.id, Kept(meta, state, indexes_touched=time.time(), result_json=None))
        return meta

    def model_of(self, meta: SessionMeta) -> LoadedModel:
        return self.registry.resolve(meta.model, meta.task)

    async def apply(self, session_id: str, owner: str, seq: int, text: str | None,
                    rows: list[list[float]] | None) -> Applied:
        """Apply piece ``seq`` (``text`` or ``rows``, whichever the session's model reads)."""
        kept = self.cache.get(session_id)
        if (kept is not None and kept.meta.owner == owner and kept.meta.status is SessionStatus.OPEN
                and seq == kept.meta.seq + 1):
            with about(kept.meta):
                model = self.model_of(kept.meta)
                piece = self._piece(model, kept.meta, text, rows)
                digest = piece_digest(piece)
                self._check_room(kept.meta)
                if model.light or kept.pins:  # light, or this replica's own stream holds the session
                    token, busy = None, False
                else:  # a heavy step is worth the lock: a retry elsewhere waits for it instead of computing it
                    token, busy = await self.sessions.leases.take_for_piece(session_id, seq)
                if not busy:  # else another request applies a piece of it now: read the session, as below
                    try:
                        return await self._compute(model, kept.meta, kept.state, seq, piece, digest, token, kept)
                    except LostRace:  # the session moved on elsewhere: read it and decide anew
                        self.cache.drop(session_id)
        for _ in range(ROUNDS):
            begun = await self.sessions.begin(session_id, owner, seq)
            with about(begun.meta):
                try:
                    model = self.model_of(begun.meta)
                    piece = self._piece(model, begun.meta, text, rows)
                    digest = piece_digest(piece)
                    replay = self._check_sequence(begun.meta, seq, digest, piece, begun.last_result)
                except BaseException:
                    if begun.token is not None:
                        await self.sessions.leases.release(session_id, begun.token)
                    raise
                if replay is not None:
                    return replay
                if begun.busy:  # another request is applying this session's next piece right now
                    await self.sessions.wait_for(session_id, seq)
                    continue
                assert begun.state is not None, "the next piece's read brings its state"
                try:
                    return await self._compute(model, begun.meta, begun.state, seq, piece, digest, begun.token, None)
                except LostRace:
                    continue
        meta, _, last_result, _ = await self.sessions.snapshot(session_id, owner)
        with about(meta):
            replay = self._check_sequence(meta, seq, digest, piece, last_result)
            if replay is not None:
                return replay
            raise SequenceConflict(f"piece {seq} could not be applied, try again", expected=meta.seq + 1)

    async def apply_next(self, session_id: str, owner: str, text: str | None,
                         rows: list[list[float]] | None) -> Applied:
        """Apply the piece as the session's next one, whatever its number: for a protocol whose requests carry none
        (KServe v2's sequences). Pieces are applied in the order their commits land: a piece whose compare-and-set
        found the session moved on (another piece committed first, here or on another replica) is computed again
        from the state that one left. Nothing tells a retry from a new piece, so none is answered ``replayed``: a
        client that needs exactly-once numbers its pieces (:meth:`apply`)."""
        expected, seq = 0, None  # seq: the next piece's number as last read (None: to read)
        for _ in range(NEXT_ROUNDS):
            kept = self.cache.get(session_id)
            if kept is not None and kept.meta.owner == owner and kept.meta.status is SessionStatus.OPEN:
                with about(kept.meta):
                    model = self.model_of(kept.meta)
                    piece = self._piece(model, kept.meta, text, rows)
                    self._check_room(kept.meta)
                    try:
                        return await self._compute(model, kept.meta, kept.state, kept.meta.seq + 1, piece,
                                                   piece_digest(piece), None, kept)
                    except LostRace:
                        self.cache.drop(session_id)
                        continue
            if seq is None:
                seq = (await self.sessions.meta(session_id, owner)).seq + 1
            expected = seq
            begun = await self.sessions.begin(session_id, owner, seq)
            with about(begun.meta):
                try:
                    if begun.meta.status is SessionStatus.FINISHED:
                        raise SessionFinished(f"session {session_id} is finished; start a new session")
                    model = self.model_of(begun.meta)
                    piece = self._piece(model, begun.meta, text, rows)
                    self._check_room(begun.meta)
                except BaseException:
                    if begun.token is not None:
                        await self.sessions.leases.release(session_id, begun.token)
                    raise
                if begun.meta.seq + 1 != seq:  # another piece committed since: begin again from where it stands
                    seq = begun.meta.seq + 1
                    continue
                if begun.busy:  # another request is applying this very piece now: wait for its commit
                    await self.sessions.wait_for(session_id, seq)
                    seq = None
                    continue
                assert begun.state is not None, "the next piece's read brings its state"
                try:
                    return await self._compute(model, begun.meta, begun.state, seq, piece, piece_digest(piece),
                                               begun.token, None)
                except LostRace:
                    seq = None
                    continue
        raise SequenceConflict(f"the next piece of session {session_id} could not be applied: other pieces kept "
                               "committing first; send it again", expected=expected)

    async def _compute(self, model: LoadedModel, meta: SessionMeta, state: Arrays, seq: int, piece: Any,
                       digest: str, token: str | None, kept: Kept | None) -> Applied:
        """Step the piece from ``state`` and commit it; keep what it left for the session's next piece."""
        try:
            if token is None:
                consumed = await model.consume(state, piece)
            else:
                async with self.sessions.leases.holding(meta.id, token):
                    consumed = await model.consume(state, piece)
        except BaseException:
            if token is not None:
                await self.sessions.leases.release(meta.id, token)
            raise
        now = time.time()
        touch = kept is None or now - kept.indexes_touched >= INDEX_TOUCH_SECONDS
        written = Piece(seq, digest, consumed.state, consumed.result, consumed.units_read, consumed.segments,
                        consumed.chunk)
        fresh = await self.sessions.commit(meta, written, token, touch)
        touched = now if touch or kept is None else kept.indexes_touched
        self.cache.keep(meta.id, Kept(fresh, consumed.state, touched, written.result_json))
        self.metrics.labelled(self.metrics.session_state_bytes, model.ref).observe(fresh.state_bytes)
        return Applied(fresh, consumed.result, replayed=False, result_json=written.result_json)

    @staticmethod
    def _piece(model: LoadedModel, meta: SessionMeta, text: str | None, rows: list[list[float]] | None) -> Any:
        """The piece the session's model reads: ``text`` or ``rows``, never both."""
        kind = model.pipeline.input_kind
        piece, other = (rows, text) if kind == "rows" else (text, rows)
        if piece is None or other is not None:
            wrong = "text" if kind == "rows" else "rows"
            raise InputError(f"this is a {meta.task} session: send `{kind}`, not `{wrong}`")
        return piece

    def _check_room(self, meta: SessionMeta) -> None:
        limit = self.sessions.settings.max_segments_per_session
        if meta.seq >= limit:
            raise SessionLimit(f"session {meta.id} reached {limit} pieces; finish it")

    def _check_sequence(
        self, meta: SessionMeta, seq: int, digest: str, piece: Any, last_result: dict[str, Any] | None
    ) -> Applied | None:
        """A retry of the last applied piece answered from its stored result; None for the next piece; else the
        conflict, the finished session or the full session, raised."""
        retried = seq == meta.seq and seq > 0 and same_piece(meta.piece_sha, digest, piece)
        if meta.status is SessionStatus.FINISHED and not retried:
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
        self._check_room(meta)
        return None

    async def finish(self, session_id: str, owner: str, stream: bool = False,
                     options: dict[str, Any] | None = None) -> SessionEnd:
        """The final result. On a finished session: the stored one again (``replayed``). With ``stream`` the
        tokens are in ``final.tokens`` and ``meta`` is the one after finishing once they are all out.

        A session this replica applied the last piece of (its state kept, no chunks) is finished from what it kept,
        without reading it first; the finish script's compare-and-set on ``seq`` and incarnation refuses a kept
        state another replica moved past (or a session finished meanwhile), which is then finished from a read."""
        kept = self.cache.get(session_id)
        if not stream and kept is not None and kept.finishable_by(owner):
            try:
                return await self._finish(kept.meta, kept.state, kept.last_result(), [], stream, options,
                                          from_kept=True)
            except LostRace:  # not the session's current state (its kept entry is dropped): read it, finish from there
                pass
        meta, state, last_result, chunks = await self.sessions.snapshot(session_id, owner, with_chunks=True)
        return await self._finish(meta, state, last_result, chunks, stream, options)

    async def _finish(self, meta: SessionMeta, state: Arrays, last_result: dict[str, Any] | None,
                      chunks: list[Arrays], stream: bool, options: dict[str, Any] | None,
                      from_kept: bool = False) -> SessionEnd:
        with about(meta):
            model = self.model_of(meta)
            if meta.status is SessionStatus.FINISHED:
                return SessionEnd(model, meta, FinalResult(last_result or {}), replayed=True)
            final = await model.finish(state, chunks, last_result, stream=stream, options=options)
            if reads_nothing(final.result):  # single pieces may be empty, a whole document may not
                raise SequenceConflict(f"session {meta.id} has no text the model reads yet (its pieces are empty, "
                                       "or only whitespace or control characters): send its text in pieces, then "
                                       "finish (the session stays open)", expected=meta.seq + 1)
            if final.tokens is None:
                return SessionEnd(model, await self._store_final(meta, final.result, from_kept), final)
            end = SessionEnd(model, meta, final)
            final.tokens = self._store_after_stream(end, final.tokens)
            return end

    async def _store_after_stream(self, end: SessionEnd, tokens: AsyncIterator[str]) -> AsyncIterator[str]:
        async for token in tokens:
            yield token
        # the pipeline fills the result as it streams
        end.meta = await self._store_final(end.meta, end.final.result)

    async def _store_final(self, meta: SessionMeta, result: dict[str, Any], from_kept: bool = False) -> SessionMeta:
        """Finish the session at ``meta`` with ``result``. ``from_kept``: ``meta`` is what this replica kept, so a
        lost race (or a session another request finished at this very seq) is :class:`LostRace`, for the caller to
        read the session and decide again."""
        self.cache.drop(meta.id)
        try:
            return await self.sessions.finish(meta, result, only_now=from_kept)
        except LostRace:
            if from_kept:
                raise
            raise SequenceConflict("a piece arrived while the session was finishing; finish again",
                                   meta.seq + 1) from None

    async def open_stream(self, session_id: str, owner: str) -> tuple[SessionMeta, str]:
        """A stream opens on the session: its meta (for the ``open`` frame) and the lease token it holds while it is
        open. Its state is kept (pinned) in the cache, so that its pieces are computed without a read. One round trip
        takes the lease (over any lease another stream left) and tells where the session stands: the state this
        replica kept serves if it is the current one, else the session is read (one more round trip)."""
        lease = stream_token()
        kept = self.cache.get(session_id)
        if kept is not None and kept.meta.owner != owner:
            kept = None
        taken = await self.sessions.leases.take_for_stream(session_id, lease) if kept is not None else None
        if kept is not None and taken == (kept.meta.seq, kept.meta.epoch):
            meta = kept.meta
        else:
            meta, state, last_result, _ = await self.sessions.snapshot(session_id, owner)
            if meta.status is SessionStatus.OPEN:
                kept_result = result_json.dumps(last_result) if last_result is not None else None
                self.cache.keep(session_id, Kept(meta, state, indexes_touched=0.0, result_json=kept_result))
                if kept is None:  # not taken above
                    await self.sessions.leases.take_for_stream(session_id, lease)
        if meta.status is SessionStatus.OPEN:
            self.cache.pin(session_id)
            self.sessions.leases.hold(session_id, lease)
        return meta, lease

    def close_stream(self, session_id: str, lease: str) -> None:
        """The stream closed: its state may be dropped like any other, and its lease is no longer renewed. The lease
        is left to lapse (within ``RTSERVE_SESSION_LOCK_SECONDS``) rather than given back: a lease a stream left
        holds nothing up (an HTTP piece goes ahead, another stream takes it over), and giving it back would cost a
        round trip per stream."""
        self.cache.unpin(session_id)
        self.sessions.leases.drop(session_id, lease)

    async def delete(self, meta: SessionMeta) -> None:
        """Drop the session ``meta`` describes (read by :meth:`status`, which refuses strangers)."""
        self.cache.drop(meta.id)
        await self.sessions.delete(meta)

    async def refresh_active_sessions(self) -> None:
        """Set the active-sessions gauge from the shared Redis index (called at scrape time)."""
        counts = await self.sessions.live_counts(sorted(self.registry.models))
        for model, count in counts.items():
            self.metrics.active_sessions.labels(model=model).set(count)

    async def status(self, session_id: str, owner: str) -> SessionMeta:
        return await self.sessions.meta(session_id, owner)
