"""What the one-shot routes (``/classify``, ``/summarize``, ``/forecast``) share: the settings a request's input
is checked against, and its model, resolved by name or by the route's task and noted on the request (the access
log and the request metrics name it). The API key is checked before the handler runs.

``/classify`` and ``/forecast`` also have a fast path (:func:`service.json_body.with_fast_path`): a body of the
plain types (``text`` a string, or ``rows`` lists of finite float32-range numbers, and ``model`` a string or
absent, no other field) is read with orjson and answered without FastAPI's dependency solver, pydantic's
validation and its serialization of the answer. Any other body goes to the endpoint, which names what is wrong.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import Depends, Request, Response
from pydantic import BaseModel

from service.auth import OwnerDep, owner_of_request
from service.dependencies import MetricsDep, RegistryDep, SettingsDep
from service.json_body import fast_json
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


async def read_plain_body(request: Request, field: str) -> dict[str, Any] | None:
    """A JSON object holding ``field`` and at most a string ``model`` besides; None for any other body."""
    body = await fast_json(request)
    if type(body) is not dict or field not in body or len(body) > 2:
        return None
    if len(body) == 2 and type(body.get("model")) is not str:
        return None
    return body


def answer(response_model: type[BaseModel], values: dict[str, Any]) -> Response:
    """``response_model(**values)`` as its JSON, serialized once with orjson when ``values`` are exactly its
    fields (what pydantic would emit, in its field order); through pydantic otherwise."""
    fields = response_model.model_fields
    if values.keys() != fields.keys():
        return Response(response_model(**values).model_dump_json(), media_type="application/json")
    return Response(orjson.dumps({name: values[name] for name in fields}), media_type="application/json")
