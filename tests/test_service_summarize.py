"""The summarize endpoint and summarization sessions, over HTTP with a real Redis."""

import json
import math
import re
import time

import numpy as np
import pytest

from tests.service_helpers import random_pieces

TEXT = (
    "Shares in the bank rose 5% on Monday after it reported record profits. The chief executive said demand "
    "for loans had grown in every region, while costs fell for a third year. Analysts, however, warned that "
    "rising interest rates could slow lending next year. The bank will pay a dividend of 12p a share, up from "
    "10p, and plans to open forty branches. Unions welcomed the news but asked for higher wages for staff."
)


@pytest.fixture(scope="module")
def repository(summarize_repository):
    return summarize_repository


@pytest.mark.parametrize("decoding", ["sentence", "free"])
def test_summary_equals_the_eager_models_summary(client, repository, decoding):
    from models.minilm import load_minilm_encoder, load_minilm_tokenizer
    from models.serving.srformer import EagerSummarizer
    from models.srformer_weights import load_srformer

    response = client.post("/summarize", json={"text": TEXT, "max_length": 40, "decoding": decoding})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "srformer-tiny:1" and body["tokens_read"] > 60 and 0 < body["summary_tokens"] <= 40
    assert body["decoding"] == decoding
    stream = EagerSummarizer(load_srformer(str(repository[1])), load_minilm_encoder(), load_minilm_tokenizer())
    assert body["summary"] == stream.summarize(TEXT, no_repeat_ngram=3, max_len=40, decoding=decoding)
    assert body["summary"][:1].isupper()  # the document's case: an uncased vocabulary does not show


def test_the_default_decoding_of_a_model_with_a_salience_head_copies_whole_sentences(client):
    body = client.post("/summarize", json={"text": TEXT}).json()
    assert body["decoding"] == "sentence"
    copied = re.split(r"(?<=\.) ", body["summary"])
    assert copied and all(sentence in TEXT for sentence in copied), body["summary"]


@pytest.mark.parametrize("decoding", ["sentence", "free"])
def test_stream_in_random_pieces_equals_whole_and_writes_only_new_state(client, decoding):
    rng = np.random.default_rng()
    whole = client.post("/summarize", json={"text": TEXT, "max_length": 40, "decoding": decoding}).json()["summary"]
    session = client.post("/sessions", json={"task": "summarize"}).json()
    url = f"/sessions/{session['id']}"
    previous_bytes = client.get(url).json()["state_bytes"]
    for seq, piece in enumerate(random_pieces(list(TEXT), rng, 60), start=1):
        text = "".join(piece)
        response = client.post(f"{url}/segments", json={"seq": seq, "text": text})
        assert response.status_code == 200, response.text
        status = response.json()["session"]
        # a piece adds its own text and windows: keys/values (2 layers x k,v x 2 heads x 16 dims x fp32), id and
        # salience per token, plus the bounded state's safetensors header: never a rewrite of what came before
        per_token = 2 * 2 * 2 * 16 * 4 + 8 + 4
        grown = status["state_bytes"] - previous_bytes
        assert grown <= per_token * max(status["consumed"], 0) + len(text.encode()) + 4096
        previous_bytes = status["state_bytes"]
    final = client.post(f"{url}/finish", json={"max_length": 40, "decoding": decoding}).json()
    assert final["summary"] == whole


def test_a_session_stops_keeping_text_a_few_tokens_past_what_the_model_reads(client):
    session = client.post("/sessions", json={"task": "summarize"}).json()
    url = f"/sessions/{session['id']}"
    sizes = []
    for seq in range(1, 9):  # the tiny model reads 200 tokens; TEXT is about 90
        answer = client.post(f"{url}/segments", json={"seq": seq, "text": TEXT + " "}).json()
        sizes.append(answer["session"]["state_bytes"])
    assert answer["result"]["truncated"] is True
    assert sizes[-1] == sizes[-2] == sizes[-3]  # past the limit (and 64 tokens more), a piece stores nothing
    final = client.post(f"{url}/finish").json()
    whole = client.post("/summarize", json={"text": (TEXT + " ") * 8}).json()
    assert final["summary"] == whole["summary"] and final["summary"]


