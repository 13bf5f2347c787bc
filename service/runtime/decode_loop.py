"""Continuous batching of autoregressive decoding across documents, knowing nothing about the family.

A decode graph (the manifest's ``decode_step``) keeps this contract:

- inputs ``token`` (B,) and ``t`` (B,): each row's last token and its own step number;
- state inputs, each returned as its next value under the name in ``state_outputs``;
- every other input is fixed for the whole search of a document (its encoder memory, its
  candidate vocabulary ...);
- an output ``logp`` (B, V): log-probabilities over the row's candidate ids;
- ``axis_masks``: for a symbolic axis, the bool input that marks each row's own positions on it.
  Rows whose extents differ (documents of different lengths, vocabularies, decode positions)
  share a batch, zero-padded at the end of that axis; the graph never reads a masked position.

:class:`DecodeLoop` keeps every live search of one model in one resident batch and runs one step
of all of them per call: a search joins at the next step after it arrives and leaves when it is
done, so documents at different positions, of different lengths, from one-shot requests and from
sessions share every step. The state never leaves the batch between steps, and re-forming the batch when rows
change costs what changed, not the whole batch (a document's fixed inputs are megabytes: its encoder
keys and values; copying all of them at every join and leave was most of the loop's own time):

- a search that leaves frees its rows; the rows at the end of the batch move into the holes (one row
  copied per row freed) and the arrays are cut to the live rows, a view: rows are independent, so a
  search's rows need not be contiguous nor in order;
- arrivals are appended, the batch so far copied once with them into arrays padded to the new
  longest extents;
- padding is cut only when it has become a quarter of an axis or more: a padded axis (a source, a
  vocabulary) when its longest live member left, the self-attention cache's steps when the rows that
  had the longest history left (each row's own positions are moved to the front first).

Between re-forms the fixed inputs are the very same arrays at every step, and every change makes new
ones (a new array, or a view): the backend is told so (``keep``), and on a GPU copies them to the
device once per re-form instead of at every step (:class:`~service.runtime.backends.DeviceCopies`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from models.decoding import Search
from service.metrics import ServiceMetrics
from service.runtime.backends import Backend
from service.runtime.batching import BatchingPolicy, ContinuousBatching
from service.runtime.graph_runner import GraphRunner

Arrays = dict[str, np.ndarray]


@dataclass(eq=False)
class _Member:
    search: Search
    fixed: Arrays  # inputs fixed for this document, search.rows rows, unpadded
    state: Arrays  # state inputs before its first step, search.rows rows
    future: asyncio.Future[list[int]]
    enqueued: float = field(default_factory=time.perf_counter)
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # its rows in the batch, in its order


def stack_padded(parts: list[np.ndarray]) -> np.ndarray:
    """Concatenate along the batch axis, each part zero-padded (False for bool) at the end of every other
    axis to the largest extent there; one copy of each part."""
    shape = tuple(max(sizes) for sizes in zip(*(part.shape[1:] for part in parts), strict=True))
    out = np.zeros((sum(part.shape[0] for part in parts), *shape), dtype=parts[0].dtype)
    start = 0
    for part in parts:
        out[(slice(start, start + part.shape[0]), *(slice(0, size) for size in part.shape[1:]))] = part
        start += part.shape[0]
    return out


def worth_cutting(needed: int, extent: int) -> bool:
    """Cut an axis's padding once it is a quarter of the axis or more (each cut copies the rows)."""
    return needed <= 0.75 * extent


