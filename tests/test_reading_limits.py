"""No silent truncation: every text answer says how much of the document the model read.

Past a model's limit (`GET /models`: `max_tokens`) the service either reads the first tokens and says
`truncated: true` (`RTSERVE_OVER_LIMIT=truncate`, the default) or answers 422 and applies nothing
(`refuse`). A document streamed through a session reports the same counts as the document posted whole.
The classifier (RMT: bounded memory) reads every segment of any document, past the 6 segments its tiny
checkpoint was built for; the tiny summarizer reads the first 200 tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from models.minilm import load_minilm_tokenizer
from tests.service_helpers import make_client, random_pieces

SENTENCE = "The committee met on Tuesday, and the minister said the plan would cost more than expected. "


def tokens_of(text: str) -> int:
    return len(load_minilm_tokenizer().encode(text, add_special_tokens=False).ids)


@pytest.fixture(scope="module")
def repository(every_task_repository):
    return every_task_repository


def limits(client) -> dict[str, int | None]:
    return {model["task"]: model["max_tokens"] for model in client.get("/models").json()}


def stream_session(client, task: str, text: str, seed: int) -> tuple[dict, list]:
    session = client.post("/sessions", json={"task": task}).json()
    url = f"/sessions/{session['id']}"
    answers = []
    for seq, piece in enumerate(random_pieces(list(text), np.random.default_rng(seed), 60), start=1):
        response = client.post(f"{url}/segments", json={"seq": seq, "text": "".join(piece)})
        assert response.status_code == 200, response.text
        answers.append(response.json()["result"])
    finish = client.post(f"{url}/finish")
    assert finish.status_code == 200, finish.text
    return finish.json(), answers


def test_the_classifier_reads_every_segment_of_a_long_document(repository, redis_url, key_prefix):
    with make_client(repository, redis_url, key_prefix, over_limit="refuse") as client:
        assert limits(client)["classify"] is None and limits(client)["forecast"] is None
        long = SENTENCE * 40
        assert tokens_of(long) > 3 * 6 * 30  # three times the segments the tiny checkpoint was built for
        whole = client.post("/classify", json={"text": long}).json()
        assert whole["tokens_read"] == whole["tokens_total"] == tokens_of(long) and whole["truncated"] is False
        assert whole["segments"] == -(-tokens_of(long) // 30)
        final, _ = stream_session(client, "classify", long, seed=5)
        assert {k: final[k] for k in whole if k != "model"} == {k: whole[k] for k in whole if k != "model"}


@pytest.mark.parametrize("task", ["summarize"])
def test_a_document_past_the_limit_says_truncated_and_a_stream_reports_the_same_counts(
        repository, redis_url, key_prefix, task):
    with make_client(repository, redis_url, key_prefix) as client:
        limit = limits(client)[task]
        assert limit == 200
        short, long = SENTENCE * 3, SENTENCE * 20
        assert tokens_of(short) < limit < tokens_of(long)
        body = {"text": short} | ({"max_length": 8} if task == "summarize" else {})
        answer = client.post(f"/{task}", json=body).json()
        assert answer["tokens_read"] == answer["tokens_total"] == tokens_of(short) and answer["truncated"] is False
        whole = client.post(f"/{task}", json=body | {"text": long}).json()
        assert whole["tokens_read"] == limit and whole["tokens_total"] == tokens_of(long) and whole["truncated"]
        final, running = stream_session(client, task, long, seed=3)
        assert (final["tokens_read"], final["tokens_total"], final["truncated"]) == (limit, tokens_of(long), True)
        assert [r["truncated"] for r in running][-1] is True and running[0]["truncated"] is False
        assert all(r["tokens_read"] <= limit for r in running)


@pytest.mark.parametrize("task", ["summarize"])
def test_with_refuse_a_document_past_the_limit_is_422_and_a_session_keeps_what_it_read(
        repository, redis_url, key_prefix, task):
    with make_client(repository, redis_url, key_prefix, over_limit="refuse") as client:
        limit = limits(client)[task]
        refused = client.post(f"/{task}", json={"text": SENTENCE * 20})
        assert refused.status_code == 422 and f"first {limit} tokens" in refused.json()["detail"]
        assert client.post(f"/{task}", json={"text": SENTENCE}).status_code == 200
        session = client.post("/sessions", json={"task": task}).json()
        url = f"/sessions/{session['id']}"
        first = client.post(f"{url}/segments", json={"seq": 1, "text": SENTENCE * 2})
        assert first.status_code == 200 and first.json()["result"]["truncated"] is False
        over = client.post(f"{url}/segments", json={"seq": 2, "text": SENTENCE * 20})
        assert over.status_code == 422 and "RTSERVE_OVER_LIMIT" in over.json()["detail"]
        status = client.get(url).json()  # nothing of the refused piece was applied
        assert status["seq"] == 1 and status["consumed"] == first.json()["session"]["consumed"]
        retry = client.post(f"{url}/segments", json={"seq": 2, "text": SENTENCE})
        assert retry.status_code == 200 and retry.json()["result"]["tokens_total"] == tokens_of(SENTENCE * 3)
