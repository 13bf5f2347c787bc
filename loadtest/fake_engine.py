"""A stand-in registry for :class:`service.runtime.engine.Engine`: one graph's batcher over a fake backend, with what
the engine reads of a loaded model taken from the backend. For the engine's tests and its benchmark on a fake
device (benchmarks/engine_scaling.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.runtime.graph_runner import GraphRunner


@dataclass
class FakeModel:
    """What the engine reads of a loaded model: its runner per graph, and what its hello describes."""

    batchers: dict[str, Any]
    backend: str
    providers: list[str]
    device: str
    precision: str
    max_batch_size: int


@dataclass
class FakeRegistry:
    """What the engine reads of a registry: its models, and the entries it could not load (none)."""

    models: dict[str, FakeModel]
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def over(cls, batcher: GraphRunner) -> FakeRegistry:
        """One model holding ``batcher``'s graph, on its backend, batches up to its largest."""
        backend = batcher.backend
        model = FakeModel({batcher.graph: batcher}, backend.name, list(backend.providers), backend.device,
                          backend.precision, batcher.max_batch_size)
        return cls({batcher.model: model})

    async def close(self) -> None:
        for model in self.models.values():
            for batcher in model.batchers.values():
                await batcher.close()
