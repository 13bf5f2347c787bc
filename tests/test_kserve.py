"""KServe v2 (HTTP/REST and gRPC, with Triton's sequence and binary tensor data extensions), driven by Triton's own
clients (``tritonclient.http``, ``tritonclient.grpc``) against a real ``rtserve serve`` process over the tiny models of
every task: each answer equals the native API's answer for the same input, a sequence streamed in pieces equals the
whole input posted at once, ``sequence_seq`` gives exactly-once, and bad input is a 4xx in the protocol's shape."""

from __future__ import annotations

import gzip
import json
import os
import queue
import struct
from types import ModuleType
from typing import Any, NamedTuple

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from loadtest.chaos import free_port
from service.auth import owner_of
from service.kserve.sequences import session_id_of
from tests.service_helpers import random_pieces, start_rtserve

KEY, OTHER_KEY = "key-one", "key-two"


def keyed(key=KEY):
    """A fresh dict at every use: tritonclient.http writes its own headers into the one it is given."""
    return {"x-api-key": key}


MODELS = {"forecast": "rsa-tiny", "classify": "rmt-tiny", "summarize": "srformer-tiny"}
WIDTH = 7
TEXT = ("The committee met on Tuesday to weigh the proposal. Members argued over the costs, the schedule and the "
        "risks to the budget. After hours of debate the chair called a vote, and the plan passed by a narrow margin. "
        "Critics said the decision was rushed; supporters said the city could not wait another year. The mayor "
        "promised a public hearing next month, and the council will publish the full text of the plan on Friday.")


@pytest.fixture(scope="module")
def server(every_task_repository, redis_url):
    port, grpc_port = free_port(), free_port()
    process = start_rtserve({"RTSERVE_MODEL_REPOSITORY": str(every_task_repository), "RTSERVE_REDIS_URL": redis_url,
                             "RTSERVE_REDIS_KEY_PREFIX": f"kserve-{os.getpid()}", "RTSERVE_LOG_LEVEL": "warning",
                             "RTSERVE_API_KEYS": f"{KEY},{OTHER_KEY}", "RTSERVE_GRPC_PORT": str(grpc_port)}, port)
    yield {"http": f"127.0.0.1:{port}", "grpc": f"127.0.0.1:{grpc_port}", "base": f"http://127.0.0.1:{port}"}
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def http(server):
    client = httpclient.InferenceServerClient(server["http"], concurrency=4)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server):
    client = grpcclient.InferenceServerClient(server["grpc"])
    yield client
    client.close()


def rows(rng, count):
    return (rng.standard_normal((count, WIDTH)) * 3 + 10).astype(np.float32)


def pieces_of(task, rng):
    """A task's input cut into random pieces (rows: float32 arrays; text: strings), and the whole input."""
    if task == "forecast":
        whole = rows(rng, 50)
        cuts = _starts(random_pieces(list(whole), rng, 13))
        return [whole[start : start + len(piece)] for start, piece in cuts], whole
    return ["".join(piece) for piece in random_pieces(list(TEXT), rng, 150)], TEXT


def _starts(pieces):
    start = 0
    for piece in pieces:
        yield start, piece
        start += len(piece)


