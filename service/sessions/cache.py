"""The sessions this replica applied the last piece of, kept in memory with the state that piece left.

The next piece of such a session is computed from the kept state and committed with the usual compare-and-set on
the session's ``seq`` and incarnation (:mod:`service.sessions.scripts`): no read of the session before it, so a piece
costs one round trip to Redis instead of two. Its finish, likewise, computes the final result from the kept state and
the last piece's result, and the finish script's compare-and-set on the same ``seq`` and incarnation decides (one
round trip instead of two; a session with appended chunks is read, as its chunks are not kept). Nothing is trusted
that the commit does not check: if another replica (or an HTTP piece beside a stream) applied a piece meanwhile, or
the session was finished, deleted or restarted, the commit writes nothing and answers so, and the piece (or the
finish) is applied from a fresh read, exactly as without the cache.

The kept states are bounded in bytes (``RTSERVE_STATE_CACHE_BYTES``): past it, the least recently used are dropped
(they are read back from Redis at their next piece). A session stream pins its session's entry while it is open.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from service.sessions.meta import SessionMeta, SessionStatus


@dataclass
class Kept:
    meta: SessionMeta  # after the last piece this replica applied
    state: dict[str, np.ndarray]  # the bounded state that piece left (what Redis holds for meta.seq)
    indexes_touched: float  # time.time() at which this replica last moved the session's index entries
    result_json: bytes | None  # the last piece's result as Redis holds it (None: no piece yet)
    pins: int = 0  # open streams holding the entry
    nbytes: int = field(init=False)  # the state's bytes, counted against the cache's bound

    def __post_init__(self) -> None:
        self.nbytes = sum(array.nbytes for array in self.state.values())

    def finishable_by(self, owner: str) -> bool:
        """Whether a finish by ``owner`` may start from what is kept: an open session of its own with no appended
        chunks (those are not kept)."""
        return self.meta.owner == owner and self.meta.status is SessionStatus.OPEN and not self.meta.chunk_bytes

    def last_result(self) -> dict[str, Any] | None:
        """The last piece's result, read from its JSON as a read from Redis would give it."""
        return orjson.loads(self.result_json) if self.result_json is not None else None


class StateCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, session_id: str) -> Kept | None:
        kept = self._kept.get(session_id)
        if kept is not None:
            self._kept.move_to_end(session_id)
        return kept

    def keep(self, session_id: str, kept: Kept) -> None:
        """Keep ``kept`` for the session (replacing what was kept), then drop the least recently used unpinned
        entries while over the bound."""
        if self.max_bytes <= 0:
            return
        old = self._kept.pop(session_id, None)
        if old is not None:
            self._bytes -= old.nbytes
            kept.pins = old.pins
        self._kept[session_id] = kept
        self._bytes += kept.nbytes
        if self._bytes > self.max_bytes:
            for candidate in list(self._kept):
                if self._bytes <= self.max_bytes:
                    break
                if self._kept[candidate].pins == 0 and candidate != session_id:
                    self._bytes -= self._kept.pop(candidate).nbytes

    def drop(self, session_id: str) -> None:
        kept = self._kept.pop(session_id, None)
        if kept is not None:
            self._bytes -= kept.nbytes

    def pin(self, session_id: str) -> None:
        kept = self._kept.get(session_id)
        if kept is not None:
            kept.pins += 1

    def unpin(self, session_id: str) -> None:
        kept = self._kept.get(session_id)
        if kept is not None and kept.pins > 0:
            kept.pins -= 1
