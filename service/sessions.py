"""Sessions: long inputs sent piece by piece, the recurrent state in Redis only.

Keys of one session share one hash slot (``<prefix>:{<id>}:...``):

- ``meta``   hash: model, task, owner, quota (the index it counts in), seq (last applied), created, deadline,
             consumed, segments, state_bytes (bounded state), chunk_bytes (appended state), piece_sha (hash of
             the last applied piece), status (open | finished)
- ``state``  safetensors bytes of the bounded state (dropped at finish)
- ``result`` JSON of the result of the last applied piece (returned again on a retry); after finish, the final one
- ``chunks`` list of safetensors blobs, append-only (state that grows, e.g. SRformer's per-window keys/values;
             dropped at finish)
- ``lock``   short-lived marker of the replica applying the next piece

Two indexes live outside the session's slot, both sorted sets scored by the
time each session goes idle-expired: ``<prefix>:owner:<quota>:sessions``
(open sessions per API key, or per client address without keys: the quota)
and the live index of open sessions per model, from which every replica reads the
same active-session count: ``<prefix>:live:<model>`` on one Redis server, or,
on a Redis Cluster (``RTSERVE_REDIS_CLUSTER``), 16 shards
``<prefix>:live:<model>:<n>`` (n = CRC32 of the session id mod 16), so that the
index writes of a busy model spread over the cluster's nodes instead of
heating one key; the count is the sum of the shards.

On a Redis Cluster every Lua script touches the keys of one hash slot only:
the session's own keys, or the one quota key (``QUOTA_SCRIPT``); the indexes
are updated by plain commands sent in the same round trip as the session's
script, to whichever nodes hold them, in parallel. On one server, where a
script may touch any key, the create's and the finish's scripts update the
indexes themselves, which saves a round trip each. Either way the indexes
are counts for quotas and gauges, never the source of truth about a session.
What that allows: a session whose index update failed (its request answered
503, the piece itself applied or not) keeps its last index
score and may leave the count early, undercounting by one until it ends; a
failover that loses the newest writes of a primary (replication is
asynchronous) may lose a quota reservation or an index entry with them.

A create first reserves its place in the quota index (count, add, prune,
atomically, so parallel creates cannot overshoot), then writes meta and state
and its live-index entry: on one server all in one script (``CREATE_SCRIPT``
given the indexes), on a cluster ``QUOTA_SCRIPT``, then ``CREATE_SCRIPT``
pipelined with the live index. A session therefore never exists outside the
quota index; a create that fails after its reservation removes what it may
have written. Finishing
takes the session out of both indexes (its place in the quota frees at once)
and drops its state: a finished session only answers again what it stored,
for the idle TTL.

The lock is a lease of ``RTSERVE_SESSION_LOCK_SECONDS``, refreshed while the
step runs: a replica that dies holding it stalls the session for at most one
lease. It only saves duplicate work; exactly-once rests on the commit's
compare-and-set.

A piece is applied exactly once: the commit is one Lua script that checks
the sequence number it read is still current (compare-and-set) and writes
state, result and chunk together or not at all. Idle sessions expire after
the TTL; none outlives its maximum lifetime.

An applied piece costs two round trips to Redis: ``BEGIN_SCRIPT`` reads meta
and state (and the last result, for a retry only) and takes the session's
lock when the piece is the next one; ``COMMIT_SCRIPT`` writes, releases the
lock and returns the new meta, pipelined with the live-index touch. A retry
costs one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import secrets
import time
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from redis.exceptions import NoScriptError

from service.metrics import ServiceMetrics
from service.runtime.pipeline import Arrays, Consumed
from service.settings import Settings
from service.state_store import StateStore
from service.tensor_codec import decode_tensors, encode_tensors

# The quota's reservation, shared by QUOTA_SCRIPT and CREATE_SCRIPT (ARGV: now, limit, session id, idle expiry).
# It counts the members not yet idle-expired; when limit or more, it returns -1 and the earliest idle expiry among
# them, having written nothing. Otherwise it adds the session, drops the expired members and returns the count.
# The add is the first write: Redis checks maxmemory at a script's first write only, so a full Redis refuses the
# script before it writes anything (a prune first would let the later writes through).
RESERVE_LUA = """
local function reserve(quota)
  local count = redis.call('ZCOUNT', quota, '(' .. ARGV[1], '+inf')
  if count >= tonumber(ARGV[2]) then
    return -1, redis.call('ZRANGEBYSCORE', quota, '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, 1)[2]
  end
  redis.call('ZADD', quota, ARGV[4], ARGV[3])
  redis.call('ZREMRANGEBYSCORE', quota, '-inf', ARGV[1])
  return count
end
"""

QUOTA_SCRIPT = RESERVE_LUA + """
-- KEYS: the quota index. Returns {the count of live members before}, or {-1, the earliest idle expiry} when full.
local count, earliest = reserve(KEYS[1])
if count < 0 then return {-1, earliest} end
return {count}
"""

CREATE_SCRIPT = RESERVE_LUA + """
-- KEYS: meta, state, and on one server the quota and live indexes; ARGV: now, limit, session id, idle expiry,
-- ttl, state, then the meta hash as field, value pairs.
-- With the indexes: the reservation first (a full quota returns {-1, its earliest idle expiry} and writes
-- nothing), then the session, then its live-index entry (pruning idle-expired ones).
-- Returns {the quota's count before} ({0} without the indexes).
local count = 0
if #KEYS == 4 then
  local earliest
  count, earliest = reserve(KEYS[3])
  if count < 0 then return {-1, earliest} end
end
redis.call('HSET', KEYS[1], unpack(ARGV, 7))
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('SET', KEYS[2], ARGV[6], 'EX', ARGV[5])
if #KEYS == 4 then
  redis.call('ZADD', KEYS[4], ARGV[4], ARGV[3])
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ARGV[1])
end
return {count}
"""

REFRESH_SCRIPT = """
-- KEYS: locks; ARGV: their tokens, then the lease in milliseconds. Extends each lease that is still ours;
-- returns 1 (renewed) or 0 (not ours) per lock.
local lease = ARGV[#KEYS + 1]
local renewed = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i] then renewed[i] = redis.call('PEXPIRE', key, lease) else renewed[i] = 0 end
end
return renewed
"""

BEGIN_SCRIPT = """
-- KEYS: meta, state, result, lock; ARGV: seq to apply, owner, lock token, lock milliseconds
-- Returns {} when the session is gone, else {meta fields, meta ttl, state, result, locked}: the lock
-- is taken only when the owner matches, the session is open and the piece is the next one. The stored
-- result comes back only for a retry of the last applied piece (the one case that answers with it).
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then return {} end
local meta = {}
for i = 1, #fields, 2 do meta[fields[i]] = fields[i + 1] end
local locked = 0
if meta['owner'] == ARGV[2] and meta['status'] ~= 'finished' and tonumber(ARGV[1]) == tonumber(meta['seq']) + 1 then
  if redis.call('SET', KEYS[4], ARGV[3], 'NX', 'PX', ARGV[4]) then locked = 1 end
end
local result = false
if tonumber(ARGV[1]) == tonumber(meta['seq']) then result = redis.call('GET', KEYS[3]) end
return {fields, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]), result, locked}
"""

COMMIT_SCRIPT = """
-- KEYS: meta, state, result, chunks, lock
-- ARGV: expected_seq, new_seq, state, result, ttl, piece_sha, consumed, segments, state_bytes, lock token,
--       chunk (optional, appended)
-- Returns {outcome, meta fields, meta ttl}: 1 applied, 0 lost the race, -1 session gone, -2 finished.
-- The lock is released (if still ours) whatever the outcome.
local function unlock()
  if redis.call('GET', KEYS[5]) == ARGV[10] then redis.call('DEL', KEYS[5]) end
