"""The checkpoint as rtserve serves it: one ``step`` graph plus the text cutter's settings, the shape
rtserve's classify pipeline reads (``service/runtime/classify.py``)."""

from __future__ import annotations

import torch
import torch.nn as nn

from models.checkpoint import Checkpoint
from models.families import family
from models.segment import TensorSpec
from models.serving.rmt import tokenizer_file
from models.serving.servable import Graph, Servable
from models.text_stream import PENDING_BYTES, SegmentCutter


class Step(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, memory: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.step_tensors(memory, input_ids, attention_mask)


def servable(checkpoint: Checkpoint) -> Servable:
    model = family(checkpoint.family).build_model(checkpoint.config)
    model.load_state_dict(checkpoint.state_dict)
    config = model.config
    hidden, s, labels = config.hidden_size, config.segment_size, list(config.labels)

    def sample_inputs(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        memory = torch.randn(batch, 1, hidden, generator=generator)
        ids = torch.randint(1000, config.vocab_size, (batch, s), generator=generator)
        lengths = torch.randint(2, s + 1, (batch,), generator=generator)
        mask = (torch.arange(s)[None, :] < lengths[:, None]).long()
        return memory, ids * mask, mask

    memory_spec = TensorSpec("memory", "float32", ("batch", 1, hidden))
    graph = Graph(
        name="step",
        module=Step(model),
        inputs=[memory_spec, TensorSpec("input_ids", "int64", ("batch", "tokens")),
                TensorSpec("attention_mask", "int64", ("batch", "tokens"))],
        outputs=[TensorSpec("next_memory", "float32", ("batch", 1, hidden)),
                 TensorSpec("logits", "float32", ("batch", len(labels)))],
        sample_inputs=sample_inputs,
        state_outputs={"memory": "next_memory"},
        onnx_exporter="torchscript",  # ONNX's own GRU operator
    )
    cutter = SegmentCutter(None, s, None, PENDING_BYTES)
    return Servable(
        name="",
        task="classify",
        family=checkpoint.family,
        graphs=[graph],
        state_spec=[memory_spec, TensorSpec("last_logits", "float32", ("batch", len(labels))), *cutter.state_spec()],
        settings={"segment_size": s, "max_segments": None, "pending_bytes": PENDING_BYTES, "labels": labels,
                  "metrics": checkpoint.extras.get("metrics", {})},
        assets={"tokenizer": tokenizer_file()},
    )
