"""The Lua scripts that change a session, each followed by the function that decodes its reply into a named outcome.

A script touches the keys of one hash slot only on a Redis Cluster (the session's own, or one quota index); on one
server the create, commit and finish scripts also move the session's index entries (given as extra keys), which
saves a round trip each. No caller outside this module reads a script's integers: a reply is a value (the session's
meta, a count) or one of the exceptions of :mod:`service.sessions.errors`.
"""

from __future__ import annotations

from typing import Any

from service.sessions.errors import LostRace, QuotaFull, SessionFinished, SessionNotFound
from service.sessions.meta import SessionMeta

# ---- the quota's reservation ---------------------------------------------------------------------------------
# Shared by QUOTA, CREATE and CREATE_AGAIN (ARGV: now, limit, session id, idle expiry). It counts the members not yet
# idle-expired, less the session itself (created again under its id: a restarted sequence); when limit or more, it
# returns -1 and the earliest idle expiry among them, having written nothing. Otherwise it adds the session, drops
# the expired members and returns the count. The add is the first write: Redis checks maxmemory at a script's first
# write only, so a full Redis refuses the script before it writes anything (a prune first would let the later writes
# through).
RESERVE_LUA = """
local function reserve(quota)
  local count = redis.call('ZCOUNT', quota, '(' .. ARGV[1], '+inf')
  local own = redis.call('ZSCORE', quota, ARGV[3])  -- a session created again under its id holds its place already
  if own and tonumber(own) > tonumber(ARGV[1]) then count = count - 1 end
  if count >= tonumber(ARGV[2]) then
    return -1, redis.call('ZRANGEBYSCORE', quota, '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, 1)[2]
  end
  redis.call('ZADD', quota, ARGV[4], ARGV[3])
  redis.call('ZREMRANGEBYSCORE', quota, '-inf', ARGV[1])
  return count
end
"""

QUOTA = RESERVE_LUA + """
-- KEYS: the quota index. Returns {the count of live members before}, or {-1, the earliest idle expiry} when full.
local count, earliest = reserve(KEYS[1])
if count < 0 then return {-1, earliest} end
return {count}
"""

# ---- creating a session ----------------------------------------------------------------------------------------
# Shared by CREATE and CREATE_AGAIN (KEYS[1], KEYS[2]: meta, state; ARGV: now, limit, session id, idle expiry, ttl,
# state, then the meta hash as field, value pairs). With the indexes (quota and live, on one server): the reservation
# first (a full quota returns {-1, its earliest idle expiry} and writes nothing), then the session, then its
# live-index entry (pruning idle-expired ones). The keys given after live are deleted once the session has its place.
# Returns {the quota's count before} ({0} without the indexes).
CREATE_LUA = RESERVE_LUA + """
local function create(quota, live, ...)
  local count = 0
  if quota then
    local earliest
    count, earliest = reserve(quota)
    if count < 0 then return {-1, earliest} end
  end
  if select('#', ...) > 0 then redis.call('DEL', ...) end
  redis.call('HSET', KEYS[1], unpack(ARGV, 7))
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  redis.call('SET', KEYS[2], ARGV[6], 'EX', ARGV[5])
  if live then
    redis.call('ZADD', live, ARGV[4], ARGV[3])
    redis.call('ZREMRANGEBYSCORE', live, '-inf', ARGV[1])
  end
  return {count}
end
"""

CREATE = CREATE_LUA + """
-- KEYS: meta, state, and on one server the quota and live indexes; ARGV: as create's.
return create(KEYS[3], KEYS[4])
"""

CREATE_AGAIN = CREATE_LUA + """
-- CREATE for a session created under an id of the caller's (a KServe v2 sequence id): a session already there under
-- that id is replaced, in the same script, by the new incarnation (its own epoch, seq 0). KEYS: meta, state, result,
-- chunks, lock, and on one server the quota and live indexes; ARGV: as create's. What the earlier incarnation left
-- (meta fields, last result, chunks, a piece's lock) is dropped, so nothing of it is read back for the new one; a
-- piece of it still in flight finds another epoch at its commit and writes nothing.
return create(KEYS[6], KEYS[7], KEYS[1], KEYS[3], KEYS[4], KEYS[5])
"""


def reserved(reply: list[Any]) -> int:
    """The quota's count before this session (QUOTA, CREATE, CREATE_AGAIN); :class:`QuotaFull` when it holds its
    limit."""
    if int(reply[0]) < 0:
        raise QuotaFull(float(reply[1]))
    return int(reply[0])


# ---- reading a piece's session ----------------------------------------------------------------------------------
# ---- a piece's lock -----------------------------------------------------------------------------------------
# Shared by BEGIN and the lease's TAKE: take_lock(key, token, ms) takes the lock if free (LOCK_TAKEN), else says who
# holds it: a session stream (LOCK_STREAM) or another piece's request (LOCK_HELD).
TAKE_LOCK_LUA = """
local function take_lock(key, token, ms)
  if redis.call('SET', key, token, 'NX', 'PX', ms) then return 1 end
  local holder = redis.call('GET', key)
  if holder and string.sub(holder, 1, 7) == 'stream:' then return 2 end
  return 0
end
"""

LOCK_TAKEN, LOCK_HELD, LOCK_STREAM, NOT_NEXT = 1, 0, 2, 3  # take_lock's values (and BEGIN's NOT_NEXT)