end
local current = redis.call('HGET', KEYS[1], 'seq')
if not current then unlock() return {-1} end
if tonumber(current) ~= tonumber(ARGV[1]) then unlock() return {0} end
if redis.call('HGET', KEYS[1], 'status') == 'finished' then unlock() return {-2} end
redis.call('HSET', KEYS[1], 'seq', ARGV[2], 'piece_sha', ARGV[6], 'state_bytes', ARGV[9])
redis.call('HINCRBY', KEYS[1], 'consumed', ARGV[7])
redis.call('HINCRBY', KEYS[1], 'segments', ARGV[8])
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[5])
redis.call('SET', KEYS[3], ARGV[4], 'EX', ARGV[5])
if ARGV[11] then
  redis.call('RPUSH', KEYS[4], ARGV[11])
  redis.call('HINCRBY', KEYS[1], 'chunk_bytes', string.len(ARGV[11]))
end
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[4], ARGV[5])
unlock()
return {1, redis.call('HGETALL', KEYS[1]), redis.call('PTTL', KEYS[1])}
"""

FINISH_SCRIPT = """
-- KEYS: meta, result, state, chunks, and on one server the live and quota indexes; ARGV: seq it was computed at,
-- result, ttl, session id
-- Returns {outcome, meta fields, meta ttl}: 1 finished now, 2 already finished, 0 a piece came in between,
-- -1 session gone. A finished session only answers again what it stored: its state and chunks are dropped, and
-- it leaves the indexes given.
local current = redis.call('HGET', KEYS[1], 'seq')
if not current then return {-1} end
if tonumber(current) ~= tonumber(ARGV[1]) then return {0} end
local outcome = 2
if redis.call('HGET', KEYS[1], 'status') ~= 'finished' then
  redis.call('HSET', KEYS[1], 'status', 'finished', 'state_bytes', 0, 'chunk_bytes', 0)
  redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
  redis.call('DEL', KEYS[3], KEYS[4])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  outcome = 1
