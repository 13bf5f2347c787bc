"""Load test for a running rtserve: one-shot requests and streaming sessions, for every loaded task.

    locust -f loadtest/locustfile.py --host http://127.0.0.1:8000 --headless -u 32 -r 8 -t 2m

Set RTSERVE_API_KEY when the service requires a key. The users ask GET /models once and exercise only
the tasks that are loaded; inputs are generated, so no dataset is needed.
"""

from __future__ import annotations

import os
import random
from typing import Any

from locust import HttpUser, between, events, task

WORDS = (
    "the minister said on monday that the bank would raise interest rates after inflation rose faster than "
    "markets expected while unions warned that wages were falling behind prices across the country"
).split()

LOADED: dict[str, dict] = {}  # task -> manifest settings of its first model


def _headers() -> dict[str, str]:
    key = os.environ.get("RTSERVE_API_KEY")
    return {"X-API-Key": key} if key else {}


@events.test_start.add_listener
def discover_models(environment: Any, **_: object) -> None:
    """The loaded tasks and their defaults' settings, through rtserve's own client (the load itself goes through
    locust's client, which records every request's timing)."""
    from rtserve.client import Client

    with Client(environment.host, api_key=os.environ.get("RTSERVE_API_KEY"), timeout=30) as client:
        for model in sorted(client.models(), key=lambda m: not m["default"]):  # each task's default first
            LOADED.setdefault(model["task"], model["manifest"]["settings"])


def _text(words: int) -> str:
    return " ".join(random.choice(WORDS) for _ in range(words)) + "."


def _rows(count: int) -> list[list[float]]:
    width = len(LOADED["forecast"]["variables"])
    return [[round(random.gauss(10, 3), 3) for _ in range(width)] for _ in range(count)]


class RtserveUser(HttpUser):
    wait_time = between(0.05, 0.2)

    @task(4)
    def forecast(self) -> None:
        if "forecast" in LOADED:
            rows = _rows(LOADED["forecast"]["lookback"] + random.randint(0, 48))
            self.client.post("/forecast", json={"rows": rows}, headers=_headers(), name="/forecast")

    @task(3)
    def classify(self) -> None:
        if "classify" in LOADED:
            self.client.post("/classify", json={"text": _text(random.randint(100, 900))}, headers=_headers())

    @task(1)
    def summarize(self) -> None:
        if "summarize" in LOADED:
            self.client.post("/summarize", json={"text": _text(random.randint(100, 400))}, headers=_headers())

    @task(2)
    def session(self) -> None:
        if not LOADED:
            return
        kind = random.choice(sorted(LOADED))
        created = self.client.post("/sessions", json={"task": kind}, headers=_headers(), name="/sessions")
        if created.status_code != 201:
            return
        url = f"/sessions/{created.json()['id']}"
        for seq in range(1, random.randint(2, 5) + 1):
            if kind == "forecast":  # the first piece brings the look-back, so /finish has a forecast
                piece = {"rows": _rows(LOADED["forecast"]["lookback"] if seq == 1 else random.randint(8, 64))}
            else:
                piece = {"text": _text(80) + " "}
            self.client.post(f"{url}/segments", json={"seq": seq, **piece}, headers=_headers(),
                             name="/sessions/{id}/segments")
        self.client.post(f"{url}/finish", headers=_headers(), name="/sessions/{id}/finish")
        self.client.delete(url, headers=_headers(), name="/sessions/{id}")
