"""Commits in batches: the pieces that finish in one turn of the event loop commit in one round trip to Redis.

The pieces of one batched step (the sessions whose rows the batcher stacked) get their outputs at the same moment,
so their commits are asked for in the same turn of the loop. :class:`CommitQueue` holds each commit asked for until
the end of that turn, then sends them all in one round trip (:meth:`StateStore.round_trip`: one write, the replies
read in order), not one per piece. On a Redis Cluster they go through redis-py's cluster pipeline, split by node and
sent to the nodes in parallel, so the commits are grouped by node. Each commit is still its own script call: it
succeeds or fails on its own (a lost race in a batch fails only that piece, as does a commit Redis refuses), and each
caller gets its own outcome. (One script call carrying a whole batch, on one server, measured no cheaper for the
service or for Redis: what a commit costs is its bytes, the state and the result, more than its command.)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import NoScriptError

from service.metrics import ServiceMetrics
from service.state_store import StateStore


@dataclass(eq=False)
class Commit:
    keys: list[str]
    args: list[Any]
    companions: list[tuple[Any, ...]]  # commands sent with it (a cluster's index touches, in other slots)
    done: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class CommitQueue:
    def __init__(self, store: StateStore, script: Any, metrics: ServiceMetrics) -> None:
        """``script``: the registered COMMIT script (its ``sha`` and ``script``)."""
        self.store, self.script, self.metrics = store, script, metrics
        self._waiting: list[Commit] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def commit(self, keys: list[str], args: list[Any], companions: list[tuple[Any, ...]] | None = None) -> Any:
        """The script's reply to this commit (an error Redis answered for it comes back as the exception, for the
        decoder), sent with every other commit asked for in this turn of the loop."""
        commit = Commit(keys, args, companions or [])
        if not self._waiting:
            asyncio.get_running_loop().call_soon(self._send_waiting)
        self._waiting.append(commit)
        return await commit.done

    def _send_waiting(self) -> None:
        batch, self._waiting = self._waiting, []
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[Commit]) -> None:
        try:
            async with self.store.operation(self.metrics.time_redis("commit")):
                replies = await self._round_trip(batch)
        except BaseException as error:  # the round trip failed as a whole: every commit's outcome is unknown
            for commit in batch:
                if not commit.done.done():
                    commit.done.set_exception(error)
            if not isinstance(error, Exception):
                raise
            return
        for commit, reply in zip(batch, replies, strict=True):
            if not commit.done.done():
                commit.done.set_result(reply)

    async def _round_trip(self, batch: list[Commit]) -> list[Any]:
        """One round trip: each commit's script call and companions; the script's reply per commit. A script Redis
        lost (a restart) is loaded again and only the calls it refused are sent again (they did not run)."""
        replies: list[Any] = [None] * len(batch)
        todo = list(range(len(batch)))
        for attempt in range(2):
            commands: list[tuple[Any, ...]] = []
            for index in todo:
                commit = batch[index]
                commands.append(("EVALSHA", self.script.sha, len(commit.keys), *commit.keys, *commit.args))
                commands.extend(commit.companions)
            answers = await self.store.round_trip(commands)
            refused: list[int] = []
            position = 0
            for index in todo:
                reply = answers[position]
                position += 1 + len(batch[index].companions)
                if isinstance(reply, NoScriptError) and attempt == 0:
                    refused.append(index)
                else:
                    replies[index] = reply
            if not refused:
                break
            await self.store.client.script_load(self.script.script)
            todo = refused
        return replies
