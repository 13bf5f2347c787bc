"""The gRPC floor: what grpcio's asyncio server costs per streamed request when the request does nothing.

``python -m loadtest.perf_analyzer --floor`` runs this beside rtserve and Triton and drives it with the same
``perf_analyzer`` run. It speaks KServe v2 over gRPC as far as ``perf_analyzer`` needs: the health and readiness
calls, ``ServerMetadata``, ``ModelMetadata``, ``ModelConfig`` and ``ModelStatistics`` (rtserve's own answers for the
model, captured from rtserve in the same run), and ``ModelStreamInfer``. Per request it does the least a server on
grpcio's asyncio API (the API rtserve's gRPC server runs on) can do and still answer: grpcio parses the
``ModelInferRequest``, the servicer copies rtserve's answer to one real piece (the same outputs, the same bytes) into a
response carrying the request's ``id``, and writes it. No session, no step, no Redis, no metrics: what is left is the
cost of grpcio's asyncio server and protobuf in Python, which any server of pieces on that API pays.

    python benchmarks/grpc_floor.py --port 8001 --captured /tmp/captured
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import uvloop
from tritonclient.grpc import service_pb2, service_pb2_grpc

# the captured answers, each a serialized message in a file of this name (``loadtest.perf_analyzer.capture_answers``)
CAPTURED = {"metadata": service_pb2.ModelMetadataResponse, "config": service_pb2.ModelConfigResponse,
            "answer": service_pb2.ModelInferResponse}


class FloorServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, captured: dict[str, Any]) -> None:
        self.metadata, self.config, self.answer = captured["metadata"], captured["config"], captured["answer"]
        self.count = 0  # requests answered, for ModelStatistics (perf_analyzer reads it)

    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 - the proto's method names
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return service_pb2.ServerReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        return service_pb2.ServerMetadataResponse(name="grpc-floor", version="1",
                                                  extensions=["sequence", "model_configuration", "statistics"])

    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return service_pb2.ModelReadyResponse(ready=True)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self.metadata

    async def ModelConfig(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self.config

    async def ModelStatistics(self, request: Any, context: Any) -> Any:  # noqa: N802
        statistics = service_pb2.ModelStatisticsResponse()
        entry = statistics.model_stats.add(name=self.metadata.name, version=self.metadata.versions[0],
                                           inference_count=self.count, execution_count=self.count)
        for phase in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
            getattr(entry.inference_stats, phase).count = self.count
        return statistics

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[Any], context: Any) -> None:  # noqa: N802
        async for request in request_iterator:
            response = service_pb2.ModelStreamInferResponse()
            response.infer_response.CopyFrom(self.answer)
            response.infer_response.id = request.id
            self.count += 1
            await context.write(response)


def read_captured(folder: Path) -> dict[str, Any]:
    return {name: kind.FromString((folder / name).read_bytes()) for name, kind in CAPTURED.items()}


async def serve(port: int, captured: dict[str, Any]) -> None:
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(FloorServicer(captured), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--captured", type=Path, required=True, help="the folder the captured answers are in")
    options = parser.parse_args()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # the loop rtserve's server runs on
        runner.run(serve(options.port, read_captured(options.captured)))


if __name__ == "__main__":
    main()
