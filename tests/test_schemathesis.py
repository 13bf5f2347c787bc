"""No input gives a 5xx: schemathesis fuzzes every operation of /openapi.json against a real process (issue 15).

Bounded (a few examples per operation, about 30 s): the issue's own run (~58,000 requests) is for
`schemathesis run http://127.0.0.1:8000/openapi.json` by hand.
"""

import os
import subprocess
import sys
import time

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, settings  # noqa: E402

from tests.test_serve_process import _free_port  # noqa: E402


@pytest.fixture(scope="module")
def base_url(forecast_repository, redis_url):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTSERVE_")}
    env |= {"RTSERVE_MODEL_REPOSITORY": str(forecast_repository[0]), "RTSERVE_REDIS_URL": redis_url,
            "RTSERVE_REDIS_KEY_PREFIX": "fuzz-" + str(os.getpid()), "RTSERVE_LOG_LEVEL": "warning",
            "RTSERVE_API_KEYS": "fuzz-key"}
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "rtserve.cli", "serve", "--port", str(port)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.1)
    yield url
    process.terminate()
    process.wait(timeout=20)


def test_no_input_gives_a_server_error(base_url):
    """Every operation, with a valid key and with a non-ASCII one: any status but 5xx."""
    from hypothesis import given

    api = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    failures, calls = [], 0
    for result in api.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=20, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck), database=None)
        def fuzz(case):
            nonlocal calls
            for headers in ({"X-API-Key": "fuzz-key"}, {"X-API-Key": "cl\u00e9"}):
                response = case.call(base_url=base_url, headers=headers, timeout=10)
                calls += 1
                if response.status_code >= 500:
                    failures.append(f"{case.method} {case.formatted_path} {response.status_code} {response.text[:200]}")

        fuzz()
    assert calls > 100
    assert not failures, failures[:5]