def native(server, task, whole, key=KEY):
    """The native one-shot answer for the whole input."""
    body = {"rows": whole.tolist()} if task == "forecast" else {"text": whole}
    answer = httpx.post(f"{server['base']}/{task}", json=body, headers={"x-api-key": key}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def inputs_for(module, task, piece, binary=True):
    if task == "forecast":
        tensor = module.InferInput("ROWS", list(piece.shape), "FP32")
        values = piece
    else:
        tensor = module.InferInput("TEXT", [1], "BYTES")
        values = np.array([piece.encode()], dtype=np.object_)
    if module is httpclient:
        tensor.set_data_from_numpy(values, binary_data=binary)
    else:
        tensor.set_data_from_numpy(values)
    return [tensor]


def as_answer(result, task):
    """The outputs of an InferResult in the native answer's terms."""
    def value(name):
        return result.as_numpy(name)

    def text(name):
        array = value(name)
        return None if array.size == 0 else array.reshape(-1)[0].decode()

    if task == "forecast":
        forecast = value("FORECAST")
        return {"forecast": None if forecast.size == 0 else forecast.tolist(), "horizon": int(value("HORIZON")[0]),
                "variables": [v.decode() for v in value("VARIABLES")], "rows_seen": int(value("ROWS_SEEN")[0]),
                "rows_needed": int(value("ROWS_NEEDED")[0])}
    reading = {"tokens_read": int(value("TOKENS_READ")[0]), "tokens_total": int(value("TOKENS_TOTAL")[0]),
               "truncated": bool(value("TRUNCATED")[0])}
    if task == "classify":
        keys = [k.decode() for k in value("PROBABILITIES_KEYS")]
        return {"label": text("LABEL"), "probabilities": dict(zip(keys, value("PROBABILITIES").tolist(), strict=True)),
                "segments": int(value("SEGMENTS")[0]), **reading}
    return {"summary": text("SUMMARY"), "summary_tokens": int(value("SUMMARY_TOKENS")[0]),
            "decoding": text("DECODING"), **reading}


def without_model(answer):
    return {key: value for key, value in answer.items() if key not in ("model", "session")}


class Triton(NamedTuple):
    protocol: str
    module: ModuleType  # tritonclient.http or tritonclient.grpc
    client: Any  # the module's InferenceServerClient


@pytest.fixture(params=["http", "grpc"])
def triton(request, http, grpc):
    """Triton's client of each protocol in turn: a test that takes it runs once per protocol."""
    return Triton("http", httpclient, http) if request.param == "http" else Triton("grpc", grpcclient, grpc)


# ---- metadata and health ---------------------------------------------------------------------------------------
def test_the_server_and_every_model_describe_themselves_as_triton_clients_expect(triton):
    protocol, _, client = triton
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata(**({} if protocol == "grpc" else {}))
    if protocol == "grpc":
        metadata = json.loads(__import__("google.protobuf.json_format").protobuf.json_format.MessageToJson(metadata))
    assert metadata["name"] == "rtserve" and "sequence" in metadata["extensions"]
    expected = {"forecast": ("ROWS", "FP32", [-1, WIDTH], {"FORECAST", "ROWS_NEEDED"}),
                "classify": ("TEXT", "BYTES", [1], {"LABEL", "PROBABILITIES", "PROBABILITIES_KEYS"}),
                "summarize": ("TEXT", "BYTES", [1], {"SUMMARY", "SUMMARY_TOKENS"})}
    for task, model in MODELS.items():
        name, datatype, shape, outputs = expected[task]
        assert client.is_model_ready(model, headers=keyed())
        meta = client.get_model_metadata(model, headers=keyed(), **({"as_json": True} if protocol == "grpc" else {}))
        (given,) = meta["inputs"]
        assert (given["name"], given["datatype"], [int(d) for d in given["shape"]]) == (name, datatype, shape)
        assert outputs <= {output["name"] for output in meta["outputs"]}
        config = client.get_model_config(model, headers=keyed(), **({"as_json": True} if protocol == "grpc" else {}))
        config = config.get("config", config)
        assert int(config.get("max_batch_size", 0)) == 0 and "sequence_batching" in config


# ---- one shot ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", list(MODELS))
def test_a_one_shot_infer_answers_what_the_native_route_answers(server, triton, task):
    _, whole = pieces_of(task, np.random.default_rng())
    result = triton.client.infer(MODELS[task], inputs_for(triton.module, task, whole), headers=keyed())
    assert as_answer(result, task) == without_model(native(server, task, whole))


def test_json_tensors_and_binary_outputs_on_request(server, http):
    rng = np.random.default_rng()
    whole = rows(rng, 40)
    json_in = inputs_for(httpclient, "forecast", whole, binary=False)
    outputs = [httpclient.InferRequestedOutput("FORECAST", binary_data=True),
               httpclient.InferRequestedOutput("ROWS_SEEN", binary_data=False)]
    result = http.infer(MODELS["forecast"], json_in, outputs=outputs, headers=keyed())
    reference = native(server, "forecast", whole)
    assert result.as_numpy("FORECAST").tolist() == reference["forecast"]
    assert result.as_numpy("ROWS_SEEN").tolist() == [40]
    assert [o["name"] for o in result.get_response()["outputs"]] == ["FORECAST", "ROWS_SEEN"]


# ---- sequences ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", list(MODELS))
def test_a_sequence_of_pieces_ends_with_the_whole_inputs_answer(server, triton, task):
    _, module, client = triton
    rng = np.random.default_rng()
    pieces, whole = pieces_of(task, rng)
    sequence_id = int(rng.integers(1, 2**63))
    for index, piece in enumerate(pieces):
        result = client.infer(MODELS[task], inputs_for(module, task, piece), headers=keyed(),
                              sequence_id=sequence_id, sequence_start=index == 0,
                              sequence_end=index == len(pieces) - 1)
    assert as_answer(result, task) == without_model(native(server, task, whole))
    session = session_id_of(owner_of(KEY), MODELS[task], sequence_id)
    status = httpx.get(f"{server['base']}/sessions/{session}", headers=keyed()).json()
    assert status["status"] == "finished" and status["seq"] == len(pieces)
    with pytest.raises(InferenceServerException) as refused:  # a piece after the end
        client.infer(MODELS[task], inputs_for(module, task, pieces[0]), headers=keyed(), sequence_id=sequence_id)
    assert refused.value.message().startswith(
        f"inference request for sequence {sequence_id} to model '{MODELS[task]}' must specify the START flag on the "
        "first request of the sequence")


def test_one_grpc_stream_carries_several_sequences_at_once(server, grpc):
    rng = np.random.default_rng()
    answers: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)), headers=keyed())
    try:
        plan = []  # (task, sequence id, pieces, whole)
        for task in (*MODELS, "forecast", "classify"):
            pieces, whole = pieces_of(task, rng)
            plan.append((task, int(rng.integers(1, 2**63)), pieces, whole))
        sent = 0
        for step in range(max(len(pieces) for _, _, pieces, _ in plan)):  # interleaved: one piece of each in turn
            for task, sequence_id, pieces, _ in plan:
                if step < len(pieces):
                    grpc.async_stream_infer(MODELS[task], inputs_for(grpcclient, task, pieces[step]),
                                            request_id=f"{sequence_id}:{step}", sequence_id=sequence_id,
                                            sequence_start=step == 0, sequence_end=step == len(pieces) - 1)
                    sent += 1
        last = {}
        for _ in range(sent):
            result, error = answers.get(timeout=60)
            assert error is None, error.message()
            sequence_id, step = result.get_response().id.split(":")
            last[int(sequence_id)] = max(last.get(int(sequence_id), (-1, None)), (int(step), result),
                                         key=lambda pair: pair[0])
    finally:
        grpc.stop_stream()
    for task, sequence_id, pieces, whole in plan:
        step, result = last[sequence_id]
        assert step == len(pieces) - 1
        assert as_answer(result, task) == without_model(native(server, task, whole)), task