class DecodeLoop(GraphRunner):
    def __init__(
        self,
        backend: Backend,
        model: str,
        graph: Mapping[str, Any],
        max_batch_size: int,
        metrics: ServiceMetrics | None = None,
        policy: BatchingPolicy | None = None,
    ) -> None:
        super().__init__(backend, model, str(graph["name"]), max_batch_size, metrics)
        self.policy: BatchingPolicy = policy or ContinuousBatching(0.0)
        self.state_outputs: dict[str, str] = dict(graph["state_outputs"])  # state input -> output
        axes = {spec["name"]: list(spec["shape"]) for spec in graph["inputs"]}
        # state axes to squeeze: an axis whose mask is itself state (e.g. the self-attention cache)
        self.squeezed = {
            axis: (mask, [(name, shape.index(axis)) for name, shape in axes.items()
                          if name in self.state_outputs and axis in shape])
            for axis, mask in dict(graph.get("axis_masks", {})).items() if mask in self.state_outputs
        }
        self._arrivals: list[_Member] = []
        self._members: list[_Member] = []
        self._fixed: Arrays = {}
        self._state: Arrays = {}
        self._rows = 0  # rows in the batch: every array in _fixed and _state has this many

    async def generate(self, search: Search, fixed: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray]
                       ) -> list[int]:
        """Run ``search`` to its end over the decode graph, in the shared batch; returns its ids.

        ``fixed`` and ``state`` hold ``search.rows`` rows. Cancelling the caller drops its rows
        before the next step.
        """
        if search.rows > self.max_batch_size:
            raise ValueError(f"a search of {search.rows} rows exceeds the batch limit {self.max_batch_size}")
        if search.done:
            return search.result()
        self._ensure_worker()
        member = _Member(search, {k: np.asarray(v) for k, v in fixed.items()},
                         {k: np.asarray(v) for k, v in state.items()}, asyncio.get_running_loop().create_future())
        self._arrivals.append(member)
        self._wakeup.set()
        return await member.future

    # ---- the worker ----------------------------------------------------------------------------
    async def _run_forever(self) -> None:
        """The worker: one decode step of every live search per turn of the loop.

        A turn first re-forms the resident batch (searches that are done or whose caller left give their
        rows back; waiting searches join where the policy admits them: ``self.policy.admit``), then runs one
        step of the decode graph over every row and advances each search by its own rows' log-probabilities.
        A search therefore joins at the step after it arrives and leaves at the step it ends, whatever the
        others do: no search waits for a batch to drain, and none holds a step for one that is late. The
        worker sleeps only when no search is live or waiting. Then, in order:
        """
        while True:
            # 1) Idle: sleep until a search arrives.
            if not self._members and not self._arrivals:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                # 2) Re-form: drop the finished and abandoned searches, admit the arrivals the policy lets in.
                self._reform()
                # 3) One step of every resident search; a search that ends hands its caller the ids.
                if self._members:
                    await self._step()
            except Exception as error:  # a fault fails the searches in the batch, never strands them
                for member in [*self._members, *self._arrivals]:
                    if not member.future.done():
                        member.future.set_exception(error)
                self._members, self._arrivals, self._fixed, self._state, self._rows = [], [], {}, {}, 0
                self.backend.drop_kept()

    def _reform(self) -> None:
        """Drop finished or abandoned searches, then admit the arrivals the policy lets in."""
        if any(member.future.done() for member in self._members):
            self._remove_finished()
        self._arrivals = [member for member in self._arrivals if not member.future.done()]  # callers that left
        joining = self.policy.admit([member.search.rows for member in self._arrivals], self._rows,
                                    self.max_batch_size)
        if joining:
            self._admit(self._arrivals[:joining])
            del self._arrivals[:joining]

    def _remove_finished(self) -> None:
        staying = [member for member in self._members if not member.future.done()]
        kept = sum(member.search.rows for member in staying)
        if kept == 0:
            self._members, self._fixed, self._state, self._rows = [], {}, {}, 0
            self.backend.drop_kept()  # the batch's device copies go with it
            return
        # the live rows past the end of the kept batch move into the freed rows before it
        freed = np.sort(np.concatenate([m.rows for m in self._members if m.future.done()]))
        holes = freed[freed < kept]
        movers = np.sort(np.concatenate([m.rows for m in staying]))
        movers = movers[movers >= kept]
        if len(holes):
            destination = np.arange(self._rows)
            destination[movers] = holes
            for member in staying:
                member.rows = destination[member.rows]
        for arrays in (self._fixed, self._state):
            for name, value in arrays.items():
                if len(holes):
                    value = value if value.flags.writeable else value.copy()  # a backend's read-only output
                    value[holes] = value[movers]
                arrays[name] = value[:kept]
        self._members, self._rows = staying, kept
        self._cut_fixed_padding()
        self._squeeze()

    def _cut_fixed_padding(self) -> None:
        """Cut a fixed input's padding when its longest live member has left."""
        for name, value in self._fixed.items():
            needed = tuple(max(sizes) for sizes in zip(*(m.fixed[name].shape[1:] for m in self._members), strict=True))
            if needed != value.shape[1:] and worth_cutting(int(np.prod(needed)), int(np.prod(value.shape[1:]))):
                self._fixed[name] = np.ascontiguousarray(value[(slice(None), *(slice(0, n) for n in needed))])

    def _admit(self, joining: list[_Member]) -> None:
        """Append the arrivals' rows: the batch so far and theirs, padded to the longest extents, in one copy."""
        def appended(batch: Arrays, theirs: list[Arrays]) -> Arrays:
            return {name: stack_padded(([batch[name]] if self._members else []) + [own[name] for own in theirs])
                    for name in theirs[0]}

        self._fixed = appended(self._fixed, [m.fixed for m in joining])
        self._state = appended(self._state, [m.state for m in joining])
        for member in joining:
            member.rows = np.arange(self._rows, self._rows + member.search.rows)
            self._rows += member.search.rows
        self._members = self._members + joining

    def _squeeze(self) -> None:
        """Where padding on a masked state axis has become worth cutting, move each row's own positions to the
        front and cut the common padding."""
        for mask_name, entries in self.squeezed.values():
            mask = self._state[mask_name]  # (B, T)
            width = int(mask.sum(axis=1).max(initial=0))
            if not worth_cutting(width, mask.shape[1]):
                continue
            order = np.argsort(~mask, axis=1, kind="stable")[:, :width]  # own positions first, in order
            for name, axis in entries:
                index = order.reshape(order.shape + (1,) * (self._state[name].ndim - 2))
                index = np.moveaxis(index, 1, axis)
                self._state[name] = np.take_along_axis(self._state[name], index, axis=axis)

    async def _step(self) -> None:
        members, rows = self._members, self._rows
        token, t = np.empty(rows, dtype=np.int64), np.empty(rows, dtype=np.int64)
        for member in members:
            token[member.rows] = member.search.tokens
            t[member.rows] = member.search.t
        outputs = await self._run_batch({**self._fixed, **self._state, "token": token, "t": t}, rows,
                                        [m.enqueued for m in members if m.search.t == 0], keep=frozenset(self._fixed))
        logp = outputs["logp"]
        order: np.ndarray | None = None  # the row each row's next state comes from, when a beam search reordered
        for member in members:
            if member.future.done():  # abandoned mid-step: its rows leave at the next re-form
                continue
            parents = member.search.advance(logp[member.rows])
            if member.search.rows > 1 and not np.array_equal(parents, np.arange(member.search.rows)):
                order = np.arange(rows) if order is None else order
                order[member.rows] = member.rows[parents]
            if member.search.done:
                member.future.set_result(member.search.result())
        self._state = {name: (outputs[output][order] if order is not None else outputs[output])
                       for name, output in self.state_outputs.items()}
