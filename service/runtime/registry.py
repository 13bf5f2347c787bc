"""The models the service serves, discovered from the model repository alone.

``<repository>/<name>/<version>/manifest.json`` marks an entry. Each loaded
model gets a backend per graph (ONNX Runtime, TorchScript or eager PyTorch,
on a device and in a precision, each per model from the settings), a
continuous batcher per graph (a decode loop for autoregressive decode graphs;
its largest batch per model and device), and the pipeline its family names
(:mod:`models.families`). A
device or precision the host or backend cannot give fails startup
(:class:`DeviceConfigError`); any other broken entry is only reported.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from models.families import Family, family
from service.devices import DeviceConfigError, check_backend_precision, resolve_device
from service.metrics import ServiceMetrics
from service.runtime.backends import load_backends
from service.runtime.batcher import DynamicBatcher
from service.runtime.batching import ContinuousBatching
from service.runtime.decode_loop import DecodeLoop
from service.runtime.engine_client import EngineClient, RemoteDecodeLoop, RemoteGraph
from service.runtime.pipeline import Arrays, Consumed, FinalResult, Pipeline
from service.settings import Settings

log = logging.getLogger(__name__)


class UnknownModel(LookupError):
    """No such model / version / task in the repository (HTTP 404)."""


@dataclass
class LoadedModel:
    name: str
    version: str
    entry: Path
    manifest: dict[str, Any]
    backend: str
    providers: list[str]
    batchers: dict[str, DynamicBatcher | DecodeLoop | RemoteGraph]  # per graph (stand-ins in a front end)
    pipeline: Pipeline
    family: Family
    device: str = "cpu"  # "cpu" or "cuda:N", resolved
    precision: str = "fp32"
    max_batch_size: int = 32
    metrics: ServiceMetrics | None = None

    @property
    def task(self) -> str:
        return str(self.manifest["task"])

    @cached_property  # read several times a piece; name and version do not change
    def ref(self) -> str:
        return f"{self.name}:{self.version}"

    @cached_property  # read on every piece of a kept session; the manifest does not change
    def light(self) -> bool:
        """Whether every step of the model is light (:func:`is_light_graph`): computing one twice costs less than
        the round trip to Redis that a session's lock would cost."""
        return all(is_light_graph(graph, self.backend, self.device) for graph in self.manifest["graphs"])

    # The pipeline's calls, metered: every request and every session reads a document through these, so the
    # segments the model reads are counted here and nowhere else.
    def new_state(self) -> Arrays:
        return self.pipeline.new_state()

    async def consume(self, state: Mapping[str, np.ndarray], piece: Any) -> Consumed:
        consumed = await self.pipeline.consume(state, piece)
        self._count(consumed.segments)
        return consumed

    async def finish(
        self, state: Mapping[str, np.ndarray], chunks: list[Arrays], last_result: Mapping[str, Any] | None,
        stream: bool = False, options: Mapping[str, Any] | None = None,
    ) -> FinalResult:
        finished = await self.pipeline.finish(state, chunks, last_result, stream=stream, options=options)
        self._count(finished.segments)
        return finished

    def _count(self, segments: int) -> None:
        if self.metrics is not None:
            self.metrics.labelled(self.metrics.segments, self.ref).inc(segments)


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (-1, version)


def discover(repository: Path) -> dict[str, dict[str, Path]]:
    """``{name: {version: entry folder}}`` of every entry with a manifest."""
    found: dict[str, dict[str, Path]] = {}
    if not repository.is_dir():
        return found
    for manifest in sorted(repository.glob("*/*/manifest.json")):
        entry = manifest.parent
        found.setdefault(entry.parent.name, {})[entry.name] = entry
    return found


def placement(name: str, backend: str, settings: Settings) -> tuple[str, str]:
    """The resolved device ("cpu", "cuda:N") and the precision of model ``name`` on ``backend``;
    :class:`DeviceConfigError` when the host or the backend cannot give them."""
    device = resolve_device(settings.device_for(name), backend, name)
    return device, check_backend_precision(backend, settings.precision_for(name), name)


