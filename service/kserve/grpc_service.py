"""KServe v2 over gRPC: Triton's ``inference.GRPCInferenceService`` (what ``tritonclient.grpc`` and ``perf_analyzer -i
grpc`` speak), on grpcio's asyncio server in the service's own process and event loop, on ``RTSERVE_GRPC_PORT``.

Served: ``ServerLive``, ``ServerReady``, ``ModelReady``, ``ServerMetadata``, ``ModelMetadata``, ``ModelConfig``,
``ModelStatistics``, ``RepositoryIndex``, ``ModelInfer`` and ``ModelStreamInfer``, with the semantics of the REST routes
(:class:`~service.kserve.inference.Inference`); the other methods answer UNIMPLEMENTED. The servicer's base class and
the messages are ``tritonclient[grpc]``'s, generated from Triton's protos. What an HTTP request gets, a call gets too:

- **the API key** from the metadata ``x-api-key`` or ``authorization: Bearer <key>`` (the model calls; health and
  server metadata need none);
- **a request id**: the metadata ``x-request-id`` when plain, else a new one, on every log line of the call and in the
  trailing metadata;
- **the request metrics** by route (``/inference.GRPCInferenceService/<Method>``), model and the HTTP status the
  answer stands for; a stream counts each of its requests;
- **the body limit**: a message over ``RTSERVE_MAX_BODY_BYTES`` is refused (RESOURCE_EXHAUSTED);
- **errors** from the one STATUS table, as the gRPC code of that status (:data:`CODES`) with the same message; a 4xx
  logs at most a DEBUG line, an unexpected error its traceback at ERROR;
- **shutdown**: while draining, ServerReady and ModelReady answer false and a new stream is refused (UNAVAILABLE);
  an open stream answers what it carries in flight, then ends with UNAVAILABLE (open a new one, to any replica, and
  go on: the sequences are in Redis); when the drain ends the server stops accepting calls, and what still runs when
  the grace ends is cut (UNAVAILABLE, with what a retry does).

``ModelStreamInfer`` is the gRPC twin of the session stream (``/sessions/{id}/stream``): one stream carries the
pieces of any number of sequences (and requests outside any), each answered by one response carrying the request's
``id``. Each sequence's pieces are applied in the order the stream carries them, different sequences' at once, all
through the same session flow as the other transports: their states are kept in this replica's state cache, so a
sequence's next piece reads nothing first, and their commits are batched with every other commit of the moment.
(Unlike a session's WebSocket, a gRPC stream holds no session's lease: a heavy model's piece takes the session's lock
as an HTTP piece does.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any, TypeVar

import grpc
from starlette.exceptions import HTTPException
from tritonclient.grpc import service_pb2, service_pb2_grpc

from service.auth import owner_of_request, quota_of
from service.errors import error_answer, note_error
from service.kserve import protobuf
from service.kserve.inference import Inference
from service.logs import request_id_var
from service.metrics import ServiceMetrics
from service.middleware import record_request, take_request_id
from service.readiness import readiness
from service.settings import Settings
from service.shutdown import Shutdown
from service.state_store import StateStore

log = logging.getLogger("rtserve")

SERVICE = "/inference.GRPCInferenceService/"
CODES = {  # the gRPC code of each status the service answers
    400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED, 404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED, 409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED, 415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT, 429: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE,
}
SHUTTING_DOWN = ("this replica is shutting down: open a new stream (to any replica) and go on; each sequence is in "
                 "Redis. A piece answered was applied; send the others again (with sequence_seq, a retry is applied "
                 "at most once)")
T = TypeVar("T")


class Failed(Exception):
    """A call refused with a status (the answer is already decided)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class Call:
    """One call's scope: its metadata as headers, its request id, the model it concerns (for the metrics)."""

    def __init__(self, context: Any, method: str) -> None:
        metadata = [(key, value) for key, value in (context.invocation_metadata() or ()) if isinstance(value, str)]
        self.headers = dict(metadata)  # what owner_of_request reads
        self.route = SERVICE + method
        self.scope: dict[str, Any] = {"type": "grpc", "method": "GRPC", "path": self.route,
                                      "route": SimpleNamespace(path=self.route), "state": {},
                                      "headers": [(key.encode(), value.encode()) for key, value in metadata]}
        self.request_id = take_request_id(self.scope)
        self.host = host_of(context.peer() or "")  # for the quota without API keys

    def request(self) -> Call:
        """The scope of one request of this call's stream: the same metadata and request id, its own model."""
        one = Call.__new__(Call)
        one.headers, one.route, one.request_id, one.host = self.headers, self.route, self.request_id, self.host
        one.scope = {**self.scope, "state": {"request_id": self.request_id}}
        return one

    def note_model(self, ref: str) -> None:
        self.scope["state"]["model"] = ref


def host_of(peer: str) -> str | None:
    """The address of a gRPC peer (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``); None for another kind (a Unix
    socket)."""
    kind, _, address = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    return address.rsplit(":", 1)[0].strip("[]")


