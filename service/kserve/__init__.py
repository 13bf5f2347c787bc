"""KServe v2, the Open Inference Protocol, with Triton's sequence and binary tensor data extensions: what Triton's
clients (``tritonclient``, ``perf_analyzer``) and a KServe ``InferenceService`` with ``protocolVersion: v2`` speak.

One job per module: :mod:`~service.kserve.tensors` (the tensors of a request and an answer over HTTP: JSON and binary
data), :mod:`~service.kserve.protobuf` (the same as gRPC messages), :mod:`~service.kserve.signature` (a model's
input and outputs, from its pipeline and its family's answer), :mod:`~service.kserve.sequences` (a sequence is a
session), :mod:`~service.kserve.inference` (the operations, whatever the transport), :mod:`~service.kserve.schemas`
(the REST bodies as OpenAPI documents them) and :mod:`~service.kserve.grpc_service` (the gRPC server). The REST routes
are :mod:`service.routers.v2`. The user's page: docs/coming-from-triton.md.
"""