def test_sequence_seq_gives_exactly_once(server, triton):
    protocol, module, client = triton
    rng = np.random.default_rng()
    first, second, third = rows(rng, 20), rows(rng, 20), rows(rng, 5)
    sequence_id = f"exactly-once-{rng.integers(1 << 60)}"
    model = MODELS["forecast"]

    def send(piece, seq, start=False, end=False):
        return client.infer(model, inputs_for(module, "forecast", piece), headers=keyed(), sequence_id=sequence_id,
                            sequence_start=start, sequence_end=end, parameters={"sequence_seq": seq})

    answer = send(first, 1, start=True)
    retried = send(first, 1, start=True)  # the start's answer was lost: the same request again
    assert retried.get_response(**({"as_json": True} if protocol == "grpc" else {}))["parameters"]["replayed"] \
        in (True, {"bool_param": True})
    assert retried.as_numpy("ROWS_SEEN").tolist() == answer.as_numpy("ROWS_SEEN").tolist() == [20]
    send(second, 2)
    again = send(second, 2)
    assert again.as_numpy("ROWS_SEEN").tolist() == [40]
    with pytest.raises(InferenceServerException, match="out of order"):
        send(third, 4)
    final = send(third, 3, end=True)
    assert send(third, 3, end=True).as_numpy("FORECAST").tolist() == final.as_numpy("FORECAST").tolist()
    whole = np.concatenate([first, second, third])
    assert as_answer(final, "forecast") == without_model(native(server, "forecast", whole))


