"""The RMT classifier as a servable: one ``step`` graph plus the text cutter's settings.

Graph ``step``: (memory (B,m,d), input_ids (B,s), attention_mask (B,s)) -> (next_memory, logits (B,C)).
Text is cut into segments outside the graph (``models/text_stream.py``), so the graph's state is the
memory and the session's state adds the cutter's pending text and ids.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.nn as nn

from models.checkpoint import Checkpoint
from models.segment import TensorSpec
from models.serving.servable import Graph, Servable
from models.text_stream import PENDING_BYTES, SegmentCutter


class RMTStep(nn.Module):
    def __init__(self, rmt: nn.Module) -> None:
        super().__init__()
        self.rmt = rmt

    def forward(
        self, memory: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rmt.step_tensors(memory, input_ids, attention_mask)


def tokenizer_file() -> Path:
    """MiniLM's tokenizer.json with truncation and padding off (the cutter does both)."""
    from models.minilm import load_minilm_tokenizer

    path = Path(tempfile.mkdtemp(prefix="rtserve-tokenizer-")) / "tokenizer.json"
    load_minilm_tokenizer().save(str(path))
    return path


def rmt_servable(checkpoint: Checkpoint) -> Servable:
    from models.rmt import load_rmt

    assert checkpoint.folder is not None
    rmt = load_rmt(str(checkpoint.folder))
    config = rmt.config
    m, d, s, labels = config.memory_size, config.bert.hidden_size, config.segment_size, config.num_labels
    vocab = config.bert.vocab_size

    def sample_inputs(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        memory = torch.randn(batch, m, d, generator=generator)
        length = int(torch.randint(4, s + 1, (1,), generator=generator))
        ids = torch.randint(1000, vocab, (batch, length), generator=generator)
        lengths = torch.randint(2, length + 1, (batch,), generator=generator)
        mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
        return memory, ids * mask, mask

    def full_segments(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        """A batch of whole segments (s tokens each), as a long document's pieces are served."""
        memory = torch.randn(batch, m, d, generator=generator)
        ids = torch.randint(1000, vocab, (batch, s), generator=generator)
        return memory, ids, torch.ones(batch, s, dtype=torch.long)

    memory_spec = TensorSpec("memory", "float32", ("batch", m, d))
    graph = Graph(
        name="step",
        module=RMTStep(rmt),
        inputs=[memory_spec, TensorSpec("input_ids", "int64", ("batch", "tokens")),
                TensorSpec("attention_mask", "int64", ("batch", "tokens"))],
        outputs=[TensorSpec("next_memory", "float32", ("batch", m, d)),
                 TensorSpec("logits", "float32", ("batch", labels))],
        sample_inputs=sample_inputs,
        state_outputs={"memory": "next_memory"},
        served_inputs=full_segments,
    )
    # Served, the classifier reads every segment of any document: its memory is bounded state, and on the
    # test split reading all segments scores at least what the training length (config.max_segments) does
    # (docs/classification.md, "Segments read"). ``rtserve eval <checkpoint> --segments N`` measures any N.
    cutter = SegmentCutter(None, s, None, PENDING_BYTES)
    return Servable(
        name="",
        task="classify",
        family="rmt",
        graphs=[graph],
        state_spec=[memory_spec, TensorSpec("last_logits", "float32", ("batch", labels)), *cutter.state_spec()],
        settings={
            "segment_size": s,
            "max_segments": None,  # all
            "trained_segments": config.max_segments,
            "memory_size": m,
            "pending_bytes": PENDING_BYTES,
            "labels": list(checkpoint.extras.get("label_names") or config.label_names),
            "metrics": checkpoint.extras.get("metrics", {}),
        },
        assets={"tokenizer": tokenizer_file()},
        initial_state={"memory": rmt.init_state(1)["memory"]},
    )
