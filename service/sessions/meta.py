"""A session as Redis holds it: its id, its keys, and its ``meta`` hash read into :class:`SessionMeta`."""

from __future__ import annotations

import enum
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass


class SessionStatus(enum.StrEnum):
    OPEN = "open"  # takes pieces
    FINISHED = "finished"  # answers its stored final result only, for the idle TTL


def new_session_id() -> str:
    """192 random bits, URL-safe, never starting with "-" so a shell or a command line never reads one as an option."""
    while (session_id := secrets.token_urlsafe(24)).startswith("-"):
        pass
    return session_id


def new_epoch() -> str:
    """A session's incarnation: a restarted session (same id, created again) has another, so that no state computed
    for the earlier one is ever committed to, or read back for, the new one."""
    return secrets.token_hex(6)


PARTS = ("meta", "state", "result", "chunks", "lock")


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
    status: SessionStatus
    expires: float  # when the session expires if left idle, epoch seconds (from PTTL, to the millisecond)
    epoch: str = ""  # the incarnation (sessions written by earlier releases have none)
    chunk_bytes: int = 0  # of state_bytes, the appended chunks

    @classmethod
    def from_hash(cls, session_id: str, fields: Mapping[bytes, bytes] | list[bytes], ttl_ms: int) -> SessionMeta:
        """From HGETALL's answer (a mapping (redis-py) or the flat list a Lua script returns) and PTTL's."""
        pairs = fields.items() if isinstance(fields, Mapping) else zip(fields[::2], fields[1::2], strict=True)
        f = {key.decode(): value.decode() for key, value in pairs}
        chunk_bytes = int(f.get("chunk_bytes", 0))
        return cls(
            id=session_id, model=f["model"], task=f["task"], owner=f["owner"], quota=f.get("quota", f["owner"]),
            seq=int(f["seq"]), created=float(f["created"]), deadline=float(f["deadline"]),
            consumed=int(f["consumed"]), segments=int(f["segments"]),
            state_bytes=int(f["state_bytes"]) + chunk_bytes, piece_sha=f.get("piece_sha", ""),
            status=SessionStatus(f.get("status", "open")), expires=time.time() + max(int(ttl_ms), 0) / 1000,
            epoch=f.get("epoch", ""), chunk_bytes=chunk_bytes,
        )

    @property
    def expires_at(self) -> float:
        return round(self.expires, 3)

    def after_piece(self, seq: int, piece_sha: str, units_read: int, segments: int, state_bytes: int,
                    chunk_bytes: int, ttl_seconds: float) -> SessionMeta:
        """The meta a commit of piece ``seq`` wrote (it applied only if this meta was current: compare-and-set)."""
        chunks = self.chunk_bytes + chunk_bytes
        return SessionMeta(self.id, self.model, self.task, self.owner, self.quota, seq, self.created, self.deadline,
                           self.consumed + units_read, self.segments + segments, state_bytes + chunks, piece_sha,
                           self.status, time.time() + ttl_seconds, self.epoch, chunks)