def test_a_start_restarts_the_sequence_and_keys_never_share_one(server, triton):
    _, module, client = triton
    rng = np.random.default_rng()
    model, sequence_id = MODELS["forecast"], int(rng.integers(1, 2**63))
    early, late = rows(rng, 30), rows(rng, 40)
    client.infer(model, inputs_for(module, "forecast", early), headers=keyed(), sequence_id=sequence_id,
                 sequence_start=True)
    other = client.infer(model, inputs_for(module, "forecast", late[:10]), headers=keyed(OTHER_KEY),
                         sequence_id=sequence_id, sequence_start=True)  # the same id under another key: its own
    assert other.as_numpy("ROWS_SEEN").tolist() == [10]
    client.infer(model, inputs_for(module, "forecast", late[:25]), headers=keyed(), sequence_id=sequence_id,
                 sequence_start=True)  # started again: the early rows are forgotten
    final = client.infer(model, inputs_for(module, "forecast", late[25:]), headers=keyed(), sequence_id=sequence_id,
                         sequence_end=True)
    assert as_answer(final, "forecast") == without_model(native(server, "forecast", late))


def test_concurrent_pieces_of_one_sequence_without_numbers_are_each_applied_once(server):
    """No piece numbers: pieces sent at once all apply, one after another in commit order (compare-and-set)."""
    rng = np.random.default_rng()
    model, sequence_id = MODELS["forecast"], int(rng.integers(1, 2**63))
    start = rows(rng, 4)
    client = httpclient.InferenceServerClient(server["http"], concurrency=8)
    try:
        client.infer(model, inputs_for(httpclient, "forecast", start), headers=keyed(), sequence_id=sequence_id,
                     sequence_start=True)
        pieces = [rows(rng, 1 + index % 3) for index in range(12)]
        sent = [client.async_infer(model, inputs_for(httpclient, "forecast", piece), headers=keyed(),
                                   sequence_id=sequence_id) for piece in pieces]  # all in flight at once
        seen = [request.get_result() for request in sent]
        counts = sorted(int(result.as_numpy("ROWS_SEEN")[0]) for result in seen)
        assert len(set(counts)) == len(counts)  # each piece had a place of its own in the order
        total = len(start) + sum(len(piece) for piece in pieces)
        final = client.infer(model, inputs_for(httpclient, "forecast", rows(rng, 1)), headers=keyed(),
                             sequence_id=sequence_id, sequence_end=True)
        assert int(final.as_numpy("ROWS_SEEN")[0]) == total + 1
        session = session_id_of(owner_of(KEY), model, sequence_id)
        assert httpx.get(f"{server['base']}/sessions/{session}", headers=keyed()).json()["seq"] == 14
    finally:
        client.close()


# ---- bad input ---------------------------------------------------------------------------------------------------
def _post(server, path, body, headers=None):
    return httpx.post(f"{server['base']}{path}", content=body, headers={**keyed(), **(headers or {})}, timeout=30)


