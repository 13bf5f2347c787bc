"""What the one-shot routes (``/classify``, ``/summarize``, ``/forecast``) share: the settings a request's input
is checked against, and its model, resolved by name or by the route's task and noted on the request (the access
log and the request metrics name it). The API key is checked before the handler runs.

``/classify`` and ``/forecast`` also have a fast path (:mod:`service.fast_path`): a body of the plain types (``text``
a string, or ``rows`` lists of finite float32-range numbers, and ``model`` a string or absent, no other field) is
answered without FastAPI's dependency solver, pydantic's validation and its serialization of the answer. Any other
body goes to the endpoint, which names what is wrong.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.auth import OwnerDep, owner_of_request
from service.dependencies import MetricsDep, RegistryDep, SettingsDep
from service.metrics import ServiceMetrics
from service.runtime.registry import LoadedModel, ModelRegistry
from service.settings import Settings


class OneShot:
    def __init__(self, request: Request, registry: ModelRegistry, settings: Settings, metrics: ServiceMetrics) -> None:
        self.request, self.registry, self.settings, self.metrics = request, registry, settings, metrics

    def model(self, name: str | None, task: str) -> LoadedModel:
        """``name`` (or the task's default model when it is None), noted on the request."""
        model = self.registry.resolve(name, task)
        self.request.state.model = model.ref
        return model


async def one_shot(request: Request, registry: RegistryDep, settings: SettingsDep, metrics: MetricsDep,
                   owner: OwnerDep) -> OneShot:
    """The dependency (``async``: FastAPI would run a class, as any plain callable, in its thread pool)."""
    return OneShot(request, registry, settings, metrics)


OneShotDep = Annotated[OneShot, Depends(one_shot)]


def one_shot_call(request: Request) -> OneShot:
    """What :data:`OneShotDep` gives a handler, without the dependency solver (a fast path): the key checked."""
    state = request.app.state
    owner_of_request(request, state.settings)
    return OneShot(request, state.registry, state.settings, state.metrics)
