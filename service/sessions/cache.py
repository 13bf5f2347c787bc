"""The sessions this replica applied the last piece of, kept in memory with the state that piece left.

The next piece of such a session is computed from the kept state and committed with the usual compare-and-set on
the session's ``seq`` and incarnation (:mod:`service.sessions.scripts`): no read of the session before it, so a piece
costs one round trip to Redis instead of two. Nothing is trusted that the commit does not check: if another replica
(or an HTTP piece beside a stream) applied a piece meanwhile, or the session was finished, deleted or restarted, the
commit writes nothing and answers so, and the piece is applied from a fresh read, exactly as without the cache.

The kept states are bounded in bytes (``RTSERVE_STATE_CACHE_BYTES``): past it, the least recently used are dropped
(they are read back from Redis at their next piece). A session stream pins its session's entry while it is open.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from service.sessions.meta import SessionMeta


@dataclass
class Kept:
    meta: SessionMeta  # after the last piece this replica applied
    state: dict[str, np.ndarray]  # the bounded state that piece left (what Redis holds for meta.seq)
    indexes_touched: float  # time.time() at which this replica last moved the session's index entries
    pins: int = 0  # open streams holding the entry
    nbytes: int = field(init=False)  # the state's bytes, counted against the cache's bound

    def __post_init__(self) -> None:
        self.nbytes = sum(array.nbytes for array in self.state.values())


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