def test_bad_requests_answer_a_4xx_in_the_protocols_shape_and_apply_nothing(server, http):
    rng = np.random.default_rng()
    model = MODELS["forecast"]
    sequence_id = int(rng.integers(1, 2**63))
    http.infer(model, inputs_for(httpclient, "forecast", rows(rng, 5)), headers=keyed(), sequence_id=sequence_id,
               sequence_start=True)
    session = session_id_of(owner_of(KEY), model, sequence_id)
    in_sequence = {"sequence_id": sequence_id}
    good = rows(rng, 3)
    raw = good.tobytes()

    def request(inputs, parameters=in_sequence, **extra):
        return json.dumps({"inputs": inputs, "parameters": parameters, **extra}).encode()

    rows_json = {"name": "ROWS", "datatype": "FP32", "shape": [3, WIDTH], "data": good.ravel().tolist()}
    header = json.dumps({"inputs": [{**rows_json, "data": None, "parameters": {"binary_data_size": len(raw)}}],
                         "parameters": in_sequence}).replace(', "data": null', "").encode()
    text_header = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1],
                                          "parameters": {"binary_data_size": 6}}]}).encode()
    cases = [
        (f"/v2/models/{model}/infer", request([{**rows_json, "datatype": "FP64"}]), {}, 422, "data-type is 'FP64'"),
        (f"/v2/models/{model}/infer", request([{**rows_json, "shape": [7, 3]}]), {}, 422, "unexpected shape"),
        (f"/v2/models/{model}/infer", request([{**rows_json, "shape": [4, WIDTH]}]), {}, 422, "has 21 elements"),
        (f"/v2/models/{model}/infer", request([]), {}, 422, "non-empty list"),
        (f"/v2/models/{model}/infer", request([{**rows_json, "name": "VALUES"}]), {}, 422,
         "unexpected inference input"),
        (f"/v2/models/{model}/infer", request([rows_json], outputs=[{"name": "NOPE"}]), {}, 422,
         "unexpected inference output 'NOPE'"),
        (f"/v2/models/{model}/infer", b"{not json", {}, 422, "not valid JSON"),
        (f"/v2/models/{model}/infer", header + raw[:-4], {"Inference-Header-Content-Length": str(len(header))}, 400,
         "declares"),
        (f"/v2/models/{model}/infer", header + raw + b"xx", {"Inference-Header-Content-Length": str(len(header))},
         400, "add up to"),
        (f"/v2/models/{model}/infer", header + raw, {"Inference-Header-Content-Length": "999999"}, 400,
         "Inference-Header-Content-Length"),
        (f"/v2/models/{MODELS['classify']}/infer", text_header + struct.pack("<I", 2) + b"\xff\xfe",
         {"Inference-Header-Content-Length": str(len(text_header))}, 422, "not UTF-8"),
        (f"/v2/models/{model}/infer", gzip.compress(b"x" * 3_000_000), {"Content-Encoding": "gzip"}, 413, "inflates"),
        (f"/v2/models/{model}/infer", request([rows_json]), {"Content-Encoding": "br"}, 415, "br"),
        ("/v2/models/nope/infer", request([rows_json]), {}, 404, "Request for unknown model: 'nope' is not found"),
        (f"/v2/models/{model}/versions/9/infer", request([rows_json]), {}, 404, "version 9 is not found"),
        (f"/v2/models/{model}/infer", request([rows_json], {"sequence_id": sequence_id, "sequence_seq": 0}), {}, 422,
         "sequence_seq"),
        (f"/v2/models/{model}/infer", request([rows_json]), {"x-api-key": "wrong"}, 401, "API key"),
    ]
    for path, body, headers, status, words in cases:
        answer = _post(server, path, body, headers)
        assert answer.status_code == status, (path, words, answer.text)
        assert set(answer.json()) == {"error"} and words in answer.json()["error"], (words, answer.text)
    assert httpx.get(f"{server['base']}/sessions/{session}", headers=keyed()).json()["seq"] == 1  # nothing applied
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        http.infer(model, inputs_for(httpclient, "forecast", good), headers=keyed(),
                   sequence_id=int(rng.integers(1, 2**63)))
    for path in ("/v2/models/nope", "/v2/models/nope/ready", "/v2/models/nope/config"):
        answer = httpx.get(f"{server['base']}{path}", headers=keyed())
        assert answer.status_code == 404 and set(answer.json()) == {"error"}


def test_bad_input_over_triton_clients_is_refused_with_what_to_change(triton):
    _, module, client = triton
    wrong = module.InferInput("ROWS", [2, WIDTH], "FP64")
    wrong.set_data_from_numpy(np.zeros((2, WIDTH)))
    with pytest.raises(InferenceServerException, match="data-type is 'FP64', but model 'rsa-tiny' expects 'FP32'"):
        client.infer(MODELS["forecast"], [wrong], headers=keyed())
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.infer("nope", inputs_for(module, "forecast", np.zeros((2, WIDTH), np.float32)), headers=keyed())
    with pytest.raises(InferenceServerException, match="API key"):
        client.infer(MODELS["forecast"], inputs_for(module, "forecast", np.zeros((2, WIDTH), np.float32)))


# ---- replicas ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_sequence_goes_on_on_another_replica_and_after_a_restart(every_task_repository, redis_url):
    """Two replicas on one Redis: a sequence started over HTTP on one goes on over gRPC on the other, survives a
    restart of the first, and ends with the whole input's answer; exactly-once holds across them."""
    prefix = f"kserve-replicas-{os.getpid()}"
    ports = [(free_port(), free_port()) for _ in range(2)]

    def start(index):
        port, grpc_port = ports[index]
        return start_rtserve({"RTSERVE_MODEL_REPOSITORY": str(every_task_repository), "RTSERVE_REDIS_URL": redis_url,
                              "RTSERVE_REDIS_KEY_PREFIX": prefix, "RTSERVE_LOG_LEVEL": "warning",
                              "RTSERVE_API_KEYS": KEY, "RTSERVE_GRPC_PORT": str(grpc_port)}, port)

    replicas = [start(0), start(1)]
    try:
        rng = np.random.default_rng()
        pieces = [rows(rng, 9) for _ in range(6)]
        sequence_id = f"replicas-{rng.integers(1 << 60)}"
        model = MODELS["forecast"]

        def send(index, protocol, seq, start=False, end=False):
            port, grpc_port = ports[index]
            if protocol == "http":
                client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
            else:
                client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            module = httpclient if protocol == "http" else grpcclient
            try:
                return client.infer(model, inputs_for(module, "forecast", pieces[seq - 1]), headers=keyed(),
                                    sequence_id=sequence_id, sequence_start=start, sequence_end=end,
                                    parameters={"sequence_seq": seq})
            finally:
                client.close()

        send(0, "http", 1, start=True)
        send(1, "grpc", 2)
        send(0, "grpc", 3)
        assert send(1, "http", 3).as_numpy("ROWS_SEEN").tolist() == [27]  # the retry, on the other replica
        replicas[0].terminate()
        replicas[0].wait(timeout=30)
        replicas[0] = start(0)
        send(0, "http", 4)
        send(0, "grpc", 5)
        final = send(1, "grpc", 6, end=True)
        base = f"http://127.0.0.1:{ports[1][0]}"
        reference = native({"base": base}, "forecast", np.concatenate(pieces))
        assert as_answer(final, "forecast") == without_model(reference)
    finally:
        for replica in replicas:
            replica.terminate()
            replica.wait(timeout=30)


