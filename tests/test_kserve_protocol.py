"""The KServe v2 pieces apart from a server: the tensor codec reads what tritonclient writes and writes what it reads,
every family's answer schema becomes outputs by one rule, a sequence's session id is derived alike everywhere and
apart per key, and a session created again under its id is a new incarnation that holds one place in its quota."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.http._utils import _get_inference_request

from models.families import families
from service.kserve import protobuf
from service.kserve.sequences import SequenceControl, session_id_of
from service.kserve.signature import Signature, specs_of_field, tensors_of_value
from service.kserve.tensors import (
    InferAnswer,
    Tensor,
    UnreadableBody,
    bytes_elements,
    json_data,
    raw_bytes,
    read_request,
    write_answer,
)
from service.runtime.pipeline import InputError
from service.schemas import ForecastFinish


def client_request(binary: bool):
    """What tritonclient.http sends for rows and a text: the body and its header length."""
    rows = np.random.default_rng().standard_normal((5, 7)).astype(np.float32)
    first = httpclient.InferInput("ROWS", [5, 7], "FP32")
    first.set_data_from_numpy(rows, binary_data=binary)
    second = httpclient.InferInput("TEXT", [2], "BYTES")
    second.set_data_from_numpy(np.array(["día uno".encode(), b"two"], dtype=np.object_), binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("FORECAST", binary_data=True)]
    body, length = _get_inference_request([first, second], "7", outputs, 42, True, False, 0, None,
                                          {"sequence_seq": 1})
    return rows, body, length


@pytest.mark.parametrize("binary", [True, False])
def test_the_codec_reads_what_tritonclient_writes(binary):
    rows, body, length = client_request(binary)
    request = read_request(body, None if length is None else str(length))
    assert request.id == "7" and request.parameters["sequence_id"] == 42 and request.parameters["sequence_start"]
    assert request.parameters["sequence_seq"] == 1
    assert [(t.name, t.datatype, t.shape) for t in request.inputs] == [("ROWS", "FP32", (5, 7)),
                                                                        ("TEXT", "BYTES", (2,))]
    assert np.array_equal(request.inputs[0].data, rows)
    assert request.inputs[1].data == ["día uno".encode(), b"two"]
    assert [(o.name, o.binary) for o in request.outputs] == [("FORECAST", True)]


def test_tritonclient_reads_what_the_codec_writes():
    forecast = np.random.default_rng().standard_normal((3, 2))
    answer = InferAnswer("rsa", "1", [Tensor("FORECAST", "FP64", (3, 2), forecast),
                                      Tensor("VARIABLES", "BYTES", (2,), [b"HUFL", "OT\u00e9".encode()]),
                                      Tensor("READY", "BOOL", (1,), np.array([True]))],
                         id="9", parameters={"replayed": False})
    body, length = write_answer(answer, binary={"FORECAST", "VARIABLES"})
    result = httpclient.InferResult.from_response_body(body, header_length=length)
    assert np.array_equal(result.as_numpy("FORECAST"), forecast)
    assert result.as_numpy("VARIABLES").tolist() == [b"HUFL", "OT\u00e9".encode()]
    assert result.as_numpy("READY").tolist() == [True]
    assert result.get_response()["id"] == "9" and result.get_response()["parameters"] == {"replayed": False}
    response = protobuf.infer_response(answer)  # gRPC: every output raw, in order
    assert [o.name for o in response.outputs] == ["FORECAST", "VARIABLES", "READY"]
    assert np.frombuffer(response.raw_output_contents[0], "<f8").tolist() == forecast.ravel().tolist()
    assert bytes_elements(response.raw_output_contents[1], "VARIABLES") == [b"HUFL", "OT\u00e9".encode()]


def test_each_grpc_answer_has_its_own_outputs():
    """Answers with the same outputs' names and shapes share the heads they are merged from, never the messages:
    each holds its own outputs, data and parameters, in order."""
    def answer(seq: int, rows: int) -> InferAnswer:
        return InferAnswer("rsa", "1", [Tensor("FORECAST", "FP64", (rows, 1), np.full((rows, 1), float(seq))),
                                        Tensor("ROWS_SEEN", "INT64", (1,), np.array([seq]))],
                           id=str(seq), parameters={"sequence_seq": seq, "replayed": False, "session_id": "v2x"})

    first = protobuf.infer_response(answer(1, 2))
    first.outputs[0].name = "CHANGED"  # a caller may change its answer: the next one is not
    first.outputs[0].shape.append(9)
    second, third = protobuf.infer_response(answer(2, 2)), protobuf.infer_response(answer(3, 3))
    assert [(o.name, o.datatype, list(o.shape)) for o in second.outputs] == [("FORECAST", "FP64", [2, 1]),
                                                                            ("ROWS_SEEN", "INT64", [1])]
    assert [list(o.shape) for o in third.outputs] == [[3, 1], [1]]
    assert np.frombuffer(second.raw_output_contents[0], "<f8").tolist() == [2.0, 2.0]
    assert np.frombuffer(third.raw_output_contents[1], "<i8").tolist() == [3]
    assert (second.id, second.parameters["sequence_seq"].int64_param, second.parameters["replayed"].bool_param,
            second.parameters["session_id"].string_param) == ("2", 2, False, "v2x")


BYTES_HEADER = b'{"inputs": [{"name": "X", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}]}'


@pytest.mark.parametrize(("body", "length", "error", "words"), [
    (b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [2], "data": [1, 2, 3]}]}', None, InputError,
     "has 3 elements"),
    (b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [2], "data": ["1", "2"]}]}', None, InputError,
     "JSON numbers"),
    (b'{"inputs": [{"name": "X", "datatype": "INT8", "shape": [1], "data": [300]}]}', None, InputError, "range"),
    (b'{"inputs": [{"name": "X", "datatype": "BF16", "shape": [1], "data": [1]}]}', None, InputError, "BF16"),
    (b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [-1], "data": []}]}', None, InputError, "sizes"),
    (b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1],'
     b' "parameters": {"shared_memory_region": "r"}}]}', None, InputError, "shared memory"),
    (b'{"inputs": [], "extra": 1}', None, InputError, "unexpected field"),
    (BYTES_HEADER + b"\x09\x00\x00\x00ab", str(len(BYTES_HEADER)), UnreadableBody, "runs past"),
    (b"\xff\xfe", None, UnreadableBody, "not UTF-8"),
])
def test_the_codec_refuses_what_is_not_a_request_with_what_to_change(body, length, error, words):
    with pytest.raises(error, match=words):
        read_request(body, length)


def test_a_grpc_request_reads_raw_or_typed_contents():
    message = service_pb2.ModelInferRequest(model_name="m", id="1")
    typed = message.inputs.add(name="ROWS", datatype="FP32", shape=[1, 2])
    typed.contents.fp32_contents.extend([1.5, 2.5])
    message.parameters["sequence_id"].uint64_param = 5
    message.parameters["sequence_start"].bool_param = True
    request = protobuf.read_request(message)
    assert request.inputs[0].data.tolist() == [[1.5, 2.5]] and request.parameters == {"sequence_id": 5,
                                                                                       "sequence_start": True}
    message.raw_input_contents.append(np.float32([1, 2, 3]).tobytes())
    with pytest.raises(UnreadableBody, match="takes 8"):
        protobuf.read_request(message)


@pytest.mark.parametrize("record", families(), ids=lambda record: record.name)
def test_every_familys_answer_fields_become_outputs_by_one_rule(record):
    schema = record.part("finish")
    specs = [spec for name, info in schema.model_fields.items() if name not in ("model", "session")
             for spec in specs_of_field(name, info.annotation)]
    names = [spec.name for spec in specs]
    assert len(names) == len(set(names)) and all(name.isupper() for name in names)
    by_name = {spec.name: spec for spec in specs}
    expected = {"forecast": {"FORECAST": ("FP64", (-1, -1)), "ROWS_NEEDED": ("INT64", (1,))},
                "classify": {"LABEL": ("BYTES", (-1,)), "PROBABILITIES": ("FP64", (-1,)),
                             "PROBABILITIES_KEYS": ("BYTES", (-1,)), "TRUNCATED": ("BOOL", (1,))},
                "summarize": {"SUMMARY": ("BYTES", (1,)), "DECODING": ("BYTES", (1,)),
                              "SUMMARY_TOKENS": ("INT64", (1,))}}[record.task]
    for name, (datatype, dims) in expected.items():
        assert (by_name[name].datatype, by_name[name].dims) == (datatype, dims), name


def test_a_null_field_is_an_output_without_elements():
    (forecast,) = specs_of_field("forecast", list[list[float]] | None)
    (empty,) = tensors_of_value("forecast", None, forecast)
    assert (empty.name, empty.datatype, empty.shape) == ("FORECAST", "FP64", (0, 0))
    values, keys = tensors_of_value("probabilities", {"a": 0.25, "b": 0.75}, None)
    assert values.data.tolist() == [0.25, 0.75] and keys.data == [b"a", b"b"]


def test_a_sequences_session_id_is_the_same_everywhere_and_apart_per_key_model_and_id_type():
    one = session_id_of("owner", "rsa", 5)
    assert one == session_id_of("owner", "rsa", 5) and one.startswith("v2") and len(one) == 34
    others = {session_id_of("other", "rsa", 5), session_id_of("owner", "rmt", 5), session_id_of("owner", "rsa", "5")}
    assert one not in others and len(others) == 3
    assert all(c.isalnum() or c in "-_" for c in one)


@pytest.mark.parametrize(("parameters", "words"), [
    ({"sequence_start": True}, "need parameters.sequence_id"),
    ({"sequence_id": 1.5}, "uint64 or a string"),
    ({"sequence_id": 2**64}, "not a uint64"),
    ({"sequence_id": 3, "sequence_end": "yes"}, "true or false"),
    ({"sequence_id": 3, "sequence_seq": 0}, "from 1"),
])
def test_sequence_controls_are_checked(parameters, words):
    with pytest.raises(InputError, match=words):
        SequenceControl.of(parameters)
    assert SequenceControl.of({"sequence_id": 0}) is None and SequenceControl.of({}) is None
    assert SequenceControl.of({"sequence_id": "a", "sequence_end": True}) == SequenceControl("a", end=True)


async def test_a_session_created_again_under_its_id_is_a_new_incarnation_holding_one_place(redis_url, key_prefix):
    from service.metrics import ServiceMetrics
    from service.sessions import SessionStore
    from service.settings import Settings
    from service.state_store import StateStore

    store = StateStore.from_url(redis_url, prefix=f"{key_prefix}-again")
    sessions = SessionStore(store, Settings(max_sessions_per_key=1), ServiceMetrics(collect_gpu=False))
    state = {"window": np.zeros((1, 2), np.float32)}
    try:
        first = await sessions.create("m:1", "forecast", "owner", state, session_id="v2fixed")
        keys = sessions._keys("v2fixed")
        await store.client.set(keys["result"], json.dumps({"old": True}))
        await store.client.rpush(keys["chunks"], b"old chunk")
        await store.client.hset(keys["meta"], mapping={"seq": 3, "chunk_bytes": 9})
        again = await sessions.create("m:1", "forecast", "owner", state, session_id="v2fixed")  # at its key's limit
        assert again.id == first.id == "v2fixed" and again.epoch != first.epoch and again.seq == 0
        assert await store.client.get(keys["result"]) is None and await store.client.exists(keys["chunks"]) == 0
        assert (await sessions.meta("v2fixed", "owner")).chunk_bytes == 0
        assert await store.client.zcard(sessions._owner_key("owner")) == 1
    finally:
        await sessions.close()
        await store.close()


def test_a_grpc_inference_that_redis_failed_says_what_a_retry_of_it_does():
    from types import SimpleNamespace

    from service.errors import KSERVE_RETRY, error_answer
    from service.kserve.grpc_service import SERVICE
    from service.state_store import StateStoreUnavailable

    for method in ("ModelInfer", "ModelStreamInfer"):  # the scope a gRPC call's errors are answered in (Call)
        route = SERVICE + method
        status, body, headers = error_answer(StateStoreUnavailable("Redis is down"),
                                             {"method": "GRPC", "route": SimpleNamespace(path=route)})
        assert status == 503 and headers == {"Retry-After": "1"}
        assert body["detail"].endswith(KSERVE_RETRY), body


def test_outputs_that_repeat_from_answer_to_answer_are_written_once_and_stay_right():
    """A forecast's columns and horizon repeat in every answer and are written once; every answer still carries its
    own values: a count that changes, a forecast, columns that differ."""
    model = SimpleNamespace(name="rsa", pipeline=SimpleNamespace(input_kind="rows", row_width=2),
                            family=SimpleNamespace(part=lambda part: ForecastFinish))
    signature = Signature(model)

    def outputs(rows_seen: int, variables: list[str], forecast: np.ndarray | None) -> dict[str, Any]:
        answer = {"forecast": forecast, "horizon": 3, "variables": variables, "rows_seen": rows_seen,
                  "rows_needed": max(0, 4 - rows_seen)}
        return {tensor.name: tensor for tensor in signature.outputs_of(answer, None)}

    first, second = outputs(2, ["HUFL", "OT"], None), outputs(6, ["HUFL", "OT"], np.ones((3, 2)))
    assert first["VARIABLES"] is second["VARIABLES"] and first["HORIZON"] is second["HORIZON"]  # written once
    assert bytes_elements(second["VARIABLES"].raw, "VARIABLES") == [b"HUFL", b"OT"]
    assert [np.frombuffer(raw_bytes(second[name]), "<i8").tolist() for name in ("ROWS_SEEN", "ROWS_NEEDED")] == [
        [6], [0]]
    assert np.frombuffer(raw_bytes(first["ROWS_SEEN"]), "<i8").tolist() == [2]
    assert np.frombuffer(raw_bytes(second["FORECAST"]), "<f8").tolist() == [1.0] * 6
    assert first["FORECAST"].shape[0] == 0
    other = outputs(6, ["OT", "HUFL"], np.ones((3, 2)))
    assert json_data(other["VARIABLES"]) == ["OT", "HUFL"] and json_data(second["VARIABLES"]) == ["HUFL", "OT"]
    assert signature.outputs_of({"rows_seen": 1}, None)[0].datatype == "INT64"
    assert signature.outputs_of({"rows_seen": True}, None)[0].datatype == "BOOL"  # True is not the count 1
