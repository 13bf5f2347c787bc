"""The classify endpoint and classification sessions, over HTTP with a real Redis."""

import numpy as np
import pytest
import torch

from models.rmt import load_rmt
from tests.service_helpers import make_client, random_pieces

SEGMENT = 32
WORDS = (
    "The senator's bill—passed on Monday—would raise taxes; critics, naïvely, called it 'a disaster'. "
    "Markets fell 3.5% as investors (and unions) worried about wages, prices & jobs in Zürich and 東京."
).split(" ")


@pytest.fixture(scope="module")
def repository(classify_repository):
    """The shared tiny RMT (segments of SEGMENT tokens, at most 6), in ONNX."""
    return classify_repository


def document(rng, words):
    return " ".join(rng.choice(WORDS) for _ in range(words))


def eager_probabilities(checkpoint, text):
    from models.minilm import load_minilm_tokenizer
    from models.text_stream import SegmentCutter

    rmt = load_rmt(str(checkpoint))
    cutter = SegmentCutter(load_minilm_tokenizer(), SEGMENT, rmt.config.max_segments)
    state, output = rmt.init_state(1), {}
    with torch.no_grad():
        for ids, mask in cutter.segments(text):
            state, output = rmt.step(state, {"input_ids": torch.from_numpy(ids)[None],
                                             "attention_mask": torch.from_numpy(mask)[None]})
    return rmt.readout(state, output)[0].numpy()


def test_classify_matches_the_eager_model(client, repository):
    text = document(np.random.default_rng(), 60)
    response = client.post("/classify", json={"text": text})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body["probabilities"]) == {"mainstream", "hyperpartisan"}
    assert body["segments"] >= 2
    expected = eager_probabilities(repository[1], text)
    np.testing.assert_allclose([body["probabilities"]["mainstream"], body["probabilities"]["hyperpartisan"]],
                               expected, atol=1e-4)


def test_stream_in_random_text_pieces_equals_whole(client):
    rng = np.random.default_rng()
    text = document(rng, 70)
    whole = client.post("/classify", json={"text": text}).json()
    session = client.post("/sessions", json={"task": "classify"}).json()
    running = []
    for seq, piece in enumerate(random_pieces(list(text), rng, 40), start=1):
        response = client.post(f"/sessions/{session['id']}/segments", json={"seq": seq, "text": "".join(piece)})
        assert response.status_code == 200, response.text
        running.append(response.json()["result"])
    final = client.post(f"/sessions/{session['id']}/finish").json()
    assert [final[k] for k in ("segments", "tokens_read", "tokens_total", "truncated")] == [
        whole[k] for k in ("segments", "tokens_read", "tokens_total", "truncated")]
    for label, probability in whole["probabilities"].items():
        assert abs(final["probabilities"][label] - probability) <= 1e-5
    # a running prediction is available once a segment is complete, and only then
    completed = [r for r in running if r["segments"] > 0]
    assert completed and all(r["label"] is not None for r in completed)
    assert all(r["label"] is None for r in running if r["segments"] == 0)


def test_session_state_stays_bounded_as_the_document_grows(client):
    rng = np.random.default_rng()
    session = client.post("/sessions", json={"task": "classify"}).json()
    sizes = []
    for seq in range(1, 9):
        client.post(f"/sessions/{session['id']}/segments", json={"seq": seq, "text": document(rng, 30) + " "})
        sizes.append(client.get(f"/sessions/{session['id']}").json()["state_bytes"])
    assert max(sizes) == min(sizes), sizes


def test_text_without_a_token_oversized_or_non_string_text_is_refused(client, repository, redis_url, key_prefix):
    for text in ("", " \n\t  ", "\u0000\u0000\u0000"):  # empty, whitespace, NUL: nothing to classify
        empty = client.post("/classify", json={"text": text})
        assert empty.status_code == 422 and empty.json()["errors"][0]["loc"] == ["body", "text"], empty.text
        assert "no visible character" in empty.json()["detail"]
    wrong = client.post("/classify", json={"text": 5})
    assert wrong.status_code == 422 and isinstance(wrong.json()["detail"], str)
    assert wrong.json()["errors"][0]["loc"] == ["body", "text"] and wrong.json()["request_id"]
    with make_client(repository[0], redis_url, key_prefix, max_text_chars=100) as small:
        response = small.post("/classify", json={"text": "word " * 50})
        assert response.status_code == 422 and "limit is 100" in response.json()["detail"]


