"""A GRU that reads a document segment by segment, carrying its hidden state: the segment contract.

    init_state(B)                          -> {"memory": (B, 1, H)}
    step(memory, input_ids, attention_mask) -> next memory (B, 1, H), logits (B, C)

A segment is ``[CLS] w_1 .. w_k [SEP]`` right-padded to the segment size (rtserve's text cutter); the
GRU reads it from the memory the previous segment left, and the next memory is its hidden state at the
segment's last real token. The GRU is causal, so the padding after that token changes nothing; a
segment of padding only leaves the memory as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn


@dataclass
class GRUConfig:
    vocab_size: int = 30522  # MiniLM's uncased WordPiece vocabulary (rtserve's text cutter uses its ids)
    embed_dim: int = 64  # token embedding width
    hidden_size: int = 64  # H: the memory carried between segments
    segment_size: int = 64  # tokens per segment, [CLS] and [SEP] included
    labels: list[str] = field(default_factory=lambda: ["negative", "positive"])


class GRUClassifier(nn.Module):
    def __init__(self, config: GRUConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=0)
        self.gru = nn.GRU(config.embed_dim, config.hidden_size, batch_first=True)
        self.head = nn.Linear(config.hidden_size, len(config.labels))

    def init_state(self, batch: int) -> dict[str, torch.Tensor]:
        return {"memory": torch.zeros(batch, 1, self.config.hidden_size)}

    def step_tensors(
        self, memory: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        outputs, _ = self.gru(self.embed(input_ids), memory.transpose(0, 1).contiguous())  # (B, T, H)
        lengths = attention_mask.sum(dim=1)  # (B,)
        last = (lengths - 1).clamp(min=0).view(-1, 1, 1).expand(-1, 1, outputs.shape[-1])
        read = outputs.gather(1, last)  # (B, 1, H): the hidden state at the last real token
        memory = torch.where((lengths > 0).view(-1, 1, 1), read, memory)
        return memory, self.head(memory[:, 0])  # (B, 1, H), (B, C)
