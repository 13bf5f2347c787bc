"""A document streamed as random text pieces summarizes exactly like the whole document.

Tiny random encoder and decoder; only MiniLM's tokenizer file (local, fast) is read.
"""

from __future__ import annotations

import random

import pytest
import torch

from models.minilm import BertConfig, MiniLMEncoder, load_minilm_tokenizer
from models.srformer import SRformer, SRformerConfig, SummarizerStream, text_bytes

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


def pieces(data: bytes, seed: int) -> list[bytes]:
    """Random cuts at any byte: words and multi-byte characters are split."""
    rng = random.Random(seed)
    out, start = [], 0
    while start < len(data):
        size = rng.choice([1, 2, 3, 5, 8, 13, 40, 150])
        out.append(data[start: start + size])
        start += size
    return out


@pytest.fixture(scope="module")
def stream_factory():
    tokenizer = load_minilm_tokenizer()

    def make(mode: str, max_source: int = 0) -> SummarizerStream:
        torch.manual_seed(0)
        encoder = MiniLMEncoder(BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                           intermediate_size=32, max_position_embeddings=64)).eval()
        config = SRformerConfig(cross_attention=mode, segment_size=8, embed_dim=16, d_model=16, n_layer=2,
                                n_head=2, d_ff=32, max_target=64, dropout=0.0, encoder_window=20,
                                max_source=max_source)
        model = SRformer(config).eval()
        with torch.no_grad():
            model.wte.normal_()
        return SummarizerStream(model, encoder, tokenizer)

    return make


@pytest.mark.parametrize("mode,max_source", [("srformer", 0), ("full", 0), ("srformer", 150)])
def test_stream_equals_whole_document(stream_factory, mode, max_source):
    stream = stream_factory(mode, max_source)
    text = document(seed=3, words=160)
    whole_state, _ = stream.step(stream.init_state(1), {"text": text_bytes(text)})
    whole = stream.readout(whole_state, max_len=12)
    assert len(whole) > 0
    for seed in (11,):
        state = stream.init_state(1)
        for piece in pieces(text.encode("utf-8"), seed):
            state, _ = stream.step(state, {"text": torch.tensor(list(piece), dtype=torch.uint8)[None]})
        final_whole, final_stream = stream.finish(whole_state), stream.finish(state)
        for name in final_whole:
            assert torch.equal(final_stream[name], final_whole[name]), name
        assert stream.readout(state, max_len=12) == whole
    if max_source:
        assert stream.finish(whole_state)["source_ids"].shape[1] == max_source


APPEND_ONLY = ("source_ids", "k0", "v0", "k1", "v1")


def test_per_piece_state_write_is_bounded_by_piece_size(stream_factory):
    stream = stream_factory("srformer")
    window = stream.model.config.encoder_window
    state = stream.init_state(1)
    constant_bytes = sum(state[name].numel() * state[name].element_size()
                         for name in state if name.startswith(("kv", "ksq")))
    c = stream.model.config
    per_token = 2 * c.n_layer * c.d_model * 4 + 8  # keys + values (float32) of every layer + the id
    total_written = 0
    for piece in pieces(document(seed=5, words=200).encode("utf-8"), seed=21):
        new, _ = stream.step(state, {"text": torch.tensor(list(piece), dtype=torch.uint8)[None]})
        appended_tokens = new["source_ids"].shape[1] - state["source_ids"].shape[1]
        written = 0
        for name in APPEND_ONLY:  # append-only: the old tensor is a prefix of the new one
            old, cur = state[name], new[name]
            axis = 1 if name == "source_ids" else 2
            assert torch.equal(cur.narrow(axis, 0, old.shape[axis]), old), name
            written += (cur.numel() - old.numel()) * cur.element_size()
        assert written == appended_tokens * per_token
        # a piece closes at most the open window plus its own tokens (<= its bytes, + a split word)
        assert appended_tokens <= len(piece) + window + state["pending_text"].shape[1]
        small = sum(new[name].numel() * new[name].element_size() for name in ("pending_text", "pending_ids"))
        assert small <= (window + 64) * 8
        total_written += written + constant_bytes + small
        state = new
    final = sum(state[name].numel() * state[name].element_size() for name in APPEND_ONLY)
    assert final > 0
    # never rewrites the document: all writes = final append-only bytes + O(1) per piece
    assert total_written - final <= len(pieces(document(seed=5, words=200).encode("utf-8"), seed=21)) * (
        constant_bytes + (window + 64) * 8)
