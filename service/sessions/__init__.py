"""Sessions: long inputs sent piece by piece, the recurrent state in Redis.

Keys of one session share one hash slot (``<prefix>:{<id>}:...``):

- ``meta``   hash: model, task, owner, quota (the index it counts in), seq (last applied), created, deadline,
             consumed, segments, state_bytes (bounded state), chunk_bytes (appended state), piece_sha (hash of
             the last applied piece), status (open | finished), epoch (the incarnation: a session created again
             under the same id has another)
- ``state``  safetensors bytes of the bounded state (dropped at finish)
- ``result`` JSON of the result of the last applied piece (returned again on a retry); after finish, the final one
- ``chunks`` list of safetensors blobs, append-only (state that grows, e.g. SRformer's per-window keys/values;
             dropped at finish)
- ``lock``   the lease of the replica applying the next piece or holding the session's stream
             (:mod:`service.sessions.lease`)

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

Finishing takes the session out of both indexes (its place in the quota frees at once) and drops its
state: a finished session only answers again what it stored, for the idle TTL. Idle sessions expire after
the TTL; none outlives its maximum lifetime.

A piece is applied exactly once: the commit is one Lua script that checks the session is still at the
sequence number (and incarnation) the piece was computed from (compare-and-set) and writes state, result
and chunk together or not at all. A piece of a session this replica applied the last piece of is computed
from the state it kept (:mod:`service.sessions.cache`) and costs one round trip, its commit, sent with the
other commits of its batch (:mod:`service.sessions.commits`); any other costs two, ``BEGIN`` (meta, state
and the session's lock) and the commit. A retry costs one.

Modules: :mod:`~service.sessions.meta` (ids, keys, the meta hash), :mod:`~service.sessions.scripts` (the
scripts and their outcomes), :mod:`~service.sessions.errors`, :mod:`~service.sessions.lease`,
:mod:`~service.sessions.commits`, :mod:`~service.sessions.cache`, :mod:`~service.sessions.digest` and
:mod:`~service.sessions.store` (every read and write).
"""

from service.sessions.errors import (
    LostRace,
    SequenceConflict,
    SessionError,
    SessionFinished,
    SessionLimit,
    SessionNotFound,
)
from service.sessions.meta import SessionMeta, SessionStatus
from service.sessions.store import LIVE_INDEX_SHARDS, Begun, Piece, SessionStore

__all__ = [
    "LIVE_INDEX_SHARDS", "Begun", "LostRace", "Piece", "SequenceConflict", "SessionError", "SessionFinished",
    "SessionLimit", "SessionMeta", "SessionNotFound", "SessionStatus", "SessionStore",
]
