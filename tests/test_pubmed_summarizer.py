"""The shipped long-document summarizer, srformer-pubmed, as served: a whole SumPubMed article streamed
through a session gives exactly the one-shot summary, the answer says how much of the article the model
read, and the session's stored state at 4,096 source tokens is what its chunk layout says (keys and values in fp16).

Runs where ../shared/data/sumpubmed is beside the checkout (CI: it is).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from export.exporter import export_checkpoint
from tests.service_helpers import make_client, random_pieces

ROOT = Path(__file__).resolve().parents[1]
SUMPUBMED = ROOT.parent / "shared" / "data" / "sumpubmed"
pytestmark = pytest.mark.skipif(not SUMPUBMED.exists(), reason="SumPubMed is not beside the checkout")


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    out = tmp_path_factory.mktemp("pubmed") / "repository"
    export_checkpoint(ROOT / "weights" / "srformer-pubmed", out, formats=("onnx",))
    return out


def long_test_article(min_tokens: int) -> str:
    from models.data import sumpubmed
    from models.minilm import load_minilm_tokenizer

    tokenizer = load_minilm_tokenizer()
    for key in sumpubmed.split_keys(SUMPUBMED, "test"):
        text = sumpubmed.read_pair(SUMPUBMED, key).document
        if len(tokenizer.encode(text, add_special_tokens=False).ids) > min_tokens:
            return text
    raise AssertionError(f"no test article longer than {min_tokens} tokens")


def test_a_whole_article_streamed_through_a_session_equals_the_one_shot_summary(repository, redis_url, key_prefix):
    article = long_test_article(4096)
    with make_client(repository, redis_url, key_prefix) as client:
        model = next(m for m in client.get("/models").json() if m["name"] == "srformer-pubmed")
        assert model["max_tokens"] == 4096 and model["manifest"]["settings"]["no_repeat_ngram"] == 3
        whole = client.post("/summarize", json={"text": article, "model": "srformer-pubmed"})
        assert whole.status_code == 200, whole.text
        whole = whole.json()
        assert whole["tokens_read"] == 4096 and whole["tokens_total"] > 4096 and whole["truncated"] is True
        assert len(whole["summary"].split()) > 50
        session = client.post("/sessions", json={"model": "srformer-pubmed"}).json()
        url = f"/sessions/{session['id']}"
        pieces = random_pieces(list(article), np.random.default_rng(4), 3000)
        for seq, piece in enumerate(pieces, start=1):
            response = client.post(f"{url}/segments", json={"seq": seq, "text": "".join(piece)})
            assert response.status_code == 200, response.text
        chunk_bytes = client.get(url).json()["state_bytes"]
        final = client.post(f"{url}/finish").json()
        assert final["summary"] == whole["summary"]
        assert final["session"]["state_bytes"] == 0  # finished: only its answers are kept
        assert {k: final[k] for k in ("tokens_read", "tokens_total", "truncated", "summary_tokens")} == {
            k: whole[k] for k in ("tokens_read", "tokens_total", "truncated", "summary_tokens")}
        # stored state: the bounded part plus, per source token, its id and each layer's key and value
        settings = model["manifest"]["settings"]
        stored = {spec["name"]: spec["dtype"] for spec in settings["chunk_spec"]}
        assert stored["k0"] == stored["v0"] == "float16"
        per_token = 8 + 4 + settings["n_layer"] * 2 * settings["n_head"] * settings["head_dim"] * 2  # id, salience
        # and the text up to a few tokens past the limit
        assert 4096 * per_token <= chunk_bytes <= 4096 * per_token + 256 * 1024