def _events(client, url, body):
    with client.stream("POST", url, json=body, headers={"accept": "text/event-stream"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events, data = [], []
        for line in response.iter_lines():
            if line.startswith("event:"):
                events.append(line.split(":", 1)[1].strip())
            elif line.startswith("data:"):
                data.append(json.loads(line.split(":", 1)[1]))
    assert events[-1] == "done" and events.count("token") >= 1
    return "".join(d["text"] for d, e in zip(data, events, strict=True) if e == "token"), data[-1]


@pytest.mark.parametrize("decoding", ["sentence", "free"])
def test_summary_streams_as_server_sent_events_one_shot_and_session(client, decoding):
    streamed, done = _events(client, "/summarize", {"text": TEXT, "max_length": 30, "decoding": decoding})
    assert streamed == done["summary"]
    plain = client.post("/summarize", json={"text": TEXT, "max_length": 30, "decoding": decoding}).json()
    assert plain["summary"] == done["summary"]
    session = client.post("/sessions", json={"task": "summarize"}).json()
    url = f"/sessions/{session['id']}"
    for seq, piece in enumerate((TEXT[:101], TEXT[101:250], TEXT[250:]), start=1):
        assert client.post(f"{url}/segments", json={"seq": seq, "text": piece}).status_code == 200
    streamed, done = _events(client, f"{url}/finish", {"max_length": 30, "decoding": decoding})
    assert streamed == done["summary"] == plain["summary"]


def test_free_decoding_writes_the_models_summary_length_before_it_may_end(client, repository, monkeypatch):
    """The searches keep the end token out until the model's length (tests/test_decoding.py); here, that the
    service gives them that length."""
    from service.runtime import summarize

    settings = json.loads((repository[0] / "srformer-tiny" / "1" / "manifest.json").read_text())["settings"]
    built = []
    for name in ("GreedySearch", "BeamSearch"):
        real = getattr(summarize, name)

        def spy(*args, real=real, **kwargs):
            search = real(*args, **kwargs)
            built.append(search)
            return search

        monkeypatch.setattr(summarize, name, spy)
    for beams in (1, 3):
        body = client.post("/summarize", json={"text": TEXT, "decoding": "free", "beam_size": beams}).json()
        target = settings["summary_length"] or math.ceil(settings["summary_ratio"] * body["tokens_read"])
        search = built.pop()
        assert search.rows == beams and search.min_length == search.target == target > 0
        assert body["summary_tokens"] >= target


def test_beam_search_and_documents_without_a_visible_character_are_422(client):
    beam = client.post("/summarize", json={"text": TEXT, "max_length": 20, "beam_size": 3, "decoding": "free"})
    assert beam.status_code == 200 and beam.json()["summary_tokens"] <= 20
    implied = client.post("/summarize", json={"text": TEXT, "max_length": 20, "beam_size": 3}).json()
    assert implied["decoding"] == "free" and implied["summary"] == beam.json()["summary"]  # a beam: the decoder
    copied = client.post("/summarize", json={"text": TEXT, "beam_size": 3, "decoding": "sentence"}).json()
    assert copied["decoding"] == "sentence"  # named: sentence copy, which runs no search
    unknown = client.post("/summarize", json={"text": TEXT, "decoding": "abstractive"})
    assert unknown.status_code == 422 and unknown.json()["errors"][0]["loc"] == ["body", "decoding"]
    for text in ("", "   \n\t", "\u0000\u0000", "\u3000\ufeff\u0085"):
        for stream in (False, True):  # refused before a stream begins: a JSON 422, never an empty summary
            empty = client.post("/summarize", json={"text": text, "stream": stream})
            assert empty.status_code == 422 and empty.headers["content-type"] == "application/json", empty.text
            assert empty.json()["errors"][0]["loc"] == ["body", "text"]
            assert "no visible character" in empty.json()["detail"]
    assert client.post("/summarize", json={"text": TEXT, "beam_size": 99}).status_code == 422


class RecordingBackend:
    """Wraps a backend and records the rows of every call. ``hold`` (a condition), when set, holds the next
    call until it is true (at most 10 s)."""

    def __init__(self, inner):
        self.inner, self.name, self.providers, self.rows = inner, inner.name, inner.providers, []
        self.hold = None

    def run(self, inputs, keep=()):
        if self.hold is not None:
            deadline = time.monotonic() + 10
            while not self.hold() and time.monotonic() < deadline:
                time.sleep(0.001)
            self.hold = None
        self.rows.append(len(inputs["token"]))
        return self.inner.run(inputs, keep)

    def drop_kept(self):
        self.inner.drop_kept()


DOCUMENTS = [
    TEXT,
    "The council voted to close the library on Sundays. Residents said the cut would hurt students.",
    "Rain is expected across the north on Friday, with winds of up to 50mph on the coast. " * 3,
    "The club signed a striker for a record fee. " + TEXT[:200],
]


async def test_different_documents_share_decode_batches_and_each_equals_its_solo_summary(repository):
    import asyncio

    from service.runtime.pipeline import run_whole
    from service.runtime.registry import load_model
    from service.settings import Settings

    model = load_model(repository[0] / "srformer-tiny" / "1", "onnx", Settings(model_repository=repository[0]))
    assert "output_head" in model.batchers  # candidates from the document: the output layer is folded per document
    decode = model.batchers["decode_step"]
    decode.backend = recording = RecordingBackend(decode.backend)
    options = [{"max_length": 40, "decoding": "free"}, {"max_length": 25, "decoding": "free"},
               {"max_length": 33, "beam_size": 3, "decoding": "free"}, {"max_length": 12, "decoding": "free"}]
    solo = []
    for text, option in zip(DOCUMENTS, options, strict=True):
        _, finished = await run_whole(model.pipeline, text, options=option)
        solo.append(finished.result)
    assert max(recording.rows) == 3  # alone: one row, or the beams of one document
    recording.rows.clear()

    async def late(text, option):  # joins a batch that is already decoding
        await asyncio.sleep(0.05)
        return await run_whole(model.pipeline, text, options=option)

    async def finish(consumed, option):  # run_whole's second half: the document is already read
        chunks = [consumed.chunk] if consumed.chunk else []
        return consumed, await model.pipeline.finish(consumed.state, chunks, consumed.result, options=option)

    # the three documents are read first, so their searches start decoding together whatever the encoder's
    # timing (run_whole on all of them at once let one finish before another began: a flaky batch size);
    # each search folds its output layer first (output_head, one call per vocabulary), so the first decode
    # step is held until all three searches are in the loop: the others join at the next step
    read = [await model.pipeline.consume(model.pipeline.new_state(), text) for text in DOCUMENTS[:3]]
    recording.hold = lambda: len(decode._members) + len(decode._arrivals) >= 3
    runs = [finish(consumed, option) for consumed, option in zip(read, options[:3], strict=True)]
    together = await asyncio.gather(*runs, late(DOCUMENTS[3], options[3]))
    assert [finished.result for _, finished in together] == solo
    assert max(recording.rows) >= 5  # different sources, vocabularies and positions in one step
    assert len(recording.rows) < sum(r["summary_tokens"] for r in solo)  # far fewer steps than tokens
    for runner in model.batchers.values():
        await runner.close()


@pytest.mark.slow
async def test_a_model_over_all_of_wordpiece_folds_no_output_layer_and_serves_the_eager_summary(tmp_path):
    """Folded per document, the output layer of a model over all 30,522 ids would be 30,522 x d numbers per
    row: such a model's decode graph applies it as written, and no output_head graph is exported. This one has
    no salience head either: it writes freely by default, and refuses sentence copy with a 422."""
    from export.exporter import export_checkpoint
    from models.minilm import load_minilm_encoder, load_minilm_tokenizer
    from models.serving.srformer import EagerSummarizer
    from models.srformer_weights import load_srformer
    from service.runtime.pipeline import InputError, run_whole
    from service.runtime.registry import load_model
    from service.settings import Settings
    from tests.tiny_checkpoints import tiny_srformer

    checkpoint = tiny_srformer(tmp_path / "weights" / "srformer-wordpiece", output_vocab="full", salience=False)
    entry = export_checkpoint(checkpoint, tmp_path / "repository", formats=("onnx",))
    manifest = json.loads((entry / "manifest.json").read_text())
    assert [graph["name"] for graph in manifest["graphs"]] == ["encode_window", "decode_step"]
    model = load_model(entry, "onnx", Settings(model_repository=tmp_path / "repository"))
    _, finished = await run_whole(model.pipeline, TEXT, options={"max_length": 20})
    eager = EagerSummarizer(load_srformer(str(checkpoint)), load_minilm_encoder(), load_minilm_tokenizer())
    assert finished.result["summary"] == eager.summarize(TEXT, no_repeat_ngram=3, max_len=20)
    assert finished.result["summary_tokens"] > 0 and finished.result["decoding"] == "free"
    with pytest.raises(InputError, match="no salience head"):
        await run_whole(model.pipeline, TEXT, options={"decoding": "sentence"})
    for runner in model.batchers.values():
        await runner.close()