def test_grpc_calls_carry_a_request_id_and_count_in_the_request_metrics(server, grpc):
    import grpc as grpclib
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpclib.insecure_channel(server["grpc"]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        _, call = stub.ModelMetadata.with_call(service_pb2.ModelMetadataRequest(name=MODELS["forecast"]),
                                               metadata=(("x-api-key", KEY), ("x-request-id", "trace-me-7")))
        assert ("x-request-id", "trace-me-7") in call.trailing_metadata()
        with pytest.raises(grpclib.RpcError) as refused:
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="nope"), metadata=(("x-api-key", KEY),))
        assert refused.value.code() == grpclib.StatusCode.NOT_FOUND
    grpc.infer(MODELS["forecast"], inputs_for(grpcclient, "forecast", np.ones((3, WIDTH), np.float32)),
               headers=keyed())
    metrics = httpx.get(f"{server['base']}/metrics").text
    assert 'route="/inference.GRPCInferenceService/ModelMetadata",status="200"' in metrics.replace(
        'model="",', "")
    assert 'route="/inference.GRPCInferenceService/ModelInfer"' in metrics


@pytest.mark.slow
def test_a_draining_replica_ends_its_grpc_streams_with_unavailable_after_the_piece_in_flight(forecast_repository,
                                                                                            redis_url):
    import signal
    import time

    port, grpc_port = free_port(), free_port()
    process = start_rtserve({"RTSERVE_MODEL_REPOSITORY": str(forecast_repository[0]), "RTSERVE_REDIS_URL": redis_url,
                             "RTSERVE_REDIS_KEY_PREFIX": f"kserve-drain-{os.getpid()}", "RTSERVE_LOG_LEVEL": "warning",
                             "RTSERVE_GRPC_PORT": str(grpc_port), "RTSERVE_SHUTDOWN_DRAIN_SECONDS": "3"}, port)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    answers: queue.Queue = queue.Queue()
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        piece = inputs_for(grpcclient, "forecast", rows(np.random.default_rng(), 8))
        client.async_stream_infer(MODELS["forecast"], piece, sequence_id=99, sequence_start=True)
        result, error = answers.get(timeout=30)
        assert error is None and result.as_numpy("ROWS_SEEN").tolist() == [8]
        process.send_signal(signal.SIGTERM)
        result, error = answers.get(timeout=30)  # the open stream ends: go on elsewhere
        assert result is None and "shutting down" in str(error), error
        deadline = time.monotonic() + 2
        while client.is_server_ready() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not client.is_server_ready()  # still answering, while it drains
        process.wait(timeout=30)
        assert process.returncode in (0, -signal.SIGTERM)
    finally:
        client.stop_stream()
        client.close()
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_example_triton_client_runs_against_rtserve(server, protocol):
    """examples/triton_client.py, the script that runs unchanged against Triton (docs/coming-from-triton.md)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "triton_client.py"
    done = subprocess.run([sys.executable, str(script), "--url", server[protocol], "--protocol", protocol,
                           "--api-key", KEY, "--sequences", "2", "--pieces", "3", "--rows", "16"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "model rsa-tiny, input ROWS FP32 [-1, 7], no batch axis" in done.stdout
    assert done.stdout.count("FORECAST FP64 [8, 7]") == 2, done.stdout
