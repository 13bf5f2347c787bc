"""A document streamed as random text pieces summarizes exactly like the whole document, through the one
summarizer stream (models/summary_stream.py) that the service also wraps.

Tiny random encoder and decoder; only MiniLM's tokenizer file (local, fast) is read.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from models.minilm import BertConfig, MiniLMEncoder, load_minilm_tokenizer
from models.serving.srformer import EagerSummarizer
from models.srformer import SRformer, SRformerConfig, encode_windows

WORDS = ("the dollar has hit its highest level against euro in almost three months after Federal Reserve "
         "head said US trade deficit is set to stabilise. Mr Greenspan's speech — in London — "
         "sent the “greenback” higher; café naïve 47.3% £75m ($141m) Zürich 東京 😀").split()


def document(seed: int, words: int) -> str:
    rng = random.Random(seed)
    out = []
    for i in range(words):
        out.append(rng.choice(WORDS))
        out.append("\n\n" if i % 37 == 36 else " ")
    return "".join(out)


def pieces(text: str, seed: int) -> list[str]:
    """Random cuts at any character: words, numbers and punctuation runs are split."""
    rng = random.Random(seed)
    out, start = [], 0
    while start < len(text):
        size = rng.choice([1, 2, 3, 5, 8, 13, 40, 150])
        out.append(text[start: start + size])
        start += size
    return out


@pytest.fixture(scope="module")
def summarizer_factory():
    tokenizer = load_minilm_tokenizer()

    def make(mode: str, max_source: int = 0, **options: object) -> EagerSummarizer:
        torch.manual_seed(0)
        encoder = MiniLMEncoder(BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                           intermediate_size=32, max_position_embeddings=64)).eval()
        config = SRformerConfig(cross_attention=mode, segment_size=8, embed_dim=16, d_model=16, n_layer=2,
                                n_head=2, d_ff=32, max_target=64, dropout=0.0, encoder_window=20,
                                max_source=max_source, **options)  # type: ignore[arg-type]
        model = SRformer(config).eval()
        with torch.no_grad():
            model.wte.normal_()
        return EagerSummarizer(model, encoder, tokenizer)

    return make


def read(summarizer: EagerSummarizer, parts: list[str]) -> tuple[dict, list]:
    state, chunks = summarizer.init_state(), []
    for part in parts:
        state, chunk = summarizer.feed(state, part)
        if chunk is not None:
            chunks.append(chunk)
    return state, chunks


@pytest.mark.parametrize("mode,max_source,options", [("srformer", 0, {}), ("full", 0, {}), ("srformer", 150, {}),
                                                    ("srformer", 0, {"recurrent_norm": "kernel"}),
                                                    ("full", 150, {"salience": True})])
def test_stream_equals_whole_document(summarizer_factory, mode, max_source, options):
    summarizer = summarizer_factory(mode, max_source, **options)
    text = document(seed=3, words=160)
    whole = summarizer.summarize(text, max_len=12)
    assert len(whole) > 0
    whole_memory, whole_ids, whole_text, whole_salience = summarizer.close(*read(summarizer, [text]))
    streamed_memory, streamed_ids, streamed_text, streamed_salience = summarizer.close(
        *read(summarizer, pieces(text, seed=11)))
    assert np.array_equal(streamed_ids, whole_ids)
    # the document's own text, for sentence copy and its case: all of it, or (a reading limit) up to a few
    # tokens past what the model reads, whatever the pieces
    assert whole_text == text and text.startswith(streamed_text)
    assert streamed_text == text if not max_source else len(streamed_text) < len(text)
    assert whole_salience is None or np.array_equal(streamed_salience, whole_salience)
    for name in whole_memory:
        assert np.array_equal(streamed_memory[name], whole_memory[name]), name
    assert summarizer.summarize_pieces(pieces(text, seed=11), max_len=12) == whole
    # the whole-document path, independent of the stream: every token encoded window by window (K'V summed
    # per window by the stream, in one product here: equal to float rounding)
    ids = torch.tensor(summarizer.tokenizer.encode(text, add_special_tokens=False).ids)
    if max_source:
        ids = ids[:max_source]
    assert whole_ids.shape[1] == len(ids) and np.array_equal(whole_ids[0], ids.numpy())
    c = summarizer.model.config
    with torch.no_grad():
        enc = encode_windows(summarizer.encode_window.encoder, ids, c.encoder_window, c.bos_id, c.eos_id)[None]
        reference = summarizer.model.memory(enc, torch.ones(1, len(ids), dtype=torch.bool), ids[None])
    for layer, expected in enumerate(reference):
        for kind in ("kv", "ksq"):  # the running accumulators: float32
            np.testing.assert_allclose(whole_memory[f"{kind}{layer}"], expected[kind].numpy(), rtol=1e-5, atol=1e-5)
        for kind in ("k", "v"):  # keys and values are stored in float16 (about 3 significant digits)
            np.testing.assert_allclose(whole_memory[f"{kind}{layer}"], expected[kind].numpy(), rtol=2e-3, atol=1e-3)


def test_per_piece_state_write_is_bounded_by_piece_size(summarizer_factory):
    summarizer = summarizer_factory("srformer")
    c = summarizer.model.config
    window = c.encoder_window
    state = summarizer.init_state()
    state_bytes = sum(value.nbytes for value in state.values())
    per_token = 2 * c.n_layer * c.d_model * 2 + 8  # keys + values (stored float16) of every layer + the id
    text_pieces = pieces(document(seed=5, words=200), seed=21)
    appended, chunks = 0, []
    for piece in text_pieces:
        new, chunk = summarizer.feed(state, piece)
        # the bounded state never grows with the document ...
        assert {name: value.shape for name, value in new.items()} == {n: v.shape for n, v in state.items()}
        assert sum(value.nbytes for value in new.values()) == state_bytes
        # ... and a piece appends its own text and only the windows it closed: at most the open window plus
        # its own tokens
        if chunk is not None:
            tokens = chunk["source_ids"].shape[1] if "source_ids" in chunk else 0
            assert sum(value.nbytes for value in chunk.values()) == tokens * per_token + len(piece.encode("utf-8"))
            assert tokens <= len(piece.encode("utf-8")) + window + c.encoder_window
            appended += tokens
            chunks.append(chunk)
        state = new
    _, source_ids, text, _ = summarizer.close(state, chunks)
    assert text == "".join(text_pieces)
    assert appended > 0 and 0 <= source_ids.shape[1] - appended <= window  # finish closes only the open window
