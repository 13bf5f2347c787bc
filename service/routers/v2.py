"""KServe v2 (the Open Inference Protocol) over HTTP/REST, beside rtserve's own routes: what ``tritonclient.http``,
``perf_analyzer -i http`` and a KServe ``InferenceService`` with ``protocolVersion: v2`` speak.

The handlers parse, call :class:`~service.kserve.inference.Inference` and write the answer; the protocol lives in
:mod:`service.kserve`. Health and server metadata need no key; the model routes take the API key as every other route
does. Errors are the protocol's body, ``{"error": "..."}``, with the statuses rtserve answers anywhere (the one STATUS
table of :mod:`service.errors`). Every model route also answers under ``/versions/{model_version}``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Request, Response

from service.auth import SECURED, owner_of_request, quota_of
from service.errors import responses
from service.kserve.inference import Inference
from service.kserve.schemas import (
    InferenceRequest,
    InferenceResponse,
    ModelMetadata,
    RepositoryEntry,
    ServerMetadata,
    V2Error,
)
from service.kserve.tensors import binary_outputs, inflate, read_request, write_answer
from service.readiness import readiness

router = APIRouter(prefix="/v2", tags=["kserve-v2"])

ModelName = Annotated[str, Path(description="A model's name (`GET /models`).", examples=["rsa-etth1-h24"])]
ModelVersion = Annotated[str, Path(description="One of its versions.", examples=["1"])]
Impl = Callable[[Request, str, str], Awaitable[Response]]


def _inference(request: Request) -> Inference:
    return request.app.state.inference


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


@router.get("", response_model=ServerMetadata, summary="Server metadata (KServe v2)",
            description="The server's name, version and the protocol extensions it serves. Needs no key.")
async def server_metadata(request: Request) -> Response:
    return _json(_inference(request).server_metadata())


@router.get("/health/live", response_class=Response, summary="Liveness (KServe v2)",
            description="200 while the process runs. Needs no key.",
            responses={200: {"description": "Live.", "content": {}}})
async def live() -> Response:
    return Response(status_code=200)


@router.get("/health/ready", response_class=Response, summary="Readiness (KServe v2)",
            description="200 when Redis answers and accepts writes, every model is loaded and the replica is not "
            "shutting down (as `/readyz`); 503 otherwise (the protocol asks for a 4xx; clients test for 200). Needs no "
            "key.", responses={200: {"description": "Ready.", "content": {}}} | responses(503, body=V2Error))
async def ready(request: Request) -> Response:
    state = request.app.state
    now = await readiness(state.store, state.registry, state.shutdown)
    return Response(status_code=200) if now.ready else _not_ready(now.reason())


def _not_ready(why: str) -> Response:
    return Response(orjson.dumps({"error": why}), status_code=503, media_type="application/json",
                    headers={"Retry-After": "1"})


@router.post("/repository/index", response_model=list[RepositoryEntry], responses=responses(401, body=V2Error),
             openapi_extra=SECURED, summary="The models there are (Triton's repository index)",
             description="Every model version of the repository and its state: READY, or UNAVAILABLE with the reason "
             "it did not load (rtserve loads the whole repository at start; it has no load or unload).")
async def repository_index(request: Request) -> Response:
    owner_of_request(request, request.app.state.settings)
    return _json(_inference(request).repository_index())


def _model_routes(suffix: str, method: str, impl: Impl, name: str, **options: Any) -> None:
    """``impl`` at ``/models/{model_name}<suffix>`` (the latest version) and under ``/versions/{model_version}``."""

    async def latest(request: Request, model_name: ModelName) -> Response:
        return await impl(request, model_name, "")

    async def versioned(request: Request, model_name: ModelName, model_version: ModelVersion) -> Response:
        return await impl(request, model_name, model_version)

    router.add_api_route(f"/models/{{model_name}}{suffix}", latest, methods=[method], name=name, **options)
    router.add_api_route(f"/models/{{model_name}}/versions/{{model_version}}{suffix}", versioned, methods=[method],
                         name=f"{name}_version", **options)


async def _metadata(request: Request, model_name: str, model_version: str) -> Response:
    owner_of_request(request, request.app.state.settings)
    return _json(_inference(request).model_metadata(model_name, model_version))


async def _model_ready(request: Request, model_name: str, model_version: str) -> Response:
    owner_of_request(request, request.app.state.settings)
    if _inference(request).model_ready(model_name, model_version):
        return Response(status_code=200)
    return _not_ready("not ready: shutting down")


async def _config(request: Request, model_name: str, model_version: str) -> Response:
    owner_of_request(request, request.app.state.settings)
    return _json(_inference(request).model_config(model_name, model_version))


async def _statistics(request: Request, model_name: str, model_version: str) -> Response:
    owner_of_request(request, request.app.state.settings)
    return _json(_inference(request).statistics(model_name, model_version))


async def _infer(request: Request, model_name: str, model_version: str) -> Response:
    settings = request.app.state.settings
    owner = owner_of_request(request, settings)
    inference = _inference(request)
    model = inference.model(model_name, model_version)
    request.state.model = model.ref
    body = inflate(await request.body(), request.headers.get("content-encoding"), settings.max_body_bytes)
    decoded = read_request(body, request.headers.get("inference-header-content-length"))
    quota = quota_of(settings, owner, request.client.host if request.client else None)
    answer = await inference.infer(model, decoded, owner, quota)
    content, header_length = write_answer(answer, binary_outputs(decoded, (tensor.name for tensor in answer.outputs)))
    if header_length is None:
        return Response(content, media_type="application/json")
    return Response(content, media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(header_length)})


FREE_FORM = {"content": {"application/json": {"schema": {"type": "object", "additionalProperties": True}}}}

_model_routes("", "GET", _metadata, "model_metadata", response_model=ModelMetadata,
              responses=responses(401, 404, body=V2Error), openapi_extra=SECURED, summary="Model metadata (KServe v2)",
              description="The model's name, versions, input and outputs (name, datatype, shape).")
_model_routes("/ready", "GET", _model_ready, "model_ready", response_class=Response,
              responses={200: {"description": "Ready.", "content": {}}} | responses(401, 404, 503, body=V2Error),
              openapi_extra=SECURED, summary="Model readiness (KServe v2)",
              description="200 when the model is loaded and the replica is not shutting down.")
_model_routes("/config", "GET", _config, "model_config",
              responses={200: {"description": "Triton's model configuration (JSON).", **FREE_FORM}}
              | responses(401, 404, body=V2Error), openapi_extra=SECURED,
              summary="Model configuration (Triton's model_configuration extension)",
              description="No batch axis (`max_batch_size` 0: rtserve batches across requests and sequences), one "
              "input, the outputs, and a sequence batcher whose sequences are rtserve sessions (idle expiry: "
              "`RTSERVE_SESSION_TTL_SECONDS`).")
_model_routes("/stats", "GET", _statistics, "model_statistics",
              responses={200: {"description": "Triton's statistics (JSON).", **FREE_FORM}}
              | responses(401, 404, body=V2Error), openapi_extra=SECURED,
              summary="Model statistics (Triton's statistics extension)",
              description="The inferences this process answered, and their time.")
_model_routes(
    "/infer", "POST", _infer, "model_infer", response_model=InferenceResponse,
    responses={200: {"description": "The outputs: JSON, or with raw outputs a JSON header (its length in "
                     "`Inference-Header-Content-Length`) and their bytes.",
                     "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                     "headers": {"Inference-Header-Content-Length": {
                         "description": "With raw outputs: the byte length of the JSON header.",
                         "schema": {"type": "integer"}}}}}
    | responses(400, 401, 404, 408, 409, 413, 415, 422, 429, 503, body=V2Error),
    openapi_extra=SECURED | {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/InferenceRequest"}}}}},
    summary="Inference (KServe v2, with Triton's sequence and binary tensor data extensions)",
    description="One input: `TEXT` (BYTES [1], text models) or `ROWS` (FP32 [T, C], forecasters). Outside a "
    "sequence, the one-shot route's answer. With `parameters.sequence_id`, a piece of that sequence (one rtserve "
    "session): `sequence_start` starts it, `sequence_end` ends it and answers the whole input's answer; "
    "`sequence_seq` (1, 2, ...) makes a retried piece answer from the stored result. Binary tensor data: send the "
    "JSON header's length as `Inference-Header-Content-Length` and each raw input's byte count as "
    "`parameters.binary_data_size`. Tensor names per task: docs/coming-from-triton.md.",
)
EXTRA_SCHEMAS = (InferenceRequest,)  # named by the infer route's requestBody: the app adds them to the components
