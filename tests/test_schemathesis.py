"""The schema and the service agree: schemathesis fuzzes every operation of /openapi.json against a real process
with all its default checks: no 5xx, only documented statuses and content types, every answer
valid against its declared schema (errors included), invalid input refused, valid input not refused for its shape.

The KServe v2 routes (/v2/...) are fuzzed the same way, against the loaded models; their errors are the protocol's
`{"error"}` body. Bounded (a few examples per operation, under a minute here): a full run (~58,000 requests) is for
`schemathesis run http://127.0.0.1:8000/openapi.json` by hand.
"""

import itertools
import os

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

from loadtest.chaos import free_port  # noqa: E402
from tests.service_helpers import start_rtserve  # noqa: E402

KEY = {"X-API-Key": "fuzz-key"}
_turns = itertools.count()
_model_turns = itertools.count()


@pytest.fixture(scope="module")
def base_url(every_task_repository, redis_url):
    port = free_port()
    process = start_rtserve({"RTSERVE_MODEL_REPOSITORY": str(every_task_repository), "RTSERVE_REDIS_URL": redis_url,
                             "RTSERVE_REDIS_KEY_PREFIX": "fuzz-" + str(os.getpid()), "RTSERVE_LOG_LEVEL": "warning",
                             "RTSERVE_API_KEYS": "fuzz-key"}, port)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=20)


def _real_session(base_url, case):
    """Most session cases go to a real, fresh session of the kind their body fits (text: classify or summarize,
    rows: forecast); the others keep the generated id (404)."""
    body = case.body if isinstance(case.body, dict) else {}
    choice = next(_turns) % 4
    if choice == 0:
        return
    task = "forecast" if "rows" in body else ("classify", "summarize", "forecast")[choice - 1]
    if "text" in body:
        task = ("classify", "summarize")[choice % 2]
    created = httpx.post(f"{base_url}/sessions", json={"task": task}, headers=KEY, timeout=10)
    assert created.status_code == 201, created.text
    case.path_parameters["session_id"] = created.json()["id"]


MODELS = {"forecast": "rsa-tiny", "classify": "rmt-tiny", "summarize": "srformer-tiny"}
ROWS = [[round(10 + 0.1 * i + j, 3) for j in range(7)] for i in range(3)]
INFER_BODIES = {  # a request each model takes (KServe v2): JSON Schema cannot say that `data` fills `shape`
    "forecast": {"inputs": [{"name": "ROWS", "datatype": "FP32", "shape": [3, 7], "data": ROWS}]},
    "classify": {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["The senator said."]}]},
    "summarize": {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["Shares rose 5%."]}],
                  "parameters": {"sequence_id": "fuzz", "sequence_start": True, "sequence_end": True}},
}


def _real_model(case):
    """Most KServe v2 model cases go to a loaded model (the others keep the generated name: 404), and a third of the
    infer cases carry a request that model takes (the others keep the generated body)."""
    turn = next(_model_turns)
    choice = turn % 3
    if choice == 0:
        return
    task = ("forecast", "classify", "summarize")[turn // 3 % 3]
    case.path_parameters["model_name"] = MODELS[task]
    if "model_version" in case.path_parameters:
        case.path_parameters["model_version"] = "1"
    if case.path.endswith("/infer") and choice == 2:
        case.body = INFER_BODIES[task]


def test_every_answer_conforms_to_the_schema(base_url):
    """Every operation, with a valid key and with a non-ASCII one: schemathesis' checks all pass."""
    from hypothesis import given

    api = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    failures, calls, answered = [], 0, set()
    for result in api.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=20, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck), database=None)
        def fuzz(case):
            nonlocal calls
            if "session_id" in (case.path_parameters or {}):
                _real_session(base_url, case)
            if "model_name" in (case.path_parameters or {}):
                _real_model(case)
            # an infer body valid by the schema may name tensors the model does not have (a 422): see INFER_BODIES
            excluded = [positive_data_acceptance] if case.path.endswith("/infer") else []
            for headers in (KEY, {"X-API-Key": "cl\u00e9"}):
                calls += 1
                try:
                    response = case.call_and_validate(base_url=base_url, headers=headers, timeout=10,
                                                      excluded_checks=excluded)
                    answered.add((case.method, case.path, response.status_code // 100))
                except Exception as error:  # schemathesis' FailureGroup: every check that failed, with the call
                    failures.append(f"{case.method} {case.formatted_path}: {str(error)[:1500]}")

        fuzz()
    assert calls > 100
    for method, path in (("POST", "/classify"), ("POST", "/summarize"), ("POST", "/forecast"),
                         ("POST", "/sessions/{session_id}/segments"), ("POST", "/sessions/{session_id}/finish"),
                         ("GET", "/sessions/{session_id}"), ("GET", "/v2"), ("GET", "/v2/models/{model_name}"),
                         ("GET", "/v2/models/{model_name}/config"), ("POST", "/v2/models/{model_name}/infer"),
                         ("POST", "/v2/models/{model_name}/versions/{model_version}/infer")):
        assert (method, path, 2) in answered, f"the fuzz never reached a 2xx of {method} {path}"
    assert not failures, failures[:5]