BEGIN = TAKE_LOCK_LUA + """
-- KEYS: meta, state, result, lock; ARGV: seq to apply, owner, lock token, lock milliseconds
-- Returns {} when the session is gone, else {meta fields, meta ttl, state, result, lock}. The state comes back
-- only when the piece is the next one (it is computed from it); the stored result only for a retry of the last
-- applied piece (the one case that answers with it). lock: 1 taken for this piece, 0 held by another piece's
-- request, 2 held by a session stream (its replica applies pieces as they come: a piece sent over HTTP meanwhile
-- goes ahead, and the compare-and-set of the commits orders the two), 3 not the next piece (nothing taken).
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then return {} end
local meta = {}
for i = 1, #fields, 2 do meta[fields[i]] = fields[i + 1] end
local seq, applied = tonumber(ARGV[1]), tonumber(meta['seq'])
local lock, state, result = 3, false, false
if meta['owner'] == ARGV[2] and meta['status'] ~= 'finished' and seq == applied + 1 then
  state = redis.call('GET', KEYS[2])
  lock = take_lock(KEYS[4], ARGV[3], ARGV[4])
end
if seq == applied then result = redis.call('GET', KEYS[3]) end
return {fields, redis.call('PTTL', KEYS[1]), state, result, lock}
"""



def begun(session_id: str, reply: list[Any]) -> tuple[SessionMeta, bytes | None, bytes | None, bool, bool]:
    """BEGIN's reply: (meta, state, last result, whether the lock was taken for this piece, whether another
    request is applying this very piece now). :class:`SessionNotFound` when the session is gone."""
    if not reply:
        raise SessionNotFound(f"session {session_id} does not exist or has expired")
    fields, ttl, state, result, lock = reply
    meta = SessionMeta.from_hash(session_id, fields, int(ttl))
    return meta, state, result, int(lock) == LOCK_TAKEN, int(lock) == LOCK_HELD


# ---- committing a piece -----------------------------------------------------------------------------------------
COMMIT = """
-- KEYS: meta, state, result, chunks, lock, and on one server (when ARGV[12] is set) the live and quota indexes
-- ARGV: expected seq, new seq, state, result, ttl, piece sha, tokens or rows read in all, segments in all, state
--       bytes, lock token (empty: none held), epoch, the indexes' new score (empty: leave them), session id, whether
--       the session has chunks ('1' or empty), chunk (optional: appended)
-- Returns {1} applied, {0} lost the race (the seq or the incarnation moved on), {-1} gone, {-2} finished. The lock
-- is released (if still ours) whatever the outcome. The totals are written as they are: the compare-and-set on seq
-- and epoch guarantees the caller's were read (or derived) at this very seq.
local function unlock()
  if ARGV[10] ~= '' and redis.call('GET', KEYS[5]) == ARGV[10] then redis.call('DEL', KEYS[5]) end
end
local current = redis.call('HMGET', KEYS[1], 'seq', 'status', 'epoch')
if not current[1] then unlock() return {-1} end
if tonumber(current[1]) ~= tonumber(ARGV[1]) or (current[3] or '') ~= ARGV[11] then unlock() return {0} end
if current[2] == 'finished' then unlock() return {-2} end
redis.call('HSET', KEYS[1], 'seq', ARGV[2], 'piece_sha', ARGV[6], 'state_bytes', ARGV[9], 'consumed', ARGV[7],
           'segments', ARGV[8])
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[5])
redis.call('SET', KEYS[3], ARGV[4], 'EX', ARGV[5])
if ARGV[15] then
  redis.call('RPUSH', KEYS[4], ARGV[15])
  redis.call('HINCRBY', KEYS[1], 'chunk_bytes', string.len(ARGV[15]))
end
if ARGV[15] or ARGV[14] ~= '' then redis.call('EXPIRE', KEYS[4], ARGV[5]) end
redis.call('EXPIRE', KEYS[1], ARGV[5])
unlock()
if ARGV[12] ~= '' then
  for i = 6, #KEYS do redis.call('ZADD', KEYS[i], 'XX', ARGV[12], ARGV[13]) end
end
return {1}
"""


def committed(session_id: str, reply: Any) -> None:
    """COMMIT's reply: nothing when applied; else :class:`LostRace`, :class:`SessionNotFound` or
    :class:`SessionFinished`."""
    outcome = int(reply[0])
    if outcome == 1:
        return
    if outcome == 0:
        raise LostRace(f"session {session_id} moved on while the piece was computed")
    if outcome == -1:
        raise SessionNotFound(f"session {session_id} expired while the piece was applied")
    raise SessionFinished(f"session {session_id} is finished; start a new session")


# ---- finishing -----------------------------------------------------------------------------------------------
FINISH = """
-- KEYS: meta, result, state, chunks, and on one server the live and quota indexes; ARGV: seq it was computed at,
-- result, ttl, session id, the incarnation (epoch) it was computed in
-- Returns {outcome, meta fields, meta ttl}: 1 finished now, 2 already finished, 0 a piece came in between (or the
-- session was started again), -1 session gone. A finished session only answers again what it stored: its state and
-- chunks are dropped, and it leaves the indexes given.
local current = redis.call('HMGET', KEYS[1], 'seq', 'epoch')
if not current[1] then return {-1} end
if tonumber(current[1]) ~= tonumber(ARGV[1]) or (current[2] or '') ~= ARGV[5] then return {0} end
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


def finished(session_id: str, reply: list[Any], only_now: bool = False) -> SessionMeta:
    """FINISH's reply: the session's meta once finished (now or before; with ``only_now``, before is a
    :class:`LostRace` too); :class:`LostRace` when a piece came in between, :class:`SessionNotFound` when the session
    is gone."""
    outcome = int(reply[0])
    if outcome == 0:
        raise LostRace(f"a piece of session {session_id} arrived while it was finishing")
    if outcome == 2 and only_now:
        raise LostRace(f"session {session_id} was finished by another request")
    if outcome == -1:
        raise SessionNotFound(f"session {session_id} expired while finishing")
    return SessionMeta.from_hash(session_id, reply[1], int(reply[2]))
