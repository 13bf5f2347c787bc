"""The KServe v2 protocol's operations, whatever carries them (the REST router, the gRPC servicer): server and model
metadata, readiness, Triton's model configuration and statistics, and inference.

An inference request outside a sequence is a one-shot request: the same ``consume`` and ``finish`` as ``POST
/classify``, ``/summarize`` or ``/forecast`` on its input, so its outputs are that route's answer. A request of a
sequence is a piece of a session (:mod:`service.kserve.sequences`). Summaries take the finish options as request
parameters: ``decoding``, ``max_length``, ``beam_size`` (as the one-shot route's body takes them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

import numpy as np
from pydantic import ValidationError

from service.errors import check_rows, check_text
from service.kserve.sequences import SequenceControl, Sequences
from service.kserve.signature import Signature
from service.kserve.tensors import InferAnswer, InferRequest
from service.runtime.pipeline import InputError, run_whole
from service.runtime.registry import LoadedModel, ModelRegistry, UnknownModel
from service.schemas import FinishRequest
from service.session_flow import SessionFlow
from service.settings import Settings

EXTENSIONS = ["binary_tensor_data", "sequence", "model_configuration", "statistics"]
OPTIONS = ("decoding", "max_length", "beam_size")  # request parameters a summary's finish reads


@dataclass
class Statistics:
    """Triton's per-model statistics, as far as rtserve counts them (this process's requests)."""

    count: int = 0  # successful inferences
    nanoseconds: int = 0  # their time, request to answer
    failed: int = 0
    failed_nanoseconds: int = 0
    last: int = 0  # milliseconds since the epoch of the last inference

    def note(self, started: float, ok: bool) -> None:
        spent = int((time.perf_counter() - started) * 1e9)
        if ok:
            self.count += 1
            self.nanoseconds += spent
        else:
            self.failed += 1
            self.failed_nanoseconds += spent
        self.last = int(time.time() * 1000)


@dataclass
class Inference:
    registry: ModelRegistry
    flow: SessionFlow
    settings: Settings
    draining: Callable[[], bool]  # the replica is shutting down (not ready)
    sequences: Sequences = field(init=False)
    _signatures: dict[str, Signature] = field(default_factory=dict)
    _statistics: dict[str, Statistics] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sequences = Sequences(self.flow)

    # ---- the server and its models -------------------------------------------------------------------------------
    def server_metadata(self) -> dict[str, Any]:
        return {"name": "rtserve", "version": version("rtserve"), "extensions": EXTENSIONS}

    def model(self, name: str, model_version: str = "") -> LoadedModel:
        """The model ``name`` (its latest version), or that ``model_version``; :class:`UnknownModel` in Triton's
        words, with the models there are."""
        if ":" not in name and (not model_version or ":" not in model_version):
            try:
                return self.registry.resolve(f"{name}:{model_version}" if model_version else name, None)
            except UnknownModel:
                pass
        which = f"'{name}' version {model_version}" if model_version else f"'{name}'"
        raise UnknownModel(f"Request for unknown model: {which} is not found (loaded models: "
                           f"{sorted(self.registry.models)})")

    def signature(self, model: LoadedModel) -> Signature:
        signature = self._signatures.get(model.ref)
        if signature is None:
            signature = self._signatures[model.ref] = Signature(model)
        return signature

    def versions(self, name: str) -> list[str]:
        return sorted(ref.split(":", 1)[1] for ref in self.registry.models if ref.split(":", 1)[0] == name)

    def model_metadata(self, name: str, model_version: str = "") -> dict[str, Any]:
        model = self.model(name, model_version)
        return self.signature(model).metadata(self.versions(model.name))

    def model_config(self, name: str, model_version: str = "") -> dict[str, Any]:
        return self.signature(self.model(name, model_version)).config(self.settings.session_ttl_seconds,
                                                                       self.settings.max_queue_delay_ms)

    def repository_index(self) -> list[dict[str, str]]:
        """Every model version the repository holds and its state (Triton's repository index; rtserve loads every
        model at start: READY, or UNAVAILABLE with the reason it did not load)."""
        index = [{"name": model.name, "version": model.version, "state": "READY", "reason": ""}
                 for model in self.registry.models.values()]
        index += [{"name": ref.split(":", 1)[0], "version": ref.split(":", 1)[1], "state": "UNAVAILABLE",
                   "reason": reason} for ref, reason in self.registry.errors.items()]
        return sorted(index, key=lambda entry: (entry["name"], entry["version"]))

    def model_ready(self, name: str, model_version: str = "") -> bool:
        self.model(name, model_version)
        return not self.draining()

    def statistics(self, name: str = "", model_version: str = "") -> dict[str, Any]:
        """Triton's statistics extension: per model, the inferences this process answered (rtserve batches steps,
        not requests: ``execution_count`` is the same count)."""
        models = [self.model(name, model_version)] if name else sorted(self.registry.models.values(),
                                                                         key=lambda m: m.ref)
        entries = []
        for model in models:
            counted = self._statistics.get(model.ref, Statistics())
            success = {"count": counted.count, "ns": counted.nanoseconds}
            none = {"count": counted.count, "ns": 0}  # perf_analyzer wants the compute phases counted alike
            entries.append({
                "name": model.name, "version": model.version, "last_inference": counted.last,
                "inference_count": counted.count, "execution_count": counted.count,
                "inference_stats": {"success": success, "fail": {"count": counted.failed,
                                                                 "ns": counted.failed_nanoseconds},
                                    "queue": none, "compute_input": none, "compute_infer": success,
                                    "compute_output": none,
                                    "cache_hit": {"count": 0, "ns": 0}, "cache_miss": {"count": 0, "ns": 0}},
                "batch_stats": [],
            })
        return {"model_stats": entries}

    # ---- inference -----------------------------------------------------------------------------------------------
    async def infer(self, model: LoadedModel, request: InferRequest, owner: str, quota: str) -> InferAnswer:
        """Answer one inference request for ``model`` (:meth:`model`, which the caller resolved first: an unknown
        model is refused before the body is read, and the request metrics name the model) (module docstring)."""
        started = time.perf_counter()
        statistics = self._statistics.setdefault(model.ref, Statistics())
        try:
            answer = await self._infer(model, request, owner, quota)
        except Exception:
            statistics.note(started, ok=False)
            raise
        statistics.note(started, ok=True)
        return answer

    async def _infer(self, model: LoadedModel, request: InferRequest, owner: str, quota: str) -> InferAnswer:
        signature = self.signature(model)
        piece = signature.piece(request)
        signature.check_outputs(request.outputs)
        control = SequenceControl.of(request.parameters)
        options = finish_options(request.parameters)
        parameters: dict[str, Any] = {}
        if control is None:  # one shot: the one-shot route's answer
            self._check(piece, document=True)
            _, finished = await run_whole(model, piece, options=options)
            result = finished.result
        else:
            self._check(piece, document=False)
            step = await self.sequences.piece(model, owner, quota, control, piece, options)
            result, parameters = step.result, step.parameters()
            parameters |= {"sequence_id": control.id, "sequence_start": control.start, "sequence_end": control.end}
        outputs = signature.outputs_of(result, request.outputs)
        return InferAnswer(model.name, model.version, outputs, request.id, parameters)

    def _check(self, piece: str | np.ndarray, document: bool) -> None:
        if isinstance(piece, str):
            check_text(piece, self.settings, document=document)
        else:
            check_rows(piece, self.settings)


def finish_options(parameters: dict[str, Any]) -> dict[str, Any]:
    """A summary's finish options among the request's parameters (validated as the one-shot route's body)."""
    given = {name: parameters[name] for name in OPTIONS if name in parameters}
    if not given:
        return {}
    try:
        return FinishRequest.model_validate(given).options()
    except ValidationError as error:
        problems = "; ".join(f"parameters.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise InputError(problems) from None