def load_model(
    entry: Path,
    backend: str,
    settings: Settings,
    metrics: ServiceMetrics | None = None,
    name: str | None = None,
    version: str | None = None,
    engine: EngineClient | None = None,
    in_flight: Callable[[], int] | None = None,
) -> LoadedModel:
    """One repository entry, ready to serve: backends, a batcher per graph, its family's pipeline. With ``engine``
    (a front end), no graph is loaded: each runner is a stand-in that sends its calls to the engine. ``in_flight``:
    the requests in flight in this process (:mod:`service.runtime.batcher`)."""
    manifest = json.loads((entry / "manifest.json").read_text())
    name, version = name or manifest["name"], version or manifest["version"]
    record = family(manifest["family"])
    if record.task != manifest["task"]:
        raise ValueError(f"{entry}: the manifest's task {manifest['task']!r} is not family "
                         f"{record.name!r}'s task {record.task!r}")
    if engine is not None:
        return front_end_model(entry, manifest, record, settings, f"{name}:{version}", engine, metrics)
    device, precision = placement(name, backend, settings)
    max_batch_size = settings.batch_size_for(name, device)
    backends = load_backends(entry, manifest, backend, settings.intra_op_threads, device, precision,
                             spinning=settings.intra_op_spinning, step_mode=settings.step_mode_for(name),
                             max_batch_size=max_batch_size, device_state_bytes=settings.device_state_bytes)
    precision = next(iter(backends.values())).precision  # an entry exported in fp16 runs in fp16
    policy = ContinuousBatching(settings.max_queue_delay_ms / 1000)
    runners: dict[str, DynamicBatcher | DecodeLoop] = {}
    pinned = name in settings.model_max_batch_sizes
    for graph in manifest["graphs"]:
        runner, ref = backends[graph["name"]], f"{name}:{version}"
        if is_decode_graph(graph):  # autoregressive: searches of many documents share every step
            runners[graph["name"]] = DecodeLoop(runner, ref, graph, max_batch_size, metrics, policy)
        else:
            # a light graph (its export's measure, on a CPU): a lone request's call, and a batch of every request
            # in flight, may run on the event loop
            runners[graph["name"]] = DynamicBatcher(
                runner, ref, graph["name"], graph_batch_size(graph, max_batch_size, backend, device, pinned),
                policy.max_queue_delay, metrics, policy, in_flight if is_light_graph(graph, backend, device) else None,
                whole_batches_on_loop=settings.light_batches_on_loop,
            )
    max_batch_size = max(runner.max_batch_size for runner in runners.values())  # what the model's batches reach
    pipeline_class = record.part("pipeline")
    text_options = {"over_limit": settings.over_limit} if pipeline_class.input_kind == "text" else {}
    pipeline = pipeline_class(manifest, entry, runners, **text_options)
    providers = list(dict.fromkeys(p for runner in backends.values() for p in runner.providers))  # in order
    return LoadedModel(
        name, version, entry, manifest, backend, providers, runners, pipeline, record, device, precision,
        max_batch_size, metrics,
    )


def front_end_model(entry: Path, manifest: dict[str, Any], record: Family, settings: Settings, ref: str,
                    engine: EngineClient, metrics: ServiceMetrics | None) -> LoadedModel:
    """A front end's model: the pipeline, its graphs run by the engine (as the engine described them)."""
    described = engine.models.get(ref)
    if described is None:
        raise RuntimeError(f"the engine did not load {ref}: {engine.errors.get(ref, 'not in its repository')}")
    batch = int(described["max_batch_size"])
    runners: dict[str, Any] = {
        graph["name"]: (RemoteDecodeLoop if is_decode_graph(graph) else RemoteGraph)(engine, ref, graph["name"], batch)
        for graph in manifest["graphs"]
    }
    pipeline_class = record.part("pipeline")
    text_options = {"over_limit": settings.over_limit} if pipeline_class.input_kind == "text" else {}
    pipeline = pipeline_class(manifest, entry, runners, **text_options)
    name, version = ref.split(":", 1)
    return LoadedModel(name, version, entry, manifest, described["backend"], list(described["providers"]), runners,
                       pipeline, record, described["device"], described["precision"], batch, metrics)


def graph_batch_size(graph: Mapping[str, Any], max_batch_size: int, backend: str, device: str, pinned: bool) -> int:
    """The largest batch of one graph: the model's, capped on a CPU at the size whose row its export measured
    cheapest (``cpu_max_batch_size``, export/exporter.py ``cpu_batch_cap``), unless the model's own
    RTSERVE_MODEL_MAX_BATCH_SIZES entry (``pinned``) says how large."""
    cap = graph.get("cpu_max_batch_size")
    if pinned or cap is None or backend != "onnx" or device != "cpu":
        return max_batch_size
    return min(max_batch_size, int(cap))


def is_light_graph(graph: Mapping[str, Any], backend: str, device: str) -> bool:
    """A step its export measured under 2 ms on one thread and not 1.5 times as fast on every core
    (``intra_op_threads: 1`` in the manifest), run by ONNX Runtime on a CPU."""
    return backend == "onnx" and device == "cpu" and int(graph.get("intra_op_threads", 0)) == 1


def is_decode_graph(graph: Mapping[str, Any]) -> bool:
    """A graph stepped token by token whose rows may differ in length (see :mod:`service.runtime.decode_loop`)."""
    return bool(graph.get("axis_masks")) and bool(graph.get("state_outputs")) and any(
        spec["name"] == "logp" for spec in graph["outputs"]
    )