end
for i = 5, #KEYS do redis.call('ZREM', KEYS[i], ARGV[4]) end
return {outcome, redis.call('HGETALL', KEYS[1]), redis.call('PTTL', KEYS[1])}
"""

RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

LIVE_INDEX_SHARDS = 16  # shards of each model's live index on a Redis Cluster (one key on a single server)
RENEWED_PER_CALL = 256  # locks one renewal script call extends (a call of 256 took Redis 0.6 ms here)
WAIT_SECONDS = 60.0  # longest wait behind a live holder that keeps refreshing its lease
FIRST_LOOK_SECONDS = 0.02  # a waiter's first look at a lock another request holds (a quick step has committed)


def new_session_id() -> str:
    """192 random bits, URL-safe, never starting with "-" so a shell or a command line never reads one as an option."""
    while (session_id := secrets.token_urlsafe(24)).startswith("-"):
        pass
    return session_id


class SessionNotFound(LookupError):
    """Unknown, expired, deleted, or owned by another API key (HTTP 404)."""


class SequenceConflict(RuntimeError):
    """Gap, stale or conflicting sequence number (HTTP 409); ``expected`` is the next number to send."""

    def __init__(self, message: str, expected: int) -> None:
        super().__init__(message)
        self.expected = expected


class SessionLimit(RuntimeError):
    """Too many sessions for a key or pieces for a session (HTTP 429); ``retry_after``: seconds until a place frees
    by itself, when one will."""

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SessionFinished(RuntimeError):
    """The session was finished; it takes no more pieces (HTTP 409)."""


@dataclass
class SessionMeta:
    id: str
    model: str
    task: str
    owner: str
    quota: str  # the quota index the session counts in: the owner, or the client address without API keys
    seq: int
    created: float
    deadline: float
    consumed: int
    segments: int
    state_bytes: int  # bounded state + appended chunks
    piece_sha: str
    status: str
    ttl_seconds: float  # remaining (from PTTL: to the millisecond, so expires_at is the same on every read)

    @classmethod
    def from_hash(cls, session_id: str, fields: Mapping[bytes, bytes] | list[bytes], ttl_ms: int) -> SessionMeta:
        """From HGETALL's answer (a mapping (redis-py) or the flat list a Lua script returns) and PTTL's."""
        pairs = fields.items() if isinstance(fields, Mapping) else zip(fields[::2], fields[1::2], strict=True)
        f = {key.decode(): value.decode() for key, value in pairs}
        return cls(
            id=session_id, model=f["model"], task=f["task"], owner=f["owner"], quota=f.get("quota", f["owner"]),
            seq=int(f["seq"]),
            created=float(f["created"]), deadline=float(f["deadline"]), consumed=int(f["consumed"]),
            segments=int(f["segments"]), state_bytes=int(f["state_bytes"]) + int(f.get("chunk_bytes", 0)),
            piece_sha=f.get("piece_sha", ""),
            status=f.get("status", "open"), ttl_seconds=max(int(ttl_ms), 0) / 1000,
        )

    @property
    def expires_at(self) -> float:
        return round(time.time() + self.ttl_seconds, 3)


def piece_digest(piece: Any) -> str:
    """What a retry of a piece is recognised by: the sha256 of the piece as orjson writes it (a twelfth of
    the standard library's time for a forecast's rows)."""
    return hashlib.sha256(orjson.dumps(piece)).hexdigest()


def json_piece_digest(piece: Any) -> str:
    """The sha256 of the piece as the standard library's json writes it: the digest of pieces applied by
    replicas of earlier releases, so that a retry spanning a rolling upgrade is still recognised."""
    return hashlib.sha256(json.dumps(piece, separators=(",", ":")).encode()).hexdigest()


def same_piece(meta_digest: str, digest: str, piece: Any) -> bool:
    """Whether ``piece`` (whose :func:`piece_digest` is ``digest``) is the piece a session recorded as
    ``meta_digest``, by either digest."""
    return bool(meta_digest) and (digest == meta_digest or json_piece_digest(piece) == meta_digest)


class SessionStore:
    def __init__(self, store: StateStore, settings: Settings, metrics: ServiceMetrics) -> None:
        self.store = store
        self.redis = store.client
        self.settings = settings
        self.metrics = metrics
        self._begin = self.redis.register_script(BEGIN_SCRIPT)
        self._commit = self.redis.register_script(COMMIT_SCRIPT)
        self._finish = self.redis.register_script(FINISH_SCRIPT)
        self._release = self.redis.register_script(RELEASE_SCRIPT)
        self._quota = self.redis.register_script(QUOTA_SCRIPT)
        self._create = self.redis.register_script(CREATE_SCRIPT)
        self._refresh = self.redis.register_script(REFRESH_SCRIPT)
        self.lock_ms = max(1, int(settings.session_lock_seconds * 1000))
        self.live_shards = LIVE_INDEX_SHARDS if store.cluster else 1
        self.one_node = not store.cluster  # a script may then touch the indexes too (on a cluster: other slots)
        self._held: dict[tuple[str, str], float] = {}  # (session id, lock token) -> when the lock was taken
        self._keeper: asyncio.Task[None] | None = None

    def _keys(self, session_id: str) -> dict[str, str]:
        return {part: self.store.key(session_id, part) for part in ("meta", "state", "result", "chunks", "lock")}

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

    def _ttl(self, deadline: float) -> int:
        return max(1, min(self.settings.session_ttl_seconds, int(deadline - time.time())))

    async def create(self, model: str, task: str, owner: str, state: Arrays, quota: str | None = None) -> SessionMeta:
        """A new session of ``owner``, counted against the quota of ``quota`` (default: the owner)."""
        quota = quota or owner
        now = time.time()
        deadline = now + self.settings.session_max_lifetime_seconds
        session_id = new_session_id()
        keys = self._keys(session_id)
        blob = encode_tensors(state)
        ttl = self._ttl(deadline)
        fields = {
            "model": model, "task": task, "owner": owner, "quota": quota, "seq": 0, "created": now,
            "deadline": deadline, "consumed": 0, "segments": 0, "state_bytes": len(blob), "piece_sha": "",
            "status": "open",
        }
        limit = self.settings.max_sessions_per_key
        pairs = [str(item) for field in fields.items() for item in field]
        quota_key, live_key = self._owner_key(quota), self._live_key(model, session_id)
        args = [now, limit, session_id, now + ttl, ttl, blob, *pairs]
        try:
            async with self.store.operation(self.metrics.time_redis("create")):
                if self.one_node:  # the reservation, the session and its live-index entry: one script
                    held = await self._evalsha(self._create, [keys["meta"], keys["state"], quota_key, live_key], args)
                else:  # the quota index lives in another slot: reserve, then the session and its index entry
                    held = await self._evalsha(self._quota, [quota_key], args[:4])
                    if int(held[0]) >= 0:
                        await self._script_with(
                            self._create, [keys["meta"], keys["state"]], args,
                            lambda pipe: pipe.zadd(live_key, {session_id: now + ttl})
                            .zremrangebyscore(live_key, "-inf", now),  # prune idle-expired ones
                        )
        except BaseException:
            await self._forget(session_id, quota, model)
            raise
        if int(held[0]) < 0:
            who = "this API key" if quota == owner else "this client address"
            frees_in = max(1, math.ceil(float(held[1]) - now))
            raise SessionLimit(
                f"{who} holds {limit} live sessions, the limit (RTSERVE_MAX_SESSIONS_PER_KEY): a place frees when one "
                f"of them is finished (POST /sessions/{{id}}/finish) or deleted (DELETE /sessions/{{id}}); left idle, "
                f"the next one expires in {frees_in} s", retry_after=frees_in,
            )
        return SessionMeta.from_hash(
            session_id, {k.encode(): str(v).encode() for k, v in fields.items()}, ttl * 1000
        )

    async def _forget(self, session_id: str, quota: str, model: str) -> None:
        """Best effort after a failed create: remove whatever of it may have reached Redis."""
        try:
            async with self.store.operation(), self.redis.pipeline(transaction=False) as pipe:
                pipe.delete(*self._keys(session_id).values())
                pipe.zrem(self._owner_key(quota), session_id).zrem(self._live_key(model, session_id), session_id)
                await pipe.execute()
        except Exception:  # Redis is gone: the reservation lapses with the idle TTL, counted until then
            pass

    async def meta(self, session_id: str, owner: str) -> SessionMeta:
        keys = self._keys(session_id)
        async with self.store.operation(self.metrics.time_redis("meta")):
            async with self.redis.pipeline(transaction=True) as pipe:
                fields, ttl = await pipe.hgetall(keys["meta"]).pttl(keys["meta"]).execute()
        if not fields:
            raise SessionNotFound(f"session {session_id} does not exist or has expired")
        meta = SessionMeta.from_hash(session_id, fields, ttl)
        if meta.owner != owner:
            raise SessionNotFound(f"session {session_id} does not exist or has expired")
        return meta

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
        if not fields:
            raise SessionNotFound(f"session {session_id} does not exist or has expired")
        meta = SessionMeta.from_hash(session_id, fields, ttl)
        if meta.owner != owner or (blob is None and meta.status != "finished"):
            raise SessionNotFound(f"session {session_id} does not exist or has expired")
        decoded = [decode_tensors(chunk) for chunk in chunks[0]] if chunks else []
        return meta, _state(blob), (orjson.loads(result) if result else None), decoded

    async def begin(
        self, session_id: str, owner: str, seq: int
    ) -> tuple[SessionMeta, Arrays, dict[str, Any] | None, str | None]:
        """One round trip: meta and state, plus the session's lock if ``seq`` is the next piece.

        The last result comes back only when ``seq`` is the last applied piece (a retry answers with it).

        The lock token is None when the piece is not the next one (a retry, a gap) or another
        request holds the lock (it is applying this very piece right now).
        """
        keys = self._keys(session_id)
        token = f"{seq}:{secrets.token_hex(8)}"
        async with self.store.operation(self.metrics.time_redis("begin")):
            reply = await self._evalsha(self._begin, [keys["meta"], keys["state"], keys["result"], keys["lock"]],
                                        [seq, owner, token, self.lock_ms])
        if not reply:
            raise SessionNotFound(f"session {session_id} does not exist or has expired")
        fields, ttl, blob, result, locked = reply
        meta = SessionMeta.from_hash(session_id, fields, int(ttl))
        if meta.owner != owner or (blob is None and meta.status != "finished"):
            raise SessionNotFound(f"session {session_id} does not exist or has expired")
        return meta, _state(blob), (orjson.loads(result) if result else None), token if locked else None

    async def release(self, session_id: str, token: str) -> None:
        async with self.store.operation():
            await self._release(keys=[self._keys(session_id)["lock"]], args=[token])

    async def commit(
        self, meta: SessionMeta, seq: int, piece_sha: str, consumed: Consumed, token: str
    ) -> tuple[int, SessionMeta | None]:
        """Apply piece ``seq`` if ``meta.seq`` is still current, release the lock, touch the live index.

        One round trip. Returns (outcome, the session's meta after it): 1 applied, 0 lost the race
        to another replica, -1 session gone, -2 session finished (meta None unless applied).
        """
        keys = self._keys(meta.id)
        state_blob = encode_tensors(consumed.state)
        args: list[Any] = [
            meta.seq, seq, state_blob, orjson.dumps(consumed.result), self._ttl(meta.deadline), piece_sha,
            consumed.units_read, consumed.segments, len(state_blob), token,
        ]
        if consumed.chunk:
            args.append(encode_tensors(consumed.chunk))
        commit_keys = [keys["meta"], keys["state"], keys["result"], keys["chunks"], keys["lock"]]
        idle_expiry = time.time() + self._ttl(meta.deadline)
        async with self.store.operation(self.metrics.time_redis("commit")):
            # the live index sits outside the session's hash slot: its own command, in the same round trip
            reply = await self._script_with(
                self._commit, commit_keys, args,
                lambda pipe: pipe.zadd(self._live_key(meta.model, meta.id), {meta.id: idle_expiry}, xx=True)
                .zadd(self._owner_key(meta.quota), {meta.id: idle_expiry}, xx=True),
            )
        outcome = int(reply[0])
        return outcome, (SessionMeta.from_hash(meta.id, reply[1], int(reply[2])) if outcome == 1 else None)

    async def finish(self, meta: SessionMeta, result: Mapping[str, Any]) -> tuple[int, SessionMeta | None]:
        """Mark the session finished with its final result (dropping its state), then take it out of the live
        index and its quota: a finished session no longer counts against its key.

        Returns (outcome, its meta after it): 1 finished now, 2 already finished, 0 a piece came in
        between, -1 session gone (meta None for the last two).
        """
        keys = self._keys(meta.id)
        indexes = [self._live_key(meta.model, meta.id), self._owner_key(meta.quota)]
        script_keys = [keys["meta"], keys["result"], keys["state"], keys["chunks"]]
        args = [meta.seq, orjson.dumps(result), self._ttl(meta.deadline), meta.id]
        async with self.store.operation(self.metrics.time_redis("finish")):
            reply = await self._evalsha(self._finish, script_keys + indexes if self.one_node else script_keys, args)
            outcome = int(reply[0])
            if outcome in (1, 2) and not self.one_node:  # the indexes live in other slots: once it finished
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.zrem(indexes[0], meta.id).zrem(indexes[1], meta.id)
                    await pipe.execute()
        return outcome, (SessionMeta.from_hash(meta.id, reply[1], int(reply[2])) if outcome in (1, 2) else None)

    async def _evalsha(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """``script(keys=..., args=...)`` without redis-py's script object in between (its type checks cost more
        than the command); a script Redis lost (a restart) is loaded again."""
        try:
            return await self.redis.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self.redis.script_load(script.script)
            return await self.redis.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)

    async def _script_with(self, script: Any, keys: list[str], args: list[Any], also: Callable[[Any], Any]) -> Any:
        """EVALSHA ``script`` plus the commands ``also`` queues, in one round trip; reloads a script Redis lost.

        On a cluster the pipeline splits by node and the nodes are sent to in parallel (redis-py blocks the
        ``evalsha`` method in cluster pipelines, not the command: the script's keys share one slot).
        """
        replies = await self._pipelined(script, [(keys, args)], also)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies[0]

    async def _pipelined(self, script: Any, calls: list[tuple[list[str], list[Any]]],
                         also: Callable[[Any], Any] | None = None) -> list[Any]:
        """One EVALSHA of ``script`` per (keys, args) of ``calls``, then the commands ``also`` queues, all in one
        round trip; every reply, an error as an exception. A script Redis lost (a restart) is loaded again."""
        for attempt in range(2):
            async with self.redis.pipeline(transaction=False) as pipe:
                for keys, args in calls:
                    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
                if also is not None:
                    also(pipe)
                replies = await pipe.execute(raise_on_error=False)
            if attempt == 0 and any(isinstance(reply, NoScriptError) for reply in replies[: len(calls)]):
                await self.redis.script_load(script.script)
                continue
            return replies
        raise AssertionError("unreachable: the second attempt returns")

    async def delete(self, meta: SessionMeta) -> None:
        """Drop the session of ``meta`` (read by :meth:`meta`, which refuses strangers) and its index entries."""
        async with self.store.operation(self.metrics.time_redis("delete")):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.delete(*self._keys(meta.id).values())
                pipe.zrem(self._owner_key(meta.quota), meta.id).zrem(self._live_key(meta.model, meta.id), meta.id)
                await pipe.execute()

    async def refresh(self, held: list[tuple[str, str]]) -> list[bool | None]:
        """Extend the leases of these (session id, lock token) locks, all in one round trip: per lock True
        (renewed), False (no longer ours) or None (Redis failed it; try again later)."""
        if not held:
            return []
        # one script call per RENEWED_PER_CALL locks; on a cluster, one per lock (the locks live in different slots)
        size = 1 if self.store.cluster else RENEWED_PER_CALL
        groups = [held[i : i + size] for i in range(0, len(held), size)]
        calls = [([self.store.key(session_id, "lock") for session_id, _ in group],
                  [*(token for _, token in group), self.lock_ms]) for group in groups]
        async with self.store.operation():
            replies = await self._pipelined(self._refresh, calls)
        renewed: list[bool | None] = []
        for group, reply in zip(groups, replies, strict=True):
            renewed += [None] * len(group) if isinstance(reply, Exception) else [bool(ours) for ours in reply]
        return renewed

    @asynccontextmanager
    async def holding(self, session_id: str, token: str) -> AsyncIterator[None]:
        """Keep the lock's lease alive while the body runs (a step may outlast one lease).

        One keeper task per store renews every lock held for a third of a lease or more, a third of a lease
        apart, in one round trip (:meth:`_keep`), so holding a lock costs a dictionary entry, not a task or a
        round trip per piece: a lock is renewed between a third and two thirds of a lease after it was taken,
        and as often after that.
        """
        key = (session_id, token)
        self._held[key] = time.monotonic()
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(self._keep())
        try:
            yield
        finally:
            self._held.pop(key, None)

    async def _keep(self) -> None:
        """Renew the locks held for a third of a lease or more, every third of a lease; ends after a lease with
        none held (:meth:`holding` starts it again)."""
        beat, idle = self.lock_ms / 3000, 0
        while idle < 3:
            await asyncio.sleep(beat)
            due = [key for key, since in self._held.items() if time.monotonic() - since >= beat]
            idle = 0 if self._held else idle + 1
            try:
                renewed = await self.refresh(due)
            except Exception:  # StateStoreUnavailable, or any other error: try again at the next beat
                continue
            for key, ours in zip(due, renewed, strict=True):
                if ours is False:  # lost it: the commit's compare-and-set still decides
                    self._held.pop(key, None)

    async def close(self) -> None:
        """Stop the lock keeper (the app's shutdown)."""
        if self._keeper is not None:
            self._keeper.cancel()
            try:
                await self._keeper
            except asyncio.CancelledError:
                pass

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


def _state(blob: bytes | None) -> Arrays:
    """The stored state; none for a finished session, which only answers again what it stored."""
    return decode_tensors(blob) if blob is not None else {}