def status_of(error: Exception, call: Call) -> tuple[int, str]:
    """The status and message answering ``error`` (the one STATUS table), logged as HTTP logs it."""
    if isinstance(error, Failed):
        return error.status, error.detail
    if isinstance(error, HTTPException):  # the API key
        return error.status_code, str(error.detail)
    status, body, _ = error_answer(error, call.scope)
    note_error(call.scope, error, status)
    if status == 500:
        log.error("gRPC %s: unexpected error", call.route, exc_info=error)
    return status, body["detail"]


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, inference: Inference, settings: Settings, metrics: ServiceMetrics, shutdown: Shutdown,
                 store: StateStore) -> None:
        self.inference, self.settings, self.metrics = inference, settings, metrics
        self.shutdown, self.store = shutdown, store

    async def _unary(self, method: str, context: Any, work: Callable[[Call], Awaitable[T]], keyed: bool = True) -> T:
        """Run ``work`` as one call (module docstring: key, request id, metrics, errors, the cut at shutdown)."""
        started = time.perf_counter()
        call = Call(context, method)
        token = request_id_var.set(call.request_id)
        status = 500
        try:
            context.set_trailing_metadata((("x-request-id", call.request_id),))
            try:
                async with self.shutdown.cut_off() as cut:
                    if keyed:
                        call.scope["owner"] = owner_of_request(call, self.settings)  # type: ignore[arg-type]
                    answer = await work(call)
            except TimeoutError:
                if not cut.expired():
                    raise
                raise Failed(503, "this replica is shutting down and the call did not finish within its grace "
                                  "(RTSERVE_SHUTDOWN_TIMEOUT_SECONDS); its outcome is unknown: send it again, to any "
                                  "replica (a piece with sequence_seq is applied at most once)") from None
            status = 200
            return answer
        except Exception as error:
            status, detail = status_of(error, call)
            await context.abort(CODES.get(status, grpc.StatusCode.INTERNAL), detail)
            raise AssertionError("unreachable: abort raises") from None
        finally:
            request_id_var.reset(token)
            record_request(self.metrics, call.route, call.scope, status, time.perf_counter() - started,
                           self.settings.access_log)

    async def _read(self, method: str, context: Any, read: Callable[[], T], keyed: bool = True) -> T:
        """A call answered from what the replica holds (no I/O): ``read()``, as one call of :meth:`_unary`."""

        async def work(call: Call) -> T:
            return read()

        return await self._unary(method, context, work, keyed)

    # ---- health and metadata -------------------------------------------------------------------------------------
    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 - the proto's method names
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def ready(call: Call) -> Any:
            now = await readiness(self.store, self.inference.registry, self.shutdown)
            return service_pb2.ServerReadyResponse(ready=now.ready)

        return await self._unary("ServerReady", context, ready, keyed=False)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._read("ServerMetadata", context,
                                lambda: protobuf.server_metadata(self.inference.server_metadata()), keyed=False)

    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._read("ModelReady", context, lambda: service_pb2.ModelReadyResponse(
            ready=self.inference.model_ready(request.name, request.version)))

    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._read("ModelMetadata", context, lambda: protobuf.model_metadata(
            self.inference.model_metadata(request.name, request.version)))

    async def ModelConfig(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._read("ModelConfig", context, lambda: protobuf.model_config(
            self.inference.model_config(request.name, request.version)))

    async def ModelStatistics(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._read("ModelStatistics", context, lambda: protobuf.model_statistics(
            self.inference.statistics(request.name, request.version)))

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._read("RepositoryIndex", context,
                                lambda: protobuf.repository_index(self.inference.repository_index()))

    # ---- inference -----------------------------------------------------------------------------------------------
    async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def infer(call: Call) -> Any:
            owner = call.scope["owner"]
            return protobuf.infer_response(await self.answer(request, call, owner,
                                                             quota_of(self.settings, owner, call.host)))

        return await self._unary("ModelInfer", context, infer)

    async def answer(self, message: Any, call: Call, owner: str, quota: str) -> Any:
        model = self.inference.model(message.model_name, message.model_version)  # an unknown model first (404)
        call.note_model(model.ref)
        return await self.inference.infer(model, protobuf.read_request(message), owner, quota)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[Any], context: Any) -> None:  # noqa: N802
        call = Call(context, "ModelStreamInfer")
        token = request_id_var.set(call.request_id)
        try:
            context.set_trailing_metadata((("x-request-id", call.request_id),))
            try:
                if self.shutdown.draining:
                    raise Failed(503, "this replica is shutting down: open the stream on another replica")
                owner = owner_of_request(call, self.settings)  # type: ignore[arg-type]
            except Exception as error:
                status, detail = status_of(error, call)
                record_request(self.metrics, call.route, call.scope, status, 0.0, self.settings.access_log)
                await context.abort(CODES.get(status, grpc.StatusCode.INTERNAL), detail)
            stream = InferStream(self, context, call, owner)
            with self.shutdown.streaming(stream.close_soon):
                await stream.run(request_iterator)
            if stream.closing.is_set():
                await context.abort(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
        finally:
            request_id_var.reset(token)


class InferStream:
    """One ``ModelStreamInfer`` call: reads requests, answers each; a sequence's pieces one after another."""

    def __init__(self, servicer: InferenceServicer, context: Any, call: Call, owner: str) -> None:
        self.servicer, self.context, self.call, self.owner = servicer, context, call, owner
        self.quota = quota_of(servicer.settings, owner, call.host)
        self.closing = asyncio.Event()  # the replica is shutting down: read no more, answer what is in flight
        self._chains: dict[tuple[str, str, Any], asyncio.Task[None]] = {}  # a sequence's last piece
        self._tasks: set[asyncio.Task[None]] = set()
        self._writing = asyncio.Lock()

    def close_soon(self) -> None:
        self.closing.set()

    async def run(self, requests: AsyncIterator[Any]) -> None:
        closing = asyncio.ensure_future(self.closing.wait())
        reader = asyncio.ensure_future(self._read(requests))  # one task for the whole stream, not one per request
        try:
            await asyncio.wait((reader, closing), return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                reader.result()  # the client's stream failed: as the call's error
            else:  # shutting down while the client is quiet: read no more, answer what is in flight
                reader.cancel()
            if self._tasks:
                await asyncio.wait(list(self._tasks))
        finally:
            closing.cancel()
            if not reader.done():  # the call ends (the client left, or an error): the read in flight ends unheard
                reader.cancel()
            reader.add_done_callback(lambda done: done.cancelled() or done.exception())
            for task in self._tasks:
                task.cancel()

    async def _read(self, requests: AsyncIterator[Any]) -> None:
        """Dispatch each request as it comes, until the client ends its side or the replica starts shutting down."""
        async for message in requests:
            self._dispatch(message)
            if self.closing.is_set():
                return

    def _dispatch(self, message: Any) -> None:
        parameters = message.parameters
        key = None
        if "sequence_id" in parameters:
            value = protobuf.parameter_value(parameters["sequence_id"])
            if value not in (0, "", None):
                key = (message.model_name, message.model_version, value)
        previous = self._chains.get(key) if key is not None else None
        task = asyncio.get_running_loop().create_task(self._answer(message, previous))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if key is not None:
            self._chains[key] = task
            task.add_done_callback(lambda done, key=key: self._chains.get(key) is done and self._chains.pop(key))

    async def _answer(self, message: Any, previous: asyncio.Task[None] | None) -> None:
        if previous is not None and not previous.done():  # the sequence's earlier piece first (whatever its outcome)
            await asyncio.wait((previous,))
        started = time.perf_counter()
        call = self.call.request()
        status = 500
        shutdown = self.servicer.shutdown
        try:
            shutdown.stream_pieces += 1  # a request in flight, for the batcher's lone-request rule
            try:
                answer = await self.servicer.answer(message, call, self.owner, self.quota)
            finally:
                shutdown.stream_pieces -= 1
            response = service_pb2.ModelStreamInferResponse()
            protobuf.infer_response(answer, response.infer_response)
            status = 200
        except Exception as error:
            status, detail = status_of(error, call)
            response = service_pb2.ModelStreamInferResponse(
                error_message=detail, infer_response=service_pb2.ModelInferResponse(
                    model_name=message.model_name, model_version=message.model_version, id=message.id))
        try:
            async with self._writing:
                await self.context.write(response)
        finally:
            record_request(self.servicer.metrics, call.route, call.scope, status, time.perf_counter() - started,
                           self.servicer.settings.access_log)



class GrpcServer:
    """The gRPC server of one process: started once the models are loaded, stopping with the app."""

    def __init__(self, servicer: InferenceServicer, settings: Settings) -> None:
        self.servicer, self.settings = servicer, settings
        self.server: Any = None
        self.port = 0
        self._stopping: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Listen on RTSERVE_HOST:RTSERVE_GRPC_PORT; the port bound. Several front ends (RTSERVE_WORKERS above 1)
        each listen on it, SO_REUSEPORT (the kernel spreads connections over them); one process alone refuses a
        port another holds."""
        settings = self.settings
        several = settings.workers > 1 or settings.engine_socket is not None
        self.server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1 if several else 0),
        ])
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, self.server)
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        self.port = self.server.add_insecure_port(f"{host}:{settings.grpc_port}")
        await self.server.start()
        log.info("KServe v2 gRPC server on %s:%d", settings.host, self.port)
        return self.port

    def stop_accepting(self) -> None:
        """The drain ended: no new calls; what runs has the grace (then it is cut)."""
        if self.server is not None and self._stopping is None:
            grace = self.servicer.shutdown.grace_seconds
            self._stopping = asyncio.get_running_loop().create_task(self.server.stop(grace + 1))

    async def stop(self) -> None:
        if self.server is None:
            return
        if self._stopping is None:
            await self.server.stop(0)
        else:
            await self._stopping
