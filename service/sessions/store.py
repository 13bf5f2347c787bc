"""The session store: every read and write of a session in Redis, through the scripts of
:mod:`service.sessions.scripts`, the leases of :mod:`service.sessions.lease` and the batched commits of
:mod:`service.sessions.commits`."""

from __future__ import annotations

import asyncio
import math
import secrets
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import orjson
from redis.exceptions import NoScriptError

from service import result_json
from service.metrics import ServiceMetrics
from service.sessions import scripts
from service.sessions.commits import CommitQueue
from service.sessions.errors import QuotaFull, SessionLimit, SessionNotFound
from service.sessions.lease import Leases
from service.sessions.meta import PARTS, SessionMeta, SessionStatus, new_epoch, new_session_id
from service.settings import Settings
from service.state_store import StateStore
from service.tensor_codec import Arrays, decode_tensors, encode_tensors

LIVE_INDEX_SHARDS = 16  # shards of each model's live index on a Redis Cluster (one key on a single server)
WAIT_SECONDS = 60.0  # longest wait behind a live holder that keeps refreshing its lease
FIRST_LOOK_SECONDS = 0.02  # a waiter's first look at a lock another request holds (a quick step has committed)


@dataclass
class Begun:
    """What BEGIN read for piece ``seq``."""

    meta: SessionMeta
    state: Arrays | None  # the state to compute the piece from (None unless it is the next piece)
    last_result: dict[str, Any] | None  # the last applied piece's result (only when ``seq`` is that piece: a retry)
    token: str | None  # the lock taken for this piece, to pass to the commit (None: none taken)
    busy: bool  # another request is applying this very piece now (wait for it)


@dataclass
class Piece:
    """What a commit writes for piece ``seq``."""

    seq: int
    sha: str  # its digest (a retry is recognised by it)
    state: Arrays  # the new bounded state
    result: dict[str, Any]  # the running result after it
    units_read: int  # tokens or rows it added
    segments: int  # graph steps it applied
    chunk: Arrays | None = None  # its append-only part of the state (SRformer)

    @cached_property
    def result_json(self) -> bytes:
        """``result`` as JSON, serialized once: what Redis stores and the piece's answer carries."""
        return result_json.dumps(self.result)


