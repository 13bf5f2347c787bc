"""What the one-shot routes (``/classify``, ``/summarize``, ``/forecast``) share: the settings a request's input
is checked against, and its model, resolved by name or by the route's task and noted on the request (the access
log and the request metrics name it). The API key is checked before the handler runs."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.auth import OwnerDep
from service.dependencies import MetricsDep, RegistryDep, SettingsDep
from service.runtime.registry import LoadedModel


class OneShot:
    def __init__(self, request: Request, registry: RegistryDep, settings: SettingsDep, metrics: MetricsDep,
                 owner: OwnerDep) -> None:
        self.request, self.registry, self.settings, self.metrics = request, registry, settings, metrics

    def model(self, name: str | None, task: str) -> LoadedModel:
        """``name`` (or the task's default model when it is None), noted on the request."""
        model = self.registry.resolve(name, task)
        self.request.state.model = model.ref
        return model


OneShotDep = Annotated[OneShot, Depends()]
