"""Streaming RMT: text sent in random pieces == the whole document, with bounded state."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from models.minilm import BertConfig, load_minilm_tokenizer  # noqa: E402
from models.rmt import RMTConfig, build_rmt  # noqa: E402
from models.rmt_stream import RMTStream, classify_documents, last_cut, torch_segments  # noqa: E402
from models.text_stream import SegmentCutter  # noqa: E402

WORDS = [
    "the", "Senate", "voted", "on", "Tuesday", "unbelievably", "élan", "café", "naïve", "Straße",
    "COVID-19", "$3.5", "trillion", "U.S.", "don't", "e-mail", "http://example.com/a?b=c", "北京", "欢迎",
    "Ωmega", "emoji🙂", "tab\there", "(parenthetical)", "quote\u201cd\u201d", "a\u0301ccent",
    "nonbreaking\u00a0space", "x" * 130, "hyper-partisan", "—", "…", "ĳ", "Ｆｕｌｌ", "\n\n", "  ",
]


def random_document(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def random_pieces(rng: random.Random, text: str) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        n = rng.choice([1, 1, 2, 3, 5, 8, 13, 40, 200])
        pieces.append(text[i : i + n])
        i += n
    return pieces


@pytest.fixture(scope="module")
def tokenizer():
    return load_minilm_tokenizer()


def tiny_model(max_segments: int, memory_layer: int = 1, seed: int = 0):
    torch.manual_seed(seed)
    bert = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      max_position_embeddings=64)
    config = RMTConfig(memory_size=4, segment_size=16, max_segments=max_segments, memory_layer=memory_layer, bert=bert)
    model = build_rmt(config).eval()
    with torch.no_grad():  # non-trivial head so probabilities move
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def stream(model, tokenizer, pieces):
    session = RMTStream(model, tokenizer)
    state = session.init_state()
    running = []
    for piece in pieces:
        state, preds = session.feed(state, piece)
        running += preds
    state, final = session.finish(state)
    return state, running, final


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stream_equals_whole_document(tokenizer, seed):
    rng = random.Random(seed)
    model = tiny_model(max_segments=1000)
    text = random_document(rng, 400)
    whole = classify_documents(model, SegmentCutter(tokenizer, 16, 1000), [text])
    _, _, final = stream(model, tokenizer, random_pieces(rng, text))
    assert torch.allclose(final, whole, atol=1e-5, rtol=0), (final, whole)
    assert (final - 0.5).abs().max() > 1e-3  # not a degenerate constant


def test_running_prediction_after_every_segment(tokenizer):
    rng = random.Random(7)
    model = tiny_model(max_segments=1000)
    text = random_document(rng, 300)
    cutter = SegmentCutter(tokenizer, 16, 1000)
    segments = torch_segments(cutter, text)
    _, running, _ = stream(model, tokenizer, random_pieces(rng, text))
    # one running prediction per complete (full) segment, equal to the whole-path prefix fold
    n_full = len(cutter.token_ids(text)) // cutter.content_size
    assert len(running) == n_full and n_full >= 10
    state = model.init_state(1)
    with torch.no_grad():
        for t in range(n_full):
            ids, mask = segments[t]
            state, out = model.step(state, {"input_ids": ids[None], "attention_mask": mask[None]})
            assert torch.allclose(running[t], model.readout(state, out), atol=1e-5, rtol=0)


def test_max_segments_truncates_like_whole_path(tokenizer):
    rng = random.Random(3)
    model = tiny_model(max_segments=3, memory_layer=0)
    text = random_document(rng, 200)
    whole = classify_documents(model, SegmentCutter(tokenizer, 16, 3), [text])
    state, running, final = stream(model, tokenizer, random_pieces(rng, text))
    assert len(running) == 3 and int(state["segments_done"][0]) == 3
    assert torch.allclose(final, whole, atol=1e-5, rtol=0)


def test_state_size_bounded(tokenizer):
    rng = random.Random(11)
    model = tiny_model(max_segments=10_000)
    session = RMTStream(model, tokenizer)
    sizes = []
    for n_words in (20, 600):
        state, _, _ = stream(model, tokenizer, random_pieces(rng, random_document(rng, n_words)))
        sizes.append({k: (tuple(v.shape), v.dtype) for k, v in state.items()})
    assert sizes[0] == sizes[1]
    spec = {s.name: s for s in session.state_spec()}
    assert set(spec) == set(sizes[0])


def test_overlong_word_becomes_one_unk_like_whole_path(tokenizer):
    model = tiny_model(max_segments=1000)
    text = "start " + "z" * 3000 + " end, " + "y" * 1500 + "!tail"
    whole = classify_documents(model, SegmentCutter(tokenizer, 16, 1000), [text])
    rng = random.Random(5)
    _, _, final = stream(model, tokenizer, random_pieces(rng, text))
    assert torch.allclose(final, whole, atol=1e-5, rtol=0)


def test_batched_fold_matches_one_by_one(tokenizer):
    """Documents of different lengths batch together: padding segments leave the memory unchanged."""
    rng = random.Random(9)
    model = tiny_model(max_segments=1000)
    texts = [random_document(rng, n) for n in (5, 80, 300)]
    cutter = SegmentCutter(tokenizer, 16, 1000)
    batched = classify_documents(model, cutter, texts)
    single = torch.cat([classify_documents(model, cutter, [t]) for t in texts])
    assert torch.allclose(batched, single, atol=1e-5, rtol=0)


def test_cut_points_split_tokenization(tokenizer):
    text = "Hello, wörld!北京 x\u0301y  tabs\tand\nnewlines. end"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    for i in range(len(text) + 1):
        cut = last_cut(text[:i])
        left = tokenizer.encode(text[:cut], add_special_tokens=False).ids if cut else []
        right = tokenizer.encode(text[cut:], add_special_tokens=False).ids if text[cut:] else []
        assert left + right == ids, (i, cut)


def test_the_cutter_tokenizes_as_the_tokenizer_does_one_text_at_a_time(tokenizer):
    """The cutter calls encode_batch (it releases the GIL, so a long piece can be cut on a thread) and must
    give exactly what encode gives, on real articles and on odd text."""
    from loadtest.bench_inputs import bbc_texts, hyperpartisan_texts

    data = Path(__file__).resolve().parents[2] / "shared" / "data"
    texts = [*bbc_texts(data, 40), *hyperpartisan_texts(data)[:40],
             "Hello, wörld!北京 x\u0301y  tabs\tand\nnewlines. end", " ", "a" * 3000]
    cutter = SegmentCutter(tokenizer, 128, None, 1024)
    for text in texts:
        assert cutter.token_ids(text) == tokenizer.encode(text, add_special_tokens=False).ids


async def test_a_long_piece_is_cut_off_the_event_loop_and_a_short_one_on_it():
    import threading

    from service.runtime.pipeline import OFF_LOOP_CHARS, cut_text

    threads = []

    def feed(state, text):
        threads.append(threading.current_thread())
        return state, len(text)

    assert await cut_text(feed, {}, "x" * (OFF_LOOP_CHARS - 1)) == ({}, OFF_LOOP_CHARS - 1)
    assert await cut_text(feed, {}, "x" * OFF_LOOP_CHARS) == ({}, OFF_LOOP_CHARS)
    assert threads[0] is threading.main_thread() and threads[1] is not threading.main_thread()
