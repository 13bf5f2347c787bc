"""A session's lease: the lock a replica holds while it applies the session's next piece, or while it holds the
session's stream open.

The lock is ``<prefix>:{<id>}:lock``, a token with an expiry of ``RTSERVE_SESSION_LOCK_SECONDS``: a replica that dies
holding it stalls the session for at most one lease. It only saves duplicate work; exactly-once rests on the commit's
compare-and-set (:mod:`service.sessions.scripts`). A piece's token is ``<seq>:<random>``, taken by the BEGIN script;
a stream's is ``stream:<random>``, taken when the stream opens (taking over a lease another stream left: the client
that reconnects is the one that knows) and no longer renewed when it closes, so that it lapses within a lease.

:class:`Leases` renews every lease this process holds from one keeper task, all in one round trip per beat, as
redis-py's ``Lock.extend`` would one at a time: holding a lease costs a dictionary entry, not a task or a round trip
per piece.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from service.sessions.errors import SessionNotFound
from service.sessions.scripts import LOCK_HELD, LOCK_TAKEN, TAKE_LOCK_LUA
from service.state_store import StateStore

RENEW = """
-- KEYS: locks; ARGV: their tokens, then the lease in milliseconds. Extends each lease that is still ours;
-- returns 1 (renewed) or 0 (not ours) per lock.
local lease = ARGV[#KEYS + 1]
local renewed = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i] then renewed[i] = redis.call('PEXPIRE', key, lease) else renewed[i] = 0 end
end
return renewed
"""


def renewed(reply: Any, count: int) -> list[bool | None]:
    """RENEW's reply, per lock: True (renewed), False (no longer ours: the commit's compare-and-set still decides)
    or None (Redis failed the call: try again at the next beat)."""
    if isinstance(reply, Exception):
        return [None] * count
    return [bool(ours) for ours in reply]


TAKE = TAKE_LOCK_LUA + """
-- KEYS: the lock; ARGV: a piece's token, the lease in milliseconds.
return take_lock(KEYS[1], ARGV[1], ARGV[2])
"""


def taken(reply: Any, token: str) -> tuple[str | None, bool]:
    """TAKE's reply, as BEGIN's lock reads: (the token, when the lock was taken for the piece; whether another
    piece's request holds it). Held by a session stream: neither (the piece goes ahead; the commits order the two)."""
    if isinstance(reply, Exception):
        raise reply
    lock = int(reply)
    return (token if lock == LOCK_TAKEN else None), lock == LOCK_HELD


TAKE_FOR_STREAM = """
-- KEYS: the lock, the session's meta; ARGV: the stream's token, the lease in milliseconds. Takes the lease if the
-- session is open. Returns {} when the session is gone, else {seq, epoch, status}.
local meta = redis.call('HMGET', KEYS[2], 'seq', 'epoch', 'status')
if not meta[1] then return {} end
if meta[3] ~= 'finished' then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
return {meta[1], meta[2] or '', meta[3] or 'open'}
"""


def stream_taken(session_id: str, reply: Any) -> tuple[int, str] | None:
    """TAKE_FOR_STREAM's reply: ``(seq, epoch)`` of the open session whose lease was taken; None for a finished
    session (none taken); :class:`SessionNotFound` when the session is gone."""
    if isinstance(reply, Exception):
        raise reply
    if not reply:
        raise SessionNotFound(f"session {session_id} does not exist or has expired")
    seq, epoch, status = reply
    return None if status == b"finished" else (int(seq), epoch.decode())


RELEASE = """
-- KEYS: the lock; ARGV: its token. Deletes the lock if it is still ours; returns 1 (released) or 0 (not ours).
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

RENEWED_PER_CALL = 256  # locks one renewal script call extends (a call of 256 took Redis 0.6 ms here)

Pipelined = Callable[[str, list[tuple[list[str], list[Any]]]], Awaitable[list[Any]]]


def stream_token() -> str:
    return f"stream:{secrets.token_hex(8)}"


class Leases:
    """Every lease this process holds, renewed by one keeper task."""

    def __init__(self, store: StateStore, lease_ms: int, pipelined: Pipelined) -> None:
        """``pipelined(script, calls)``: one call of the script per (keys, args), in one round trip (the store's)."""
        self.store, self.lease_ms, self._pipelined = store, lease_ms, pipelined
        self._held: dict[tuple[str, str], float] = {}  # (session id, token) -> when the lease was taken
        self._keeper: asyncio.Task[None] | None = None

    def _lock(self, session_id: str) -> str:
        return self.store.key(session_id, "lock")

    @asynccontextmanager
    async def holding(self, session_id: str, token: str) -> AsyncIterator[None]:
        """Keep the lease alive while the body runs (a step may outlast one lease): the keeper renews every lease
        held for a third of a lease or more, a third of a lease apart, so a lease is renewed between a third and
        two thirds of a lease after it was taken, and as often after that."""
        self.hold(session_id, token)
        try:
            yield
        finally:
            self.drop(session_id, token)

    def hold(self, session_id: str, token: str) -> None:
        """Keep a lease alive until :meth:`drop` (a stream's, for as long as it is open)."""
        self._held[(session_id, token)] = time.monotonic()
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(self._keep())

    def drop(self, session_id: str, token: str) -> None:
        """Stop renewing a lease :meth:`hold` kept."""
        self._held.pop((session_id, token), None)

    async def take_for_piece(self, session_id: str, seq: int) -> tuple[str | None, bool]:
        """Ask for the session's lock for piece ``seq`` (:func:`taken`): its token when taken (the commit releases
        it), and whether another piece's request holds it."""
        token = f"{seq}:{secrets.token_hex(8)}"
        async with self.store.operation():
            [reply] = await self._pipelined(TAKE, [([self._lock(session_id)], [token, self.lease_ms])])
        return taken(reply, token)

    async def take_for_stream(self, session_id: str, token: str) -> tuple[int, str] | None:
        """Take the session's lease for a stream (over any lease another stream left), if the session is open:
        where the session stands, ``(seq, epoch)``, in the same round trip; None when it is finished (no lease is
        taken); :class:`SessionNotFound` when it is gone."""
        meta = self.store.key(session_id, "meta")
        async with self.store.operation():
            [reply] = await self._pipelined(TAKE_FOR_STREAM, [([self._lock(session_id), meta],
                                                               [token, self.lease_ms])])
        return stream_taken(session_id, reply)

    async def release(self, session_id: str, token: str) -> None:
        """Give the lease back if it is still ours (another's is left alone)."""
        async with self.store.operation():
            await self._pipelined(RELEASE, [([self._lock(session_id)], [token])])

    async def renew(self, held: list[tuple[str, str]]) -> list[bool | None]:
        """Extend these (session id, token) leases, all in one round trip: per lease True (renewed), False (no
        longer ours) or None (Redis failed it; try again later)."""
        if not held:
            return []
        # one script call per RENEWED_PER_CALL leases; on a cluster, one per lease (they live in different slots)
        size = 1 if self.store.cluster else RENEWED_PER_CALL
        groups = [held[i : i + size] for i in range(0, len(held), size)]
        calls = [([self._lock(session_id) for session_id, _ in group], [*(token for _, token in group), self.lease_ms])
                 for group in groups]
        async with self.store.operation():
            replies = await self._pipelined(RENEW, calls)
        outcome: list[bool | None] = []
        for group, reply in zip(groups, replies, strict=True):
            outcome += renewed(reply, len(group))
        return outcome

    async def _keep(self) -> None:
        """Renew the leases held for a third of a lease or more, every third of a lease; ends after a lease with
        none held (:meth:`holding` starts it again)."""
        beat, idle = self.lease_ms / 3000, 0
        while idle < 3:
            await asyncio.sleep(beat)
            due = [key for key, since in self._held.items() if time.monotonic() - since >= beat]
            idle = 0 if self._held else idle + 1
            try:
                outcome = await self.renew(due)
            except Exception:  # StateStoreUnavailable, or any other error: try again at the next beat
                continue
            for key, ours in zip(due, outcome, strict=True):
                if ours is False:  # lost it: the commit's compare-and-set still decides
                    self._held.pop(key, None)

    async def close(self) -> None:
        """Stop the keeper (the app's shutdown)."""
        if self._keeper is not None:
            self._keeper.cancel()
            try:
                await self._keeper
            except asyncio.CancelledError:
                pass
