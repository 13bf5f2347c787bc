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
sessions share every step. The state never leaves the batch between steps: only when the rows
change is the batch re-formed (fixed inputs re-padded to the longest member, state rows selected,
and padding on a state axis squeezed out so it never grows without bound).
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
from service.runtime.graph_runner import GraphRunner

Arrays = dict[str, np.ndarray]


@dataclass(eq=False)
class _Member:
    search: Search
    fixed: Arrays  # inputs fixed for this document, search.rows rows, unpadded
    state: Arrays  # state inputs before its first step, search.rows rows
    future: asyncio.Future[list[int]]
    enqueued: float = field(default_factory=time.perf_counter)


def pad_to(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Zero-pad (False for bool) ``array`` at the end of each non-batch axis up to ``shape``."""
    widths = [(0, 0)] + [(0, target - size) for size, target in zip(array.shape[1:], shape, strict=True)]
    if all(after == 0 for _, after in widths):
        return array
    return np.pad(array, widths)


def stack_padded(parts: list[np.ndarray]) -> np.ndarray:
    """Concatenate along the batch axis, each part padded to the largest extent of every other axis."""
    shape = tuple(max(sizes) for sizes in zip(*(part.shape[1:] for part in parts), strict=True))
    return np.concatenate([pad_to(part, shape) for part in parts], axis=0)


class DecodeLoop(GraphRunner):
    def __init__(
        self,
        backend: Backend,
        model: str,
        graph: Mapping[str, Any],
        max_batch_size: int,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        super().__init__(backend, model, str(graph["name"]), max_batch_size, metrics)
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
        while True:
            if not self._members and not self._arrivals:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                self._reform()
                if self._members:
                    await self._step()
            except Exception as error:  # a fault fails the searches in the batch, never strands them
                for member in [*self._members, *self._arrivals]:
                    if not member.future.done():
                        member.future.set_exception(error)
                self._members, self._arrivals, self._fixed, self._state = [], [], {}, {}

    def _reform(self) -> None:
        """Drop finished or abandoned searches, admit arrivals that fit, and rebuild the batch if it changed."""
        staying = [i for i, m in enumerate(self._members) if not m.future.done()]
        rows = sum(self._members[i].search.rows for i in staying)
        joining: list[_Member] = []
        while self._arrivals and rows + self._arrivals[0].search.rows <= self.max_batch_size:
            member = self._arrivals.pop(0)
            if not member.future.done():
                joining.append(member)
                rows += member.search.rows
        if len(staying) == len(self._members) and not joining:
            return
        starts = np.cumsum([0] + [m.search.rows for m in self._members])  # each member's first row
        kept_rows = (np.concatenate([np.arange(starts[i], starts[i + 1]) for i in staying]) if staying
                     else np.zeros(0, np.int64))
        members = [self._members[i] for i in staying] + joining
        state = {name: value[kept_rows] for name, value in self._state.items()} if staying else {}
        state = self._squeeze(state) if staying else state
        if joining:
            parts = {name: ([state[name]] if staying else []) + [m.state[name] for m in joining]
                     for name in joining[0].state}
            state = {name: stack_padded(arrays) for name, arrays in parts.items()}
        self._state = state
        self._fixed = {name: stack_padded([m.fixed[name] for m in members]) for name in members[0].fixed} \
            if members else {}
        self._members = members

    def _squeeze(self, state: Arrays) -> Arrays:
        """Move each row's own positions on a masked state axis to the front and cut the common padding."""
        for mask_name, entries in self.squeezed.values():
            mask = state[mask_name]  # (B, T)
            width = int(mask.sum(axis=1).max(initial=0))
            if width == mask.shape[1]:
                continue
            order = np.argsort(~mask, axis=1, kind="stable")[:, :width]  # own positions first, in order
            for name, axis in entries:
                index = order.reshape(order.shape + (1,) * (state[name].ndim - 2))
                index = np.moveaxis(index, 1, axis)
                state[name] = np.take_along_axis(state[name], index, axis=axis)
        return state

    async def _step(self) -> None:
        members = self._members
        inputs = {**self._fixed, **self._state,
                  "token": np.concatenate([m.search.tokens for m in members]),
                  "t": np.concatenate([np.full(m.search.rows, m.search.t, dtype=np.int64) for m in members])}
        rows = len(inputs["token"])
        outputs = await self._run_batch(inputs, rows, [m.enqueued for m in members if m.search.t == 0])
        logp = outputs["logp"]
        parents, offset = [], 0
        for member in members:
            n = member.search.rows
            if member.future.done():  # abandoned mid-step: its rows stay until the batch re-forms
                parents.append(np.arange(offset, offset + n))
            else:
                parents.append(offset + member.search.advance(logp[offset : offset + n]))
                if member.search.done:
                    member.future.set_result(member.search.result())
            offset += n
        order = np.concatenate(parents)
        reordered = not np.array_equal(order, np.arange(rows))
        self._state = {name: (outputs[output][order] if reordered else outputs[output])
                       for name, output in self.state_outputs.items()}
