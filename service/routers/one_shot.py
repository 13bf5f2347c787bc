"""What the one-shot routes (``/classify``, ``/summarize``, ``/forecast``) share: the settings a request's input
is checked against, and its model, resolved by name or by the route's task and noted on the request (the access
log and the request metrics name it). The API key is checked before the handler runs.

``/classify`` and ``/forecast`` also have a fast path (:mod:`service.fast_path`), given by :func:`one_shot_route`: a
body of the plain types (``text`` a string, or ``rows`` lists of finite float32-range numbers, and ``model`` a string
or absent, no other field) is answered without FastAPI's dependency solver, pydantic's validation and its
serialization of the answer. Any other body goes to the endpoint, which names what is wrong.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel

from service.auth import OwnerDep, owner_of_request
from service.dependencies import MetricsDep, RegistryDep, SettingsDep
from service.errors import BODY, responses
from service.fast_path import answer_json, plain_body, with_fast_path
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


Answer = Callable[[OneShot, str | None, Any], Awaitable[dict[str, Any]]]  # (call, model name, input) -> fields
Endpoint = Callable[..., Any]


def one_shot_route(router: APIRouter, path: str, response_model: type[BaseModel], answer: Answer, *, field: str,
                   plain: Callable[[Any, bytes, int], Any], **docs: str) -> Callable[[Endpoint], Endpoint]:
    """Declare the one-shot route ``path`` (its endpoint: the function decorated), with its errors documented and its
    fast path: a body of ``field`` and at most a string ``model``, whose ``field`` ``plain`` (of the value, the raw
    body and the strings the body holds beside it) takes as validation would (None: it leaves the body to
    validation), is answered by ``answer``, as ``response_model``'s JSON. ``docs``: the operation's summary and
    description."""

    async def fast(request: Request) -> Response | None:
        body = plain_body(await request.json(), field)
        # the strings beside ``field``: the keys, and a model's name
        value = None if body is None else plain(body[field], await request.body(), 2 * len(body) - 1)
        if value is None:
            return None
        return answer_json(response_model, await answer(one_shot_call(request), body.get("model"), value))

    def declare(endpoint: Endpoint) -> Endpoint:
        route = router.post(path, response_model=response_model, responses=responses(*BODY, 401, 404), **docs)
        return route(with_fast_path(fast)(endpoint))

    return declare
