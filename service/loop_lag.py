"""How far the event loop runs behind: a ticker that should wake every ``interval`` seconds, and how late it woke.

A callback that is ready waits for every callback queued before it; under a burst that wait is the loop's lag,
and it falls on everything the loop does, a Redis reply that has arrived included. :class:`LoopLag` sums the
ticker's lateness, so that a deadline can leave out the time the loop itself was behind
(:class:`service.state_store.Operation`: a Redis operation is cut off for Redis's slowness, not the service's
own), and hands each lateness to a histogram (``rtserve_event_loop_lag_seconds``).

The ticker is one timer callback, not a task: 40 wake-ups a second cost a few microseconds each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

TICK_SECONDS = 0.025


class LoopLag:
    """``start()`` on the running loop; :meth:`seconds_behind` is then the loop's lag summed since, the lateness of
    the tick now due included (it grows while the loop is stuck, before the tick runs)."""

    __slots__ = ("interval", "observe", "_behind", "_due", "_handle", "_loop")

    def __init__(self, interval: float = TICK_SECONDS, observe: Callable[[float], None] | None = None) -> None:
        self.interval = interval
        self.observe = observe  # each tick's lateness (0 when on time), e.g. a histogram's observe
        self._behind = 0.0
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._due = self._loop.time() + self.interval
        self._handle = self._loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        late = max(0.0, now - self._due)
        self._behind += late
        if self.observe is not None:
            self.observe(late)
        self._due = now + self.interval
        self._handle = self._loop.call_at(self._due, self._tick)

    def seconds_behind(self) -> float:
        """Seconds the loop has run behind since :meth:`start`; once stopped, the lateness summed until then."""
        if self._handle is None or self._loop is None:
            return self._behind
        return self._behind + max(0.0, self._loop.time() - self._due)
