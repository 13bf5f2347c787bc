"""RMT memory carries information across segments (synthetic long-document task).

The label is decided only by which of two key tokens appears in the FIRST
segment; three or more segments of random distractor tokens follow. The
prediction is read from the memory after the last segment, so a model can only
solve the task by carrying the key through the memory. A tiny random
BERT-like RMT reaches >= 95% on fresh documents after a few hundred CPU steps;
the same model with the memory reset at every segment stays at chance.
"""

from __future__ import annotations

import pytest
import torch

from models.minilm import BertConfig
from models.rmt import RMTConfig, build_rmt, cross_entropy

VOCAB = 48
KEYS = (5, 6)  # label 0 / label 1 key token
DISTRACTORS = (10, VOCAB)  # token range of the filler text
SEGMENT = 12  # [CLS] + 10 tokens + [SEP]
N_SEGMENTS = 4  # key segment + 3 distractor segments
CLS, SEP = 1, 2


def make_batch(generator: torch.Generator, batch: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    labels = torch.randint(0, 2, (batch,), generator=generator)
    segments = []
    for t in range(N_SEGMENTS):
        body = torch.randint(*DISTRACTORS, (batch, SEGMENT - 2), generator=generator)
        if t == 0:  # the key: one token at a random position of the first segment
            where = torch.randint(0, SEGMENT - 2, (batch,), generator=generator)
            body[torch.arange(batch), where] = torch.tensor(KEYS)[labels]
        ids = torch.cat([torch.full((batch, 1), CLS), body, torch.full((batch, 1), SEP)], dim=1)  # (B, s)
        segments.append((ids, torch.ones_like(ids)))
    return segments, labels


def train_and_score(memory_reset: bool, steps: int = 300, seed: int = 0) -> float:
    torch.manual_seed(seed)
    bert = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=SEGMENT,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config = RMTConfig(memory_size=2, segment_size=SEGMENT, max_segments=N_SEGMENTS, memory_layer=0,
                       memory_reset=memory_reset, classifier_dropout=0.0, bert=bert)
    model = build_rmt(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(seed)
    counts = torch.full((32,), N_SEGMENTS)
    model.train()
    for _ in range(steps):
        segments, labels = make_batch(generator, 32)
        loss = cross_entropy(model.forward_segments(segments, counts), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    # fresh documents, scored through the serving path: a fold of `step`
    model.eval()
    segments, labels = make_batch(torch.Generator().manual_seed(seed + 1000), 512)
    state = model.init_state(512)
    with torch.no_grad():
        for ids, mask in segments:
            state, output = model.step(state, {"input_ids": ids, "attention_mask": mask})
        predictions = model.readout(state, output).argmax(-1)
    return float((predictions == labels).float().mean())


@pytest.mark.slow
def test_memory_carries_first_segment_label_across_distractors():
    torch.set_num_threads(1)
    accuracy = train_and_score(memory_reset=False)
    assert accuracy >= 0.95, accuracy


@pytest.mark.slow
def test_memory_reset_baseline_stays_at_chance():
    torch.set_num_threads(1)
    accuracy = train_and_score(memory_reset=True)
    assert accuracy <= 0.60, accuracy


def test_bptt_window_and_gradient_checkpointing():
    """bptt_segments=k stops gradients k segments before the end; checkpointing changes no gradient."""
    generator = torch.Generator().manual_seed(3)
    segments, labels = make_batch(generator, 4)
    counts = torch.full((4,), N_SEGMENTS)
    grads = {}
    for name, kwargs in {"full": {}, "ckpt": {"gradient_checkpointing": True}, "bptt1": {"bptt_segments": 1}}.items():
        torch.manual_seed(0)
        bert = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=32, max_position_embeddings=SEGMENT,
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model = build_rmt(RMTConfig(memory_size=2, segment_size=SEGMENT, max_segments=N_SEGMENTS, memory_layer=1,
                                    classifier_dropout=0.0, bert=bert, **kwargs))
        cross_entropy(model.forward_segments(segments, counts), labels).backward()
        grads[name] = (model.memory.grad, model.encoder.layer[1].output.weight.grad.clone())
    assert grads["full"][0].abs().sum() > 0
    assert torch.allclose(grads["full"][0], grads["ckpt"][0], atol=1e-6)
    assert torch.allclose(grads["full"][1], grads["ckpt"][1], atol=1e-6)
    assert grads["bptt1"][0] is None or grads["bptt1"][0].abs().sum() == 0  # initial memory is 3 segments back
