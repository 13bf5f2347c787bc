"""A 3,000-word article through a summarization session gives exactly the one-shot summary.

A SumPubMed-length input: the real MiniLM encoder with its full 510-token windows, every token
read (``max_source = 0``), about eight windows; the decoder is tiny and random. The text is a real
SumPubMed article when ../shared/data is beside the checkout, otherwise generated.
"""

from pathlib import Path

import numpy as np
import pytest

from export.exporter import export_checkpoint
from tests.service_helpers import random_pieces
from tests.tiny_checkpoints import tiny_srformer

SUMPUBMED = Path(__file__).resolve().parents[2] / "shared" / "data" / "sumpubmed"


def long_article(words: int = 3000) -> str:
    if SUMPUBMED.exists():
        from models.data import sumpubmed

        for key in sumpubmed.split_keys(SUMPUBMED, "train"):
            body = sumpubmed.read_pair(SUMPUBMED, key).body
            if len(body.split()) >= words:
                return " ".join(body.split(" ")[:words])
    rng = np.random.default_rng(0)
    vocabulary = "cell gene expression protein patients <dig> % <cit> significantly increased the of and in".split()
    return " ".join(rng.choice(vocabulary, words))


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("long-document")
    checkpoint = tiny_srformer(root / "weights" / "srformer-long", encoder_window=510, max_source=0)
    export_checkpoint(checkpoint, root / "repository", formats=("onnx",))
    return root / "repository", checkpoint


def test_three_thousand_word_article_streamed_in_pieces_equals_the_whole(client):
    text = long_article()
    assert len(text.split()) >= 2900
    whole = client.post("/summarize", json={"text": text, "max_length": 30})
    assert whole.status_code == 200, whole.text
    assert whole.json()["tokens_read"] > 3 * 510  # several full encoder windows were read
    session = client.post("/sessions", json={"task": "summarize"}).json()
    url = f"/sessions/{session['id']}"
    pieces = random_pieces(list(text), np.random.default_rng(7), 4000)  # cuts fall mid-word
    for seq, piece in enumerate(pieces, start=1):
        response = client.post(f"{url}/segments", json={"seq": seq, "text": "".join(piece)})
        assert response.status_code == 200, response.text
    final = client.post(f"{url}/finish", json={"max_length": 30})
    assert final.status_code == 200, final.text
    assert final.json()["summary"] == whole.json()["summary"]
    assert client.get(url).json()["consumed"] == whole.json()["tokens_read"]