class SessionStore:
    def __init__(self, store: StateStore, settings: Settings, metrics: ServiceMetrics) -> None:
        self.store = store
        self.redis = store.client
        self.settings = settings
        self.metrics = metrics
        self._scripts: dict[str, Any] = {}
        self.lease_ms = max(1, int(settings.session_lock_seconds * 1000))
        self.live_shards = LIVE_INDEX_SHARDS if store.cluster else 1
        self.one_node = not store.cluster  # a script may then touch the indexes too (on a cluster: other slots)
        self.leases = Leases(store, self.lease_ms, self._pipelined)
        self.commits = CommitQueue(store, self._script(scripts.COMMIT), metrics)

    # ---- keys --------------------------------------------------------------------------------------------------
    def _keys(self, session_id: str) -> dict[str, str]:
        return {part: self.store.key(session_id, part) for part in PARTS}

    def _owner_key(self, quota: str) -> str:
        return f"{self.store.prefix}:owner:{quota}:sessions"

    def _live_keys(self, model: str) -> list[str]:
        """The model's live-index keys: one on a single server, ``live_shards`` on a cluster."""
        base = f"{self.store.prefix}:live:{model}"
        return [base] if self.live_shards == 1 else [f"{base}:{shard}" for shard in range(self.live_shards)]

    def _live_key(self, model: str, session_id: str) -> str:
        """The live-index key ``session_id`` counts in."""
        keys = self._live_keys(model)
        return keys[zlib.crc32(session_id.encode()) % len(keys)]

    def ttl(self, deadline: float) -> int:
        """Seconds a session whose lifetime ends at ``deadline`` is kept from now if left idle."""
        return max(1, min(self.settings.session_ttl_seconds, int(deadline - time.time())))

    # ---- scripts -----------------------------------------------------------------------------------------------
    def _script(self, lua: str) -> Any:
        script = self._scripts.get(lua)
        if script is None:
            script = self._scripts[lua] = self.redis.register_script(lua)
        return script

    async def _evalsha(self, lua: str, keys: list[str], args: list[Any]) -> Any:
        """One script call in a round trip of its own (:meth:`_pipelined`), without redis-py's script object in
        between (its type checks cost more than the command); its error reply raised."""
        (reply,) = await self._pipelined(lua, [(keys, args)])
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def _pipelined(self, lua: str, calls: list[tuple[list[str], list[Any]]],
                         companions: Sequence[tuple[Any, ...]] = ()) -> list[Any]:
        """One call of the script per (keys, args) of ``calls``, then the ``companions`` commands, all in one round
        trip (:meth:`StateStore.round_trip`); every reply, an error as an exception. A script Redis lost (a restart) is
        loaded again.

        On a cluster redis-py's pipeline splits them by node and the nodes are sent to in parallel (redis-py blocks the
        ``evalsha`` method in cluster pipelines, not the command: each call's keys share one slot)."""
        script = self._script(lua)
        commands = [("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls]
        commands.extend(companions)
        for attempt in range(2):
            replies = await self.store.round_trip(commands)
            if attempt == 0 and any(isinstance(reply, NoScriptError) for reply in replies[: len(calls)]):
                await self.redis.script_load(script.script)
                continue
            return list(replies)
        raise AssertionError("unreachable: the second attempt returns")

    # ---- create ------------------------------------------------------------------------------------------------
    async def create(self, model: str, task: str, owner: str, state: Arrays, quota: str | None = None,
                     session_id: str | None = None) -> SessionMeta:
        """A new session of ``owner``, counted against the quota of ``quota`` (default: the owner).

        It first reserves its place in the quota index (count, add, prune, atomically, so parallel creates cannot
        overshoot), then writes meta, state and its live-index entry: on one server all in one script, on a cluster
        the quota's script, then the create's pipelined with the live index. A session therefore never exists
        outside the quota index; a create that fails after its reservation removes what it may have written.

        ``session_id``: the caller's id for it (a KServe v2 sequence's, derived from its owner and sequence id) instead
        of a random one; a session there already is replaced by this one, a new incarnation (``CREATE_AGAIN``)."""
        quota = quota or owner
        now = time.time()
        deadline = now + self.settings.session_max_lifetime_seconds
        again = session_id is not None
        session_id = session_id or new_session_id()
        keys = self._keys(session_id)
        blob = encode_tensors(state)
        ttl = self.ttl(deadline)
        fields = {
            "model": model, "task": task, "owner": owner, "quota": quota, "seq": 0, "created": now,
            "deadline": deadline, "consumed": 0, "segments": 0, "state_bytes": len(blob), "piece_sha": "",
            "status": SessionStatus.OPEN.value, "epoch": new_epoch(),
        }
        limit = self.settings.max_sessions_per_key
        pairs = [str(item) for field in fields.items() for item in field]
        quota_key, live_key = self._owner_key(quota), self._live_key(model, session_id)
        args = [now, limit, session_id, now + ttl, ttl, blob, *pairs]
        script = scripts.CREATE_AGAIN if again else scripts.CREATE
        session_keys = [keys[part] for part in (("meta", "state", "result", "chunks", "lock") if again
                                                else ("meta", "state"))]
        try:
            async with self.store.operation(self.metrics.time_redis("create")):
                if self.one_node:  # the reservation, the session and its live-index entry: one script
                    scripts.reserved(await self._evalsha(script, [*session_keys, quota_key, live_key], args))
                else:  # the quota index lives in another slot: reserve, then the session and its index entry
                    scripts.reserved(await self._evalsha(scripts.QUOTA, [quota_key], args[:4]))
                    replies = await self._pipelined(
                        script, [(session_keys, args)],
                        [("ZADD", live_key, now + ttl, session_id),
                         ("ZREMRANGEBYSCORE", live_key, "-inf", now)],  # prune idle-expired ones
                    )
                    for reply in replies:
                        if isinstance(reply, Exception):
                            raise reply
        except QuotaFull as full:
            who = "this API key" if quota == owner else "this client address"
            frees_in = max(1, math.ceil(full.earliest_expiry - now))
            raise SessionLimit(
                f"{who} holds {limit} live sessions, the limit (RTSERVE_MAX_SESSIONS_PER_KEY): a place frees when one "
                f"of them is finished (POST /sessions/{{id}}/finish) or deleted (DELETE /sessions/{{id}}); left idle, "
                f"the next one expires in {frees_in} s", retry_after=frees_in,
            ) from None
        except BaseException:
            await self._forget(session_id, quota, model)
            raise
        return SessionMeta.from_hash(session_id, {k.encode(): str(v).encode() for k, v in fields.items()}, ttl * 1000)

    async def _forget(self, session_id: str, quota: str, model: str) -> None:
        """Best effort after a failed create: remove whatever of it may have reached Redis."""
        try:
            async with self.store.operation(), self.redis.pipeline(transaction=False) as pipe:
                pipe.delete(*self._keys(session_id).values())
                pipe.zrem(self._owner_key(quota), session_id).zrem(self._live_key(model, session_id), session_id)
                await pipe.execute()
        except Exception:  # Redis is gone: the reservation lapses with the idle TTL, counted until then
            pass

    # ---- reads -------------------------------------------------------------------------------------------------
    async def meta(self, session_id: str, owner: str) -> SessionMeta:
        keys = self._keys(session_id)
        async with self.store.operation(self.metrics.time_redis("meta")):
            async with self.redis.pipeline(transaction=True) as pipe:
                fields, ttl = await pipe.hgetall(keys["meta"]).pttl(keys["meta"]).execute()
        return _owned(SessionMeta.from_hash(session_id, fields, ttl) if fields else None, session_id, owner)

    async def live_counts(self, models: list[str]) -> dict[str, int]:
        """Open sessions per model whose idle expiry lies ahead (read-only: pruning happens at create).

        One round trip: a ZCOUNT per model (per shard on a cluster, summed), pipelined.
        """
        now = time.time()
        async with self.store.operation(self.metrics.time_redis("live_counts")):
            async with self.redis.pipeline(transaction=False) as pipe:
                for model in models:
                    for key in self._live_keys(model):
                        pipe.zcount(key, now, "+inf")
                counts = await pipe.execute()
        shards = self.live_shards
        return {model: sum(counts[i * shards : (i + 1) * shards]) for i, model in enumerate(models)}

    async def snapshot(
        self, session_id: str, owner: str, with_chunks: bool = False
    ) -> tuple[SessionMeta, Arrays, dict[str, Any] | None, list[Arrays]]:
        """Meta, state, last result (and the appended chunks) read together in one transaction."""
        keys = self._keys(session_id)
        async with self.store.operation(self.metrics.time_redis("snapshot")):
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hgetall(keys["meta"]).pttl(keys["meta"]).get(keys["state"]).get(keys["result"])
                if with_chunks:
                    pipe.lrange(keys["chunks"], 0, -1)
                fields, ttl, blob, result, *chunks = await pipe.execute()
        meta = _owned(SessionMeta.from_hash(session_id, fields, ttl) if fields else None, session_id, owner)
        if blob is None and meta.status is SessionStatus.OPEN:
            raise SessionNotFound(f"session {session_id} does not exist or has expired")
        decoded = [decode_tensors(chunk) for chunk in chunks[0]] if chunks else []
        return meta, _state(blob), (orjson.loads(result) if result else None), decoded

    async def begin(self, session_id: str, owner: str, seq: int) -> Begun:
        """One round trip: meta, the state if ``seq`` is the next piece (with the session's lock for it, when free),
        the last result if ``seq`` is the last applied piece (a retry answers with it)."""
        keys = self._keys(session_id)
        token = f"{seq}:{secrets.token_hex(8)}"
        async with self.store.operation(self.metrics.time_redis("begin")):
            reply = await self._evalsha(scripts.BEGIN, [keys["meta"], keys["state"], keys["result"], keys["lock"]],
                                        [seq, owner, token, self.lease_ms])
        meta, blob, result, locked, busy = scripts.begun(session_id, reply)
        _owned(meta, session_id, owner)
        next_piece = meta.status is SessionStatus.OPEN and seq == meta.seq + 1
        if next_piece and blob is None:  # meta without state: the session is expiring under us
            if locked:
                await self.leases.release(session_id, token)
            raise SessionNotFound(f"session {session_id} does not exist or has expired")
        return Begun(meta, _state(blob) if next_piece else None, orjson.loads(result) if result else None,
                     token if locked else None, busy)

    # ---- writes ------------------------------------------------------------------------------------------------
    async def commit(self, meta: SessionMeta, piece: Piece, token: str | None, touch_indexes: bool) -> SessionMeta:
        """Apply ``piece`` if the session is still at ``meta.seq`` in ``meta.epoch`` (compare-and-set), release the
        lock ``token`` (if given), and with ``touch_indexes`` move its index entries to its new idle expiry. Sent
        with the other commits of this turn of the loop (:class:`CommitQueue`): one round trip for them all.

        Returns the session's meta after it; raises :class:`LostRace` (nothing written: read again),
        :class:`SessionNotFound` or :class:`SessionFinished`."""
        keys = self._keys(meta.id)
        state_blob = encode_tensors(piece.state)
        chunk_blob = encode_tensors(piece.chunk) if piece.chunk else None
        ttl = self.ttl(meta.deadline)
        score = time.time() + ttl if touch_indexes else ""
        args: list[Any] = [
            meta.seq, piece.seq, state_blob, piece.result_json, ttl, piece.sha,
            meta.consumed + piece.units_read, meta.segments + piece.segments, len(state_blob), token or "",
            meta.epoch, score if self.one_node else "", meta.id, "1" if meta.chunk_bytes else "",
        ]
        if chunk_blob is not None:
            args.append(chunk_blob)
        script_keys = [keys["meta"], keys["state"], keys["result"], keys["chunks"], keys["lock"]]
        companions: list[tuple[Any, ...]] = []
        indexes = [self._live_key(meta.model, meta.id), self._owner_key(meta.quota)]
        if touch_indexes and self.one_node:
            script_keys += indexes
        elif touch_indexes:  # the indexes sit outside the session's hash slot: their own commands, same round trip
            companions = [("ZADD", index, "XX", score, meta.id) for index in indexes]
        reply = await self.commits.commit(script_keys, args, companions)
        if isinstance(reply, Exception):  # Redis refused this one call (out of memory ...): the service's error
            raise self.store.as_error(reply) or reply
        scripts.committed(meta.id, reply)
        return meta.after_piece(piece.seq, piece.sha, piece.units_read, piece.segments, len(state_blob),
                                len(chunk_blob) if chunk_blob is not None else 0, float(ttl))

    async def finish(self, meta: SessionMeta, result: Mapping[str, Any], only_now: bool = False) -> SessionMeta:
        """Mark the session finished with its final result (dropping its state) if it is still at ``meta.seq`` in
        ``meta.epoch``, then take it out of the live index and its quota: a finished session no longer counts against
        its key. Its meta after it; raises :class:`LostRace` (a piece came in between; with ``only_now``, also when
        it was finished already) or :class:`SessionNotFound`."""
        keys = self._keys(meta.id)
        indexes = [self._live_key(meta.model, meta.id), self._owner_key(meta.quota)]
        script_keys = [keys["meta"], keys["result"], keys["state"], keys["chunks"]]
        args = [meta.seq, result_json.dumps(result), self.ttl(meta.deadline), meta.id, meta.epoch]
        async with self.store.operation(self.metrics.time_redis("finish")):
            reply = await self._evalsha(scripts.FINISH, script_keys + indexes if self.one_node else script_keys,
                                        args)
            after = scripts.finished(meta.id, reply, only_now)
            if not self.one_node:  # the indexes live in other slots: once it finished
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.zrem(indexes[0], meta.id).zrem(indexes[1], meta.id)
                    await pipe.execute()
        return after

    async def delete(self, meta: SessionMeta) -> None:
        """Drop the session of ``meta`` (read by :meth:`meta`, which refuses strangers) and its index entries."""
        async with self.store.operation(self.metrics.time_redis("delete")):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.delete(*self._keys(meta.id).values())
                pipe.zrem(self._owner_key(meta.quota), meta.id).zrem(self._live_key(meta.model, meta.id), meta.id)
                await pipe.execute()

    async def wait_for(self, session_id: str, seq: int, timeout: float = WAIT_SECONDS) -> None:
        """Wait until the lock's holder has applied ``seq``, or its lock is gone (released, or lapsed with it).

        One look after :data:`FIRST_LOOK_SECONDS` catches a holder that commits quickly (most steps); after that
        the lock's remaining lease (PTTL) decides one wait: a dead holder's lock has lapsed by then, and a live
        holder, which renews its lease while it computes, has usually committed (else: one more lease). Waiting
        on a lock a dead replica left costs two reads (one pipelined HGET + PTTL each), whatever the lease.
        """
        deadline = time.monotonic() + timeout
        keys = self._keys(session_id)
        pause = FIRST_LOOK_SECONDS
        while time.monotonic() < deadline:
            await asyncio.sleep(pause)
            async with self.store.operation():
                async with self.redis.pipeline(transaction=False) as pipe:
                    current, lease_ms = await pipe.hget(keys["meta"], "seq").pttl(keys["lock"]).execute()
            if current is None or int(current) >= seq or lease_ms < 0:
                return
            pause = lease_ms / 1000 + 0.001  # to the moment the lease lapses unless renewed

    async def close(self) -> None:
        """Stop the lease keeper (the app's shutdown)."""
        await self.leases.close()


def _owned(meta: SessionMeta | None, session_id: str, owner: str) -> SessionMeta:
    """``meta`` when the session exists and is ``owner``'s; a stranger learns no more than that it does not exist."""
    if meta is None or meta.owner != owner:
        raise SessionNotFound(f"session {session_id} does not exist or has expired")
    return meta


def _state(blob: bytes | None) -> Arrays:
    """The stored state; none for a finished session, which only answers again what it stored."""
    return decode_tensors(blob) if blob is not None else {}