class ModelRegistry:
    def __init__(self, settings: Settings, metrics: ServiceMetrics, engine: EngineClient | None = None,
                 in_flight: Callable[[], int] | None = None) -> None:
        """``in_flight``: the requests in flight in this process (the app's :class:`Shutdown` counts them; the
        engine process: the rows of its calls in flight)."""
        self.settings = settings
        self.metrics = metrics
        self.engine = engine  # a front end's engine: it loads the graphs, this registry the pipelines around them
        self.in_flight = in_flight
        self.entries = discover(settings.model_repository)
        self.models: dict[str, LoadedModel] = {}  # "name:version" -> model
        self.latest: dict[str, LoadedModel] = {}  # "name" -> its latest version's model
        self.errors: dict[str, str] = {}

    def expected_count(self) -> int:
        return sum(len(versions) for versions in self.entries.values())

    def loaded_count(self) -> int:
        return len(self.models)

    async def load_all(self) -> None:
        """Load every entry. A device or precision misconfiguration raises before anything loads (the
        service must not start on the CPU when it was told to use a GPU); other failures are kept in
        ``errors`` (readyz reports them) and the rest of the repository still loads."""
        for name in self.entries if self.engine is None else ():  # the engine checked its own
            placement(name, self.settings.backend_for(name), self.settings)
        for name, versions in self.entries.items():
            for version, entry in versions.items():
                try:
                    model = await asyncio.to_thread(self._load, name, version, entry)
                except DeviceConfigError:  # e.g. the CUDA provider failed to start: loud, like the above
                    raise
                except Exception as error:  # one broken entry must not take the others down
                    log.exception("cannot load %s:%s from %s", name, version, entry)
                    self.errors[f"{name}:{version}"] = f"{type(error).__name__}: {error}"
                    continue
                self.models[model.ref] = model
                latest = self.latest.get(name)
                if latest is None or _version_key(version) > _version_key(latest.version):
                    self.latest[name] = model
                log.info("loaded %s (%s, %s backend on %s in %s, %s, batches up to %d)", model.ref, model.task,
                         model.backend, model.device, model.precision, model.providers, model.max_batch_size)

    def _load(self, name: str, version: str, entry: Path) -> LoadedModel:
        return load_model(entry, self.settings.backend_for(name), self.settings, self.metrics, name, version,
                          self.engine, self.in_flight)

    def resolve(self, model: str | None, task: str | None) -> LoadedModel:
        """``model`` is ``name`` (latest version) or ``name:version``; without it, the task's default."""
        if model is None:
            if task is None:
                raise UnknownModel("name a `model` or a `task`")
            model = self.settings.default_models.get(task) or self._first_for_task(task)
        # a session's model ("name:version"), or a request's that names no version (its latest)
        loaded = self.models.get(model) or self.latest.get(model)
        if loaded is not None and (task is None or loaded.task == task):
            return loaded
        name, _, version = model.partition(":")
        versions = [ref.split(":", 1)[1] for ref in self.models if ref.split(":", 1)[0] == name]
        if not versions:
            raise UnknownModel(f"no model named {name!r}; loaded models: {sorted(self.models)}")
        chosen = version or max(versions, key=_version_key)
        loaded = self.models.get(f"{name}:{chosen}")
        if loaded is None:
            raise UnknownModel(f"model {name!r} has no version {chosen!r}; versions: {sorted(versions)}")
        if task is not None and loaded.task != task:
            raise UnknownModel(f"model {loaded.ref} serves {loaded.task!r}, not {task!r}")
        return loaded

    def _first_for_task(self, task: str) -> str:
        candidates = sorted(m.ref for m in self.models.values() if m.task == task)
        if not candidates:
            raise UnknownModel(f"no loaded model serves {task!r}; loaded models: {sorted(self.models)}")
        return candidates[0].split(":", 1)[0]

    def default_refs(self) -> set[str]:
        """``name:version`` of the model that answers each task when a request names none."""
        defaults = set()
        for task in sorted({m.task for m in self.models.values()}):
            try:
                defaults.add(self.resolve(None, task).ref)
            except UnknownModel:  # a configured default that is not loaded: no model is marked for the task
                pass
        return defaults

    def describe(self) -> list[Mapping[str, Any]]:
        defaults = self.default_refs()
        return [
            {
                "name": m.name,
                "version": m.version,
                "task": m.task,
                "family": m.manifest["family"],
                "default": m.ref in defaults,
                "backend": m.backend,
                "device": m.device,
                "precision": m.precision,
                "providers": m.providers,
                "max_batch_size": m.max_batch_size,
                "max_tokens": m.pipeline.max_tokens,
                "value_range": m.pipeline.value_range,
                "manifest": m.manifest,
            }
            for m in sorted(self.models.values(), key=lambda m: m.ref)
        ]

    async def close(self) -> None:
        for model in self.models.values():
            for batcher in model.batchers.values():
                await batcher.close()
