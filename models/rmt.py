"""Recurrent Memory Transformer (RMT) for long-document classification.

Reference: Bulatov, Kuratov, Burtsev, "Recurrent Memory Transformer",
NeurIPS 2022 (``shared/papers/rmt-recurrent-memory-transformer.txt``).

A document is tokenized once and cut into segments of ``segment_size`` tokens
(``[CLS] w_1 .. w_{s-2} [SEP]``). Each segment is read together with m memory
vectors, ``[memory ; segment]``; the outputs at the memory positions become
the memory for the next segment (the paper's encoder-only use, where one group
of memory tokens is both read and written):

    H~_tau = [H^mem_tau ; H_tau]                    # Sec. 3, memory prepended
    [H^mem_out ; _] = Transformer(H~_tau)
    H^mem_{tau+1} := H^mem_out                      # Sec. 3: H^mem_{tau+1} := H^write_tau

The paper's decoder layout has a read group before and a write group after the
segment (a causal mask would hide the segment from the first group). With a
bidirectional encoder every memory position already attends to the whole
segment, so one group serves as both read and write memory.

The class is read from the memory after the last segment.

Cost-driven choice (documented in docs/classification.md): the memory joins
the encoder at layer ``memory_layer`` (0 = at the embeddings, as in the paper).
Layers below it see the segment alone, so for a frozen lower stack their
outputs can be computed once per document and cached during training; layers
``memory_layer..L-1`` process ``[memory ; segment]``. With ``memory_layer=0``
this is exactly the paper's design.

Segment contract (docs/architecture.md): state = {"memory": (B, m, d) float32};
``step`` is a pure tensor function (memory, input_ids, attention_mask) ->
(memory', logits), with an all-padding segment leaving the memory unchanged, so
documents of different lengths batch together and a whole-document call is a
fold of ``step``. Streaming text (pieces of any size) lives in
``models/rmt_stream.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from models.checkpoint import Checkpoint, load_checkpoint
from models.minilm import BertConfig, MiniLMEncoder, minilm_config, minilm_state_dict
from models.segment import State, TensorSpec


@dataclass
class RMTConfig:
    memory_size: int = 10  # m memory tokens (paper: 10 for Hyperpartisan)
    segment_size: int = 128  # s tokens per segment, [CLS] and [SEP] included
    max_segments: int = 4  # segments read per document; later text is ignored
    memory_layer: int = 4  # encoder layer at which [memory ; segment] starts (0 = paper)
    num_labels: int = 2  # classes
    bptt_segments: int = 0  # gradient flows through the last k segments; 0 = all
    gradient_checkpointing: bool = False  # recompute upper layers per segment in backward
    memory_reset: bool = False  # baseline: memory re-initialised at every segment
    classifier_dropout: float = 0.1  # dropout before the output layer
    label_names: list[str] = field(default_factory=lambda: ["false", "true"])  # index -> name
    bert: BertConfig = field(default_factory=BertConfig)  # the backbone's shape

    def __post_init__(self) -> None:
        if isinstance(self.bert, Mapping):
            self.bert = BertConfig(**self.bert)
        if not 0 <= self.memory_layer < self.bert.num_hidden_layers:
            raise ValueError(f"memory_layer must be in [0, {self.bert.num_hidden_layers}), got {self.memory_layer}")
        if self.segment_size < 3 or self.segment_size > self.bert.max_position_embeddings:
            raise ValueError(f"segment_size must be in [3, {self.bert.max_position_embeddings}]")

    @property
    def content_size(self) -> int:
        """Document tokens per segment (segment_size minus [CLS] and [SEP])."""
        return self.segment_size - 2

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RMTConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})


class ClassificationHead(nn.Module):
    """Mean of the final memory vectors -> dense/tanh -> logits."""

    def __init__(self, config: RMTConfig):
        super().__init__()
        d = config.bert.hidden_size
        self.dense = nn.Linear(d, d)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.out = nn.Linear(d, config.num_labels)

    def forward(self, memory: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.dense(memory.mean(dim=1)))  # (B, d)
        return self.out(self.dropout(h))  # (B, C)


class RMT(nn.Module):
    """RMT classifier over a BERT encoder; see the module docstring."""

    def __init__(self, config: RMTConfig):
        super().__init__()
        self.config = config
        d = config.bert.hidden_size
        self.encoder = MiniLMEncoder(config.bert)
        # learned initial memory, in the hidden space of layer `memory_layer` (post-LayerNorm scale)
        self.memory = nn.Parameter(torch.randn(config.memory_size, d))  # (m, d)
        self.head = ClassificationHead(config)

    # ---- the segment-model contract -------------------------------------------------------
    def state_spec(self) -> list[TensorSpec]:
        c = self.config
        return [TensorSpec("memory", "float32", ("batch", c.memory_size, c.bert.hidden_size))]

    def init_state(self, batch: int) -> State:
        return {"memory": self.memory.detach().unsqueeze(0).expand(batch, -1, -1).clone()}  # (B, m, d)

    def step(self, state: Mapping[str, torch.Tensor], segment: Mapping[str, torch.Tensor]) -> tuple[State, State]:
        """(memory (B,m,d), input_ids (B,s), attention_mask (B,s)) -> ({memory'}, {logits (B,C)})."""
        memory, logits = self.step_tensors(state["memory"], segment["input_ids"], segment["attention_mask"])
        return {"memory": memory}, {"logits": logits}

    def readout(
        self, state: Mapping[str, torch.Tensor], output: Mapping[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Class probabilities (B, C): softmax of the step's logits, or of the head on the memory."""
        logits = output["logits"] if output else self.head(state["memory"])
        return logits.float().softmax(dim=-1)

    # ---- tensor functions (exportable) ----------------------------------------------------
    def step_tensors(
        self, memory: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.lower(input_ids, attention_mask)  # (B, s, d)
        return self.upper(memory, h, attention_mask)

    def lower(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Embeddings and layers below ``memory_layer``, on the segment alone: (B, s) -> (B, s, d)."""
        h = self.encoder.embed(input_ids)  # (B, s, d)
        return self.encoder.run_layers(h, attention_mask, 0, self.config.memory_layer)

    def read_memory(self, memory: torch.Tensor) -> torch.Tensor:
        """The memory a segment reads: the carried one (RMT) or the initial one (reset baseline)."""
        return memory

    def upper(
        self, memory: torch.Tensor, h: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[memory ; segment] through layers ``memory_layer..L-1``; memory outputs become the new memory."""
        m = self.config.memory_size
        read = self.read_memory(memory)  # (B, m, d)
        x = torch.cat([read.to(h.dtype), h], dim=1)  # (B, m+s, d)
        # m ones whatever the segment's length (a slice of the mask would tie m to it in an exported graph)
        mask = torch.cat([attention_mask.new_ones(attention_mask.shape[0], m), attention_mask], dim=1)  # (B, m+s)
        if self.config.gradient_checkpointing and self.training and torch.is_grad_enabled():
            y = checkpoint(self.encoder.run_layers, x, mask, self.config.memory_layer, None, use_reentrant=False)
        else:
            y = self.encoder.run_layers(x, mask, self.config.memory_layer)  # (B, m+s, d)
        written = y[:, :m]  # (B, m, d)  Sec. 3: H^mem_{tau+1} := H^write_tau
        # an all-padding segment (document already over) leaves the memory as it was
        present = attention_mask.sum(dim=1, keepdim=True).unsqueeze(-1) > 0  # (B, 1, 1)
        new_memory = torch.where(present, written, memory)  # (B, m, d)
        return new_memory, self.head(new_memory)

    # ---- training -------------------------------------------------------------------------
    def forward_segments(
        self,
        segments: Sequence[tuple[torch.Tensor, torch.Tensor]],
        counts: torch.Tensor,
        lower_cached: bool = False,
    ) -> torch.Tensor:
        """Fold over a padded batch of segments with truncated BPTT; returns final logits (B, C).

        ``segments[t]`` is (input_ids (B,s), mask (B,s)), or with ``lower_cached`` the cached
        lower-layer states (B,s,d) and mask. ``counts`` (B,) is each document's number of
        segments; the memory is detached on entering segment ``counts - bptt_segments``.
        """
        B = counts.shape[0]
        memory = self.memory.unsqueeze(0).expand(B, -1, -1)  # (B, m, d)
        k = self.config.bptt_segments
        logits = self.head(memory)
        for t, (x, mask) in enumerate(segments):
            if k > 0:
                cut = (counts - k == t).view(B, 1, 1)  # rows whose BPTT window starts here
                memory = torch.where(cut, memory.detach(), memory)
            h = x if lower_cached else self.lower(x, mask)
            memory, logits = self.upper(memory, h, mask)
        return logits


class MemoryResetRMT(RMT):
    """No-memory baseline: the same model, memory reset to its initial value at every segment.

    The prediction then depends on the last segment only.
    """

    def read_memory(self, memory: torch.Tensor) -> torch.Tensor:
        return self.memory.unsqueeze(0).expand(memory.shape[0], -1, -1).to(memory.dtype)  # (B, m, d)


def build_rmt(config: RMTConfig) -> RMT:
    """An RMT (or the memory-reset baseline) with random weights."""
    return (MemoryResetRMT if config.memory_reset else RMT)(config)


def rmt_from_minilm(config: RMTConfig, seed: int = 0) -> RMT:
    """An RMT whose encoder is the pip-installed MiniLM-L6; memory and head freshly initialised."""
    base = minilm_config()
    config.bert = dataclasses.replace(base, hidden_dropout_prob=config.bert.hidden_dropout_prob,
                                      attention_probs_dropout_prob=config.bert.attention_probs_dropout_prob)
    torch.manual_seed(seed)
    model = build_rmt(config)
    model.encoder.load_state_dict(minilm_state_dict())
    return model


def trained_state_dict(model: RMT, dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """What training changed relative to the package: memory, head, layers >= memory_layer."""
    k = model.config.memory_layer
    out = {}
    for name, tensor in model.state_dict().items():
        layer = int(name.split(".")[2]) if name.startswith("encoder.layer.") else -1
        if not name.startswith("encoder.") or layer >= k:
            out[name] = tensor.detach().to(dtype)
    return out


def load_rmt(source: str | Path | Checkpoint) -> RMT:
    """Rebuild a trained RMT from a checkpoint folder (or a ``Checkpoint`` already read from one):
    package MiniLM + the stored deltas (fp32)."""
    ckpt = source if isinstance(source, Checkpoint) else load_checkpoint(source)
    folder = ckpt.folder
    if ckpt.family != "rmt":
        raise ValueError(f"{folder} holds a {ckpt.family!r} model, not 'rmt'")
    config = RMTConfig.from_dict(ckpt.config)
    model = build_rmt(config)
    state = {"encoder." + k: v for k, v in minilm_state_dict().items()}
    state.update({k: v.float() for k, v in ckpt.state_dict.items()})
    missing = set(model.state_dict()) - set(state)
    if missing:
        raise ValueError(f"checkpoint {folder} lacks {sorted(missing)[:5]}")
    model.load_state_dict(state)
    return model.eval()


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)