def test_empty_pieces_are_taken_but_a_session_without_a_token_is_not_finished(client):
    session = client.post("/sessions", json={"task": "classify"}).json()["id"]
    for seq, piece in enumerate(("", "   ", "\u0000\n"), start=1):  # a piece may be any cut of the document
        assert client.post(f"/sessions/{session}/segments", json={"seq": seq, "text": piece}).status_code == 200
    empty = client.post(f"/sessions/{session}/finish")  # a conflict with the session's state: it has no text yet
    assert empty.status_code == 409 and empty.json()["expected_seq"] == 4, empty.text
    assert "no text the model reads" in empty.json()["detail"]
    assert client.get(f"/sessions/{session}").json()["status"] == "open"  # still open: send the text, then finish
    assert client.post(f"/sessions/{session}/segments", json={"seq": 4, "text": "The senator said"}).status_code == 200
    finished = client.post(f"/sessions/{session}/finish")
    assert finished.status_code == 200 and finished.json()["label"] is not None


async def test_documents_of_different_lengths_share_segment_batches(repository):
    """Every segment is padded to the segment size, so the last, partial segments of documents of any
    length stack with full ones; each answer equals the document's answer alone (to float tolerance)."""
    import asyncio

    from service.runtime.pipeline import run_whole
    from service.runtime.registry import load_model
    from service.settings import Settings

    model = load_model(repository[0] / "rmt-tiny" / "1", "onnx", Settings(model_repository=repository[0]))
    step = model.batchers["step"]
    rows, inner = [], step.backend

    class Recording:
        name, providers = inner.name, inner.providers

        def run(self, inputs, keep=()):
            rows.append(len(inputs["memory"]))
            return inner.run(inputs, keep)

    step.backend = Recording()
    rng = np.random.default_rng()
    texts = [document(rng, words) for words in (7, 23, 41, 66, 90)]
    alone = [(await run_whole(model.pipeline, text))[1].result for text in texts]
    assert max(rows) == 1
    rows.clear()
    together = [finished.result for _, finished in await asyncio.gather(*(run_whole(model.pipeline, t) for t in texts))]
    assert max(rows) == len(texts)  # first segments of all five documents in one call
    for one, other in zip(alone, together, strict=True):
        assert one["label"] == other["label"] and one["segments"] == other["segments"]
        np.testing.assert_allclose(list(one["probabilities"].values()), list(other["probabilities"].values()),
                                   atol=1e-5)
    await step.close()


def test_the_segments_metric_counts_each_segment_the_model_reads_once(repository, redis_url, key_prefix):
    from prometheus_client.parser import text_string_to_metric_families

    def counted(client):
        text = client.get("/metrics").text
        return sum(s.value for f in text_string_to_metric_families(text) if f.name == "rtserve_segments_processed"
                   for s in f.samples if s.name.endswith("_total") and s.labels["model"] == "rmt-tiny:1")

    rng = np.random.default_rng(11)
    text = document(rng, 150)
    with make_client(repository[0], redis_url, key_prefix) as client:
        before = counted(client)
        whole = client.post("/classify", json={"text": text}).json()
        assert counted(client) - before == whole["segments"] > 2
        sid = client.post("/sessions", json={"task": "classify"}).json()["id"]
        for seq, piece in enumerate(random_pieces(list(text), rng, 120), start=1):
            client.post(f"/sessions/{sid}/segments", json={"seq": seq, "text": "".join(piece)})
        client.post(f"/sessions/{sid}/segments", json={"seq": seq, "text": "".join(piece)})  # a retry: replayed
        finished = client.post(f"/sessions/{sid}/finish").json()
        client.post(f"/sessions/{sid}/finish")  # finished again: the stored answer
        assert finished["segments"] == whole["segments"]
        assert counted(client) - before == 2 * whole["segments"]
