"""What a session operation can end in besides success, as exceptions with names (redis-py's ``Lock`` habit: a
script's ``0`` becomes ``LockNotOwnedError``, never a bare integer another module must decode).

Each error may carry ``model_ref``, the ``name:version`` of the session's model, once the session was read: the
request metrics and the access log name the model of a refused piece too.
"""

from __future__ import annotations


class SessionError(Exception):
    """A session operation that did not happen as asked; ``model_ref`` once the session's model is known."""

    model_ref: str | None = None


class SessionNotFound(SessionError, LookupError):
    """Unknown, expired, deleted, or owned by another API key (HTTP 404)."""


class SequenceConflict(SessionError):
    """Gap, stale or conflicting sequence number (HTTP 409); ``expected`` is the next number to send."""

    def __init__(self, message: str, expected: int) -> None:
        super().__init__(message)
        self.expected = expected


class SessionLimit(SessionError):
    """Too many sessions for a key or pieces for a session (HTTP 429); ``retry_after``: seconds until a place frees
    by itself, when one will."""

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SessionFinished(SessionError):
    """The session was finished; it takes no more pieces (HTTP 409)."""


class LostRace(SessionError):
    """A compare-and-set found the session moved on since it was read (another request applied a piece, or the
    session was restarted): nothing was written; read it again and decide anew."""


class QuotaFull(SessionError):
    """The quota index holds its limit of live sessions; ``earliest_expiry``: when the first of them idles out
    (epoch seconds)."""

    def __init__(self, earliest_expiry: float) -> None:
        super().__init__(f"quota full until {earliest_expiry}")
        self.earliest_expiry = earliest_expiry
