"""SRformer: a summarizer whose decoder cross-attention is segmented + recurrent.

References
- Long, Chowdhury, Roy, "Segmented Recurrent Transformer: An Efficient
  Sequence-to-Sequence Model" (../shared/papers/srformer-segmented-recurrent-transformer.txt):
  segmented attention Eq. (4), (6); O = O_S + O_R Eq. (11); recurrent attention
  O_R ~ Q_t RAF(K_R'V_R) / norm(K) Eq. (13); P_i = K'V - K_Si'V_Si Eq. (16);
  the kernel form of App. A.1, Eq. (22); RAF neurons Sec. 3.3; one decoder step Algorithm 1;
  masks App. A.3.
- Encoder: the frozen pip-installed MiniLM-L6 (models/minilm.py), run window by
  window (each window its own [CLS] ... [SEP] input of at most 512 positions).

The decoder's cross-attention is one class per variant (``SRformerConfig.cross_attention`` and, for the
SRformer, ``recurrent_norm`` name it: :func:`cross_attention`):
- ``full`` (:class:`FullCrossAttention`): softmax attention over every encoder position (baseline).
- ``segmented`` (:class:`SegmentedCrossAttention`): the query at step t reads only segment
  i = min(t*m // q, m-1) of the encoder keys (s positions), m = ceil(k/s) segments of the k valid keys.
- ``srformer`` (:class:`SRformerCrossAttention`): segmented attention plus recurrent attention over
  the other segments through a RAF neuron, Eq. (11), O_R in the paper's form, Eq. (13).
- ``srformer`` with ``recurrent_norm="kernel"`` (:class:`KernelSRformerCrossAttention`): the same with
  O_R in the kernel form of App. A.1, Eq. (22).
The SRformer's ablations are switches of its two classes: ``recurrent_gate`` weights O_R by a per-head
scalar learned from 0 (Eq. 10's trainable weighting) instead of the plain sum of Eq. (11);
``recurrent_part`` drops the RAF ("linear", the paper's ablation III) or O_R ("off", a diagnostic);
``segmented_part=False`` drops O_S (ablation I).

q, the summary length that fixes the segment schedule, is per document:
``q = ceil(summary_ratio * k)`` (BBC summaries are 0.45 of their article in
WordPiece tokens, 5th-95th percentile 0.36-0.53), or a fixed
``summary_length`` when that is > 0.

Output vocabulary: logits are taken over a per-document list of candidate ids
(``vocab_ids``). For extractive news summaries this is the set of source token
ids plus [SEP] (every summary token of the BBC train split occurs in its
article); ``output_vocab="full"`` uses all of WordPiece. The word embeddings are
MiniLM's (frozen, not stored in checkpoints) and are tied to the output layer.

Copying (every variant alike): a pointer over the last layer's cross-attention
weights - the attended segment in the segmented/SRformer modes - is mixed with
the vocabulary (See et al. 2017); keys also carry the previous source token's
embedding and values the token's own; and the attention score gets a learned
per-head bonus where the source continues the summary's last one or two tokens
(a score bias segmented with its keys like App. A.3's b_Si; it does not enter the
recurrent part).

Decoder blocks are pre-LN (:class:`Block`, ``norm_position="pre"``, trained from scratch: the
shipped recipe) or post-LN like BERT's (:class:`PostLNBlock`), so that
``models.srformer_weights.warm_start_from_minilm`` can start them from MiniLM's layers (BERT2BERT,
Rothe et al., 2020).

With ``salience``, the model carries the salience head that sentence copy reads
(``models/salience_head.py``). A model's weights come from a checkpoint, and its word embeddings from
MiniLM, through ``models/srformer_weights.py``.

Serving (the segment contract, docs/architecture.md): the decoder step (:meth:`SRformer.step`) is a pure
tensor function, caches and RAF state in, log-probabilities and caches out; :meth:`SRformer.memory`
is what one encoder window adds. Reading a document as text pieces of any size is the family's
stream, ``models/summary_stream.py`` (numpy), which the service wraps over the exported graphs and
``models.serving.srformer.EagerSummarizer`` runs on this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.decoding import BeamSearch, GreedySearch, Search
from models.salience_head import SalienceHead, from_checkpoint_names, to_checkpoint_names
from models.segment import State

TensorPair = tuple[torch.Tensor, torch.Tensor]

MODES = ("full", "segmented", "srformer")
RECURRENT_NORMS = ("norm_k", "kernel")
RECURRENT_PARTS = ("raf", "linear", "off")
NEG = -1e30  # additive mask value (finite: a fully masked row stays finite)


@dataclass
class SRformerConfig:
    cross_attention: str = "srformer"  # "full" | "segmented" | "srformer"
    segment_size: int = 16  # s: encoder positions per segment
    summary_ratio: float = 0.45  # q = ceil(ratio * k) fixes the segment schedule ...
    summary_length: int = 0  # ... unless this fixed q is > 0
    vocab_size: int = 30522  # WordPiece (MiniLM's)
    embed_dim: int = 384  # MiniLM width: word embeddings and encoder outputs
    d_model: int = 256  # decoder width
    n_layer: int = 2  # decoder blocks
    n_head: int = 4  # decoder heads (self and cross)
    d_ff: int = 1024  # MLP width
    max_target: int = 512  # decoder positions (learned position embeddings)
    dropout: float = 0.1
    norm_position: str = "pre"  # "pre": pre-LN blocks (trained from scratch); "post": BERT's post-LN (warm start)
    layer_norm_eps: float = 1e-5  # BERT's is 1e-12
    raf_clamp: float = 1e4  # App. A.3: clamp K'V and P before the RAF neuron
    output_vocab: str = "source"  # "source": ids of the document + [SEP]; "full": all ids
    recurrent_gate: bool = False  # O = O_S + g*O_R, g per head learned (Eq. 10's trainable weight) ...
    gate_init: float = 0.0  # ... starting from this value
    recurrent_norm: str = "norm_k"  # "norm_k": Q RAF(P) / norm(K) (Eq. 13); "kernel": App. A.1 Eq. (22)
    recurrent_part: str = "raf"  # "raf" (Sec. 3.3); ablations: "linear" (no RAF, paper's III), "off" (O_R = 0)
    segmented_part: bool = True  # False: O = O_R only (the paper's ablation I; the copy pointer still reads S_i)
    raf_threshold: float = 0.01  # the RAF threshold's initial value
    encoder_window: int = 510  # WordPiece tokens per encoder window (+ [CLS], [SEP] = 512)
    max_source: int = 1024  # tokens of a document read (training/eval truncation; 0 = all)
    salience: bool = False  # a sentence scorer on the encoder's outputs, for sentence copy (models/salience_head.py)
    salience_lexical: bool = False  # ... plus a weight per WordPiece id and centrality and length terms
    bos_id: int = 101  # [CLS] starts the summary
    eos_id: int = 102  # [SEP] ends it
    pad_id: int = 0

    def __post_init__(self) -> None:
        if self.cross_attention not in MODES:
            raise ValueError(f"cross_attention must be one of {MODES}, not {self.cross_attention!r}")
        if self.salience_lexical and not self.salience:
            raise ValueError("salience_lexical extends the salience head: set salience too")
        if self.d_model % self.n_head:
            raise ValueError("d_model must be a multiple of n_head")
        if self.norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre' or 'post', not {self.norm_position!r}")
        if self.recurrent_norm not in RECURRENT_NORMS:
            raise ValueError(f"recurrent_norm must be one of {RECURRENT_NORMS}, not {self.recurrent_norm!r}")
        if self.recurrent_part not in RECURRENT_PARTS:
            raise ValueError(f"recurrent_part must be one of {RECURRENT_PARTS}, not {self.recurrent_part!r}")

    @property
    def kv_columns(self) -> int:
        """Columns of the running K'V per head: the kernel form carries sum(phi(K)) as one more column."""
        head_dim = self.d_model // self.n_head
        return head_dim + 1 if self.cross_attention == "srformer" and self.recurrent_norm == "kernel" else head_dim


def neg(dtype: torch.dtype) -> float:
    """NEG where ``dtype`` holds it (fp32, bf16), else its most negative finite value (fp16: -65504)."""
    return max(NEG, torch.finfo(dtype).min)


def tiny(dtype: torch.dtype, eps: float) -> float:
    """``eps`` where ``dtype`` resolves it, else its smallest normal value (1e-12 is 0 in fp16)."""
    return max(eps, torch.finfo(dtype).tiny)


def schedule_length(config: SRformerConfig, k_valid: torch.Tensor) -> torch.Tensor:
    """q per document (B,) from its number of valid encoder positions k (B,)."""
    if config.summary_length > 0:
        return torch.full_like(k_valid, config.summary_length)
    return torch.ceil(k_valid.double() * config.summary_ratio).long().clamp(min=1)


def segment_index(t: torch.Tensor, m: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Sec. 3.1: i = min(int(t*m/q), m-1); broadcasts t against m, q."""
    return torch.minimum(torch.div(t * m, q, rounding_mode="floor"), m - 1)


class SegmentRuns(NamedTuple):
    """The steps of a teacher-forced summary grouped by the segment they read: Algorithm 1 visits the
    segments in runs of equal index i_t. Step t is row ``offset`` of run ``rank``, so ``flat`` = rank * L
    + offset is its place in a (R, L) block layout of R runs of at most L steps; ``visited`` (B, R) is
    the segment of each run (0 for a row's unused runs)."""

    flat: torch.Tensor  # (B, T)
    visited: torch.Tensor  # (B, R)
    L: int

    @classmethod
    def of(cls, seg: torch.Tensor) -> SegmentRuns:
        B, T = seg.shape
        change = torch.ones_like(seg, dtype=torch.bool)
        change[:, 1:] = seg[:, 1:] != seg[:, :-1]  # step t starts a run
        rank = change.long().cumsum(dim=1) - 1
        R = int(rank.max()) + 1
        visited = torch.zeros(B, R, dtype=torch.long, device=seg.device).scatter_(1, rank, seg)
        steps = torch.arange(T, device=seg.device).expand(B, T)
        start = torch.where(change, steps, torch.zeros_like(steps)).cummax(dim=1).values
        offset = steps - start
        L = int(offset.max()) + 1
        return cls(rank * L + offset, visited, L)

    def to_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """(B, h, T, n) per step -> (B, h, R, L, n), zero where a block row holds no step."""
        B, h, T, n = x.shape
        R = self.visited.shape[1]
        index = self.flat[:, None, :, None].expand(B, h, T, n)
        return x.new_zeros(B, h, R * self.L, n).scatter(2, index, x).view(B, h, R, self.L, n)

    def from_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """(B, h, R, L, n) -> (B, h, T, n): each step's row back in step order."""
        B, h, R, L, n = x.shape
        return x.reshape(B, h, R * L, n).gather(2, self.flat[:, None, :, None].expand(B, h, self.flat.shape[1], n))


class RAF(nn.Module):
    """Recurrent Accumulate-and-Fire neuron (Sec. 3.3, Fig. 3).

    x = Linear(P); mem = leak * mem + x; out = ReLU(mem - threshold);
    where it fired, mem -= threshold (soft reset). The leak (in (0, 1) through a
    sigmoid) and the threshold are learned per feature.

    ``unit_gain`` (ours, for the kernel form of O_R): the input is scaled by (1 - leak), so a constant
    input x leads the membrane to x (gain 1) rather than x / (1 - leak) (8.4 at the initial leak), and
    the projection starts as the identity, so at initialisation RAF(P) is P smoothed over segments,
    less the threshold.
    """

    def __init__(self, dim: int, clamp: float, threshold: float = 0.01, unit_gain: bool = False):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        if unit_gain:
            with torch.no_grad():
                self.proj.weight.copy_(torch.eye(dim))
                self.proj.bias.zero_()
        self.leak = nn.Parameter(torch.full((dim,), 2.0))  # sigmoid(2) = 0.88
        self.threshold = nn.Parameter(torch.full((dim,), threshold))
        self.clamp = clamp
        self.unit_gain = unit_gain

    def forward(self, p: torch.Tensor, mem: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.proj(p.clamp(-self.clamp, self.clamp))  # (..., dh, dh) App. A.3 clamp, projection
        leak = torch.sigmoid(self.leak)
        mem = leak * mem + ((1 - leak) * x if self.unit_gain else x)  # accumulate with leak
        out = F.relu(mem - self.threshold)  # fire
        fired = (mem > self.threshold).to(mem.dtype)
        return out, mem - self.threshold * fired  # soft reset


def phi(x: torch.Tensor) -> torch.Tensor:
    """The kernel feature map of App. A.1 (Katharopoulos et al., 2020): elu(x) + 1 > 0."""
    return F.elu(x) + 1


def remaining_products(mem: Mapping[str, torch.Tensor], s: int, kernel_mask: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """Eq. (16) for every segment i at once: P_i = K'V - K_Si'V_Si, (B, h, m, dh, c).

    With ``kernel_mask`` (B, k), the valid positions: the products of App. A.1 instead, phi(K)'[V, 1]
    (c = dh + 1: the last column is sum(phi(K)), Eq. 22's divisor), ``mem["kv"]`` accumulated alike."""
    K, V = mem["k"], mem["v"]  # (B, h, k, dh), zero at masked positions
    B, h, k, dh = K.shape
    m = -(-k // s)
    Ks = F.pad(K, (0, 0, 0, m * s - k)).view(B, h, m, s, dh)  # (B, h, m, s, dh)
    Vs = F.pad(V, (0, 0, 0, m * s - k)).view(B, h, m, s, dh)
    if kernel_mask is not None:
        keep = F.pad(kernel_mask.to(K.dtype), (0, m * s - k)).view(B, 1, m, s, 1)  # (B, 1, m, s, 1)
        return mem["kv"][:, :, None] - kernel_product(Ks, Vs, keep)
    return mem["kv"][:, :, None] - Ks.transpose(-2, -1) @ Vs


def kernel_product(K: torch.Tensor, V: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """phi(K)'[V, 1] over the kept positions (..., n, dh) -> (..., dh, dh + 1): App. A.1's numerator
    sum_j phi(K_j)' V_j and, as the last column, its divisor's sum_j phi(K_j) (Eq. 20-22)."""
    phi_k = phi(K) * keep  # phi(0) = 1: masked positions must be dropped again
    return phi_k.transpose(-2, -1) @ torch.cat([V, keep.expand(*V.shape[:-1], 1)], dim=-1)


class CrossAttention(nn.Module):
    """What the cross-attention variants share: projections, the encoder-side memory (Eq. 15) and the
    copy features. The variants differ in which keys a step reads (:meth:`forward`, :meth:`step`):
    :class:`FullCrossAttention`, :class:`SegmentedCrossAttention`, and the SRformer's
    :class:`SRformerCrossAttention` and :class:`KernelSRformerCrossAttention`."""

    def __init__(self, config: SRformerConfig):
        super().__init__()
        self.s = config.segment_size
        self.n_head = config.n_head
        self.dh = config.d_model // config.n_head
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.k_proj = nn.Linear(config.embed_dim, config.d_model)
        self.v_proj = nn.Linear(config.embed_dim, config.d_model)
        self.o_proj = nn.Linear(config.d_model, config.d_model)
        # copy features: keys see the previous source token's embedding, values the token's own
        self.k_prev = nn.Linear(config.embed_dim, config.d_model, bias=False)
        self.v_tok = nn.Linear(config.embed_dim, config.d_model, bias=False)
        # per head: bonus when source token j-1 equals the last summary token, and when j-2, j-1 equal the last two
        self.match = nn.Parameter(torch.full((config.n_head, 2), 2.0))

    # -- encoder side: what a window adds to the state ---------------------------------
    def memory(self, enc: torch.Tensor, mask: torch.Tensor, tok_emb: torch.Tensor,
               prev_emb: torch.Tensor) -> dict[str, torch.Tensor]:
        """Keys, values and the K'V / sum(K^2) accumulators of encoder outputs.

        enc (B, k, E) MiniLM outputs, mask (B, k) bool; tok_emb / prev_emb (B, k, E):
        word embeddings of each source token and of the one before it (a key that
        knows its predecessor lets the decoder find where to continue copying).
        Masked positions get K = V = 0, so they never reach K'V (App. A.3).
        """
        B, k, _ = enc.shape
        keep = mask[:, None, :, None].to(enc.dtype)  # (B, 1, k, 1)
        keys = self.k_proj(enc) + self.k_prev(prev_emb)  # (B, k, d)
        values = self.v_proj(enc) + self.v_tok(tok_emb)  # (B, k, d)
        K = keys.view(B, k, self.n_head, self.dh).transpose(1, 2) * keep  # (B, h, k, dh)
        V = values.view(B, k, self.n_head, self.dh).transpose(1, 2) * keep  # (B, h, k, dh)
        kv = K.transpose(-2, -1) @ V  # (B, h, dh, dh) Eq. (15): K'V
        ksq = (K * K).sum(dim=(-2, -1))  # (B, h): norm(K)^2
        return {"k": K, "v": V, "kv": kv, "ksq": ksq}

    # -- parallel, teacher-forced ------------------------------------------------------
    def copy_context(self, source_prev: TensorPair, summary_last: TensorPair, mask: torch.Tensor,
                     seg: torch.Tensor, dtype: torch.dtype) -> TensorPair:
        """The copy-continuation indicators of the positions each step reads (see :func:`continuation`),
        and those positions: here every position, (B, 2, T, k) and (B, k). source_prev: the source
        tokens one and two back (B, k); summary_last: the summary's last and second-last tokens (B, T)."""
        B, k = mask.shape
        return continuation(*source_prev, *summary_last, dtype), torch.arange(k, device=mask.device).expand(B, k)

    def forward(self, x: torch.Tensor, mem: Mapping[str, torch.Tensor], mask: torch.Tensor,
                seg: torch.Tensor, match: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, d) decoder states; mask (B, k) valid keys; seg (B, T) segment index per step;
        match: the copy-continuation indicators of :meth:`copy_context`.

        Returns the output (B, T, d) and the softmax weights over the positions :meth:`copy_context`
        names: (B, h, T, k) here.
        """
        B, T, d = x.shape
        K, V = mem["k"], mem["v"]  # (B, h, k, dh)
        Q = self.q_proj(x).view(B, T, self.n_head, self.dh).transpose(1, 2)  # (B, h, T, dh)
        att = (Q @ K.transpose(-2, -1)) / math.sqrt(self.dh)  # (B, h, T, k) Eq. (3)
        att = att + torch.einsum("hc,bctk->bhtk", self.match, match)  # the copy bias
        att = att.masked_fill(~mask[:, None, None, :], neg(att.dtype)).softmax(dim=-1)
        return self.o_proj((att @ V).transpose(1, 2).reshape(B, T, d)), att  # Eq. (5)

    def step(self, x: torch.Tensor, mem: Mapping[str, torch.Tensor], mask: torch.Tensor, seg: torch.Tensor,
             prev: torch.Tensor, membrane: torch.Tensor, raf_out: torch.Tensor, context: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step (Algorithm 1). x (B, d); seg, prev (B,) segment index now / at the last step (-1 at
        t = 0); context (B, 2, k) the copy-continuation indicators of this step.

        Returns the output (B, d), the RAF membrane and output (B, h, dh, dh) (passed through where
        there is no RAF), and the softmax weights (B, h, n) over the encoder positions pos (B, n) read.
        """
        B, d = x.shape
        Q = self.q_proj(x).view(B, self.n_head, 1, self.dh)  # (B, h, 1, dh)
        out, att, pos, read = self._attend_step(Q, mem, mask, seg, context)
        out, membrane, raf_out = self._recurrent_step(out, Q, mem, mask, read, seg, prev, membrane, raf_out)
        return self.o_proj(out.reshape(B, d)), membrane, raf_out, att[:, :, 0], pos

    def _attend_step(self, Q: torch.Tensor, mem: Mapping[str, torch.Tensor], mask: torch.Tensor,
                     seg: torch.Tensor, context: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """Softmax attention of one step: output (B, h, 1, dh), weights (B, h, 1, n), positions read
        (B, n), and the keys, values and validity (B, 1, n, 1) read (what the recurrent part subtracts)."""
        raise NotImplementedError

    def _recurrent_step(self, out: torch.Tensor, Q: torch.Tensor, mem: Mapping[str, torch.Tensor],
                        mask: torch.Tensor, read: tuple[torch.Tensor, ...], seg: torch.Tensor, prev: torch.Tensor,
                        membrane: torch.Tensor, raf_out: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return out, membrane, raf_out  # no recurrent part outside SRformer


class FullCrossAttention(CrossAttention):
    """``full``: softmax attention over every encoder position (the baseline, Eq. 3)."""

    def _attend_step(self, Q: torch.Tensor, mem: Mapping[str, torch.Tensor], mask: torch.Tensor,
                     seg: torch.Tensor, context: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        K, V = mem["k"], mem["v"]  # (B, h, k, dh)
        B, k = mask.shape
        att = (Q @ K.transpose(-2, -1)) / math.sqrt(self.dh)  # (B, h, 1, k) Eq. (3)
        att = att + torch.einsum("hc,bck->bhk", self.match, context)[:, :, None]  # the copy bias
        att = att.masked_fill(~mask[:, None, None, :], neg(att.dtype)).softmax(dim=-1)
        pos = torch.arange(k, device=Q.device).expand(B, k)
        return att @ V, att, pos, (K, V, mask[:, None, :, None].to(K.dtype))  # (B, h, 1, dh) Eq. (5)


class SegmentedCrossAttention(CrossAttention):
    """``segmented``: the query at step t reads only segment i = min(t*m // q, m-1), s keys (Eq. 4, 6).

    Teacher-forced, the steps that read one segment form a run (Algorithm 1's schedule is monotone),
    so scores are computed run by run, (R, L) x s per head, never over all k keys: the cost of a
    summary of T tokens is T x s, whatever the document's length.
    """

    def copy_context(self, source_prev: TensorPair, summary_last: TensorPair, mask: torch.Tensor,
                     seg: torch.Tensor, dtype: torch.dtype) -> TensorPair:
        """Only the s positions of each step's segment: (B, 2, T, s) and (B, T, s) (clamped to k - 1
        past the end; those are not valid keys and get no weight)."""
        B, T = seg.shape
        pos, _ = self._segment_positions(seg, mask)  # (B, T, s)
        prev1, prev2 = (p.gather(1, pos.flatten(1)).view(B, T, self.s) for p in source_prev)
        last1, last2 = summary_last
        one = prev1 == last1[:, :, None]  # (B, T, s)
        two = one & (prev2 == last2[:, :, None])
        return torch.stack([one, two], dim=1).to(dtype), pos

    def _segment_positions(self, seg: torch.Tensor, mask: torch.Tensor) -> TensorPair:
        """The s positions of each step's segment (B, T, s), clamped to k - 1, and which are valid keys."""
        B, T = seg.shape
        k = mask.shape[1]
        pos = seg[:, :, None] * self.s + torch.arange(self.s, device=seg.device)
        clamped = pos.clamp(max=k - 1)
        return clamped, (pos < k) & mask.gather(1, clamped.flatten(1)).view(B, T, self.s)

    def forward(self, x: torch.Tensor, mem: Mapping[str, torch.Tensor], mask: torch.Tensor,
                seg: torch.Tensor, match: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`CrossAttention.forward`, reading K_Si only: weights (B, h, T, s) over each step's segment."""
        B, T, d = x.shape
        K, V = mem["k"], mem["v"]  # (B, h, k, dh)
        h, k = K.shape[1], K.shape[2]
        m = -(-k // self.s)
        Q = self.q_proj(x).view(B, T, self.n_head, self.dh).transpose(1, 2)  # (B, h, T, dh)
        runs = SegmentRuns.of(seg)
        R = runs.visited.shape[1]
        # K_s = split(K) (Eq. 4), the segments visited, in run order: (B, h, R, s, dh)
        index = runs.visited[:, None, :, None, None].expand(B, h, R, self.s, self.dh)
        Ks, Vs = (F.pad(t, (0, 0, 0, m * self.s - k)).view(B, h, m, self.s, self.dh).gather(2, index) for t in (K, V))
        scores = runs.to_blocks(Q) @ Ks.transpose(-2, -1)  # (B, h, R, L, s)
        att = runs.from_blocks(scores) / math.sqrt(self.dh)  # (B, h, T, s) Eq. (4)
        att = att + torch.einsum("hc,bcts->bhts", self.match, match)  # b_Si: the bias of the segment's positions
        _, valid = self._segment_positions(seg, mask)  # (B, T, s)
        att = att.masked_fill(~valid[:, None], neg(att.dtype)).softmax(dim=-1)
        out = runs.from_blocks(runs.to_blocks(att) @ Vs)  # (B, h, T, dh) Eq. (6): O_S
        out = self._plus_recurrent(out, Q, mem, mask, seg, runs)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, d)), att

    def _plus_recurrent(self, out: torch.Tensor, Q: torch.Tensor, mem: Mapping[str, torch.Tensor],
                        mask: torch.Tensor, seg: torch.Tensor, runs: SegmentRuns) -> torch.Tensor:
        return out  # no recurrent part outside SRformer

    def _attend_step(self, Q: torch.Tensor, mem: Mapping[str, torch.Tensor], mask: torch.Tensor,
                     seg: torch.Tensor, context: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        K, V = mem["k"], mem["v"]  # (B, h, k, dh)
        B = mask.shape[0]
        # K_s = split(K); read segment i only: positions i*s .. i*s+s-1
        pos, valid = (x[:, 0] for x in self._segment_positions(seg[:, None], mask))  # (B, s)
        gidx = pos[:, None, :, None].expand(B, self.n_head, self.s, self.dh)
        keep = valid[:, None, :, None].to(K.dtype)
        Ks = K.gather(2, gidx) * keep  # (B, h, s, dh) K_Si
        Vs = V.gather(2, gidx) * keep  # (B, h, s, dh) V_Si
        att = (Q @ Ks.transpose(-2, -1)) / math.sqrt(self.dh)  # (B, h, 1, s) Eq. (4)
        seg_context = context.gather(2, pos[:, None, :].expand(B, 2, self.s))  # (B, 2, s)
        att = att + torch.einsum("hc,bcs->bhs", self.match, seg_context)[:, :, None]  # b_Si, the segment's bias
        att = att.masked_fill(~valid[:, None, None, :], neg(att.dtype)).softmax(dim=-1)
        return att @ Vs, att, pos, (Ks, Vs, keep)  # (B, h, 1, dh) Eq. (6): O_S


class SRformerCrossAttention(SegmentedCrossAttention):
    """``srformer``: segmented attention plus recurrent attention over the other segments through a RAF
    neuron, O = O_S + O_R (Eq. 11), O_R in the paper's form (Eq. 13):

        O_R[t] = Q_t RAF(P_i) / norm(K),   P_i = K'V - K_Si'V_Si (Eq. 16)

    with i the segment step t reads. The RAF updates only when i changes (Algorithm 1).

    The ablations: ``recurrent_gate`` gives O_S + g O_R (Eq. 10's trainable weight; :meth:`_combine`),
    ``segmented_part=False`` drops O_S (the paper's ablation I; :meth:`_combine`), ``recurrent_part="linear"``
    drops the RAF (ablation III; :meth:`_accumulate`) and ``recurrent_part="off"`` skips O_R in both paths
    (the segmented model with these weights, RAF and all: a diagnostic).

    The kernel form of O_R (:class:`KernelSRformerCrossAttention`) overrides what it changes: the
    products the memory accumulates and the step reads (:meth:`memory`, :meth:`_remaining`,
    :meth:`_step_raf_input`), the RAF's input and the query's features (:meth:`_raf_input`,
    :meth:`_query_features`) and the divisor (:meth:`_divisor`, :meth:`_step_divisor`).
    """

    raf_unit_gain = False  # the RAF's input scaled by (1 - leak) (:class:`RAF`)

    def __init__(self, config: SRformerConfig):
        super().__init__(config)
        self.part = config.recurrent_part
        self.segmented_part = config.segmented_part
        if self.part == "off" and not self.segmented_part:
            raise ValueError("recurrent_part='off' with segmented_part=False leaves no cross-attention")
        self.raf = RAF(self.dh, config.raf_clamp, config.raf_threshold, unit_gain=self.raf_unit_gain)
        # Eq. (10): a trainable weight on O_R, from gate_init (0: the model starts as the segmented one)
        self.gate = (nn.Parameter(torch.full((config.n_head, 1, 1), float(config.gate_init)))
                     if config.recurrent_gate else None)
        self.stats: dict[str, torch.Tensor] = {}  # of the last parallel forward: sizes of O_S, O_R; RAF firing

    # -- what Eq. 13 computes; the kernel form overrides these ---------------------------
    def _remaining(self, mem: Mapping[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """P_i for every segment i (B, h, m, dh, dh), Eq. (16)."""
        return remaining_products(mem, self.s)

    def _raf_input(self, P: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What the RAF reads of P (..., dh, c), and the divisor the kernel form reads beside it (None here)."""
        return P, None

    def _step_raf_input(self, mem: Mapping[str, torch.Tensor], Ks: torch.Tensor, Vs: torch.Tensor,
                        keep: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        """The RAF's input of one step from the segment it reads, K_Si, V_Si (B, h, s, dh): P_i, Eq. (16)."""
        return mem["kv"] - Ks.transpose(-2, -1) @ Vs  # (B, h, dh, dh)

    def _step_divisor(self, mem: Mapping[str, torch.Tensor], Ks: torch.Tensor, keep: torch.Tensor
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """What one step reads of its segment for the divisor, and the scale of the RAF's input: nothing for
        Eq. 13, whose norm(K) the memory holds."""
        return None, None

    def _query_features(self, Q: torch.Tensor) -> torch.Tensor:
        """What multiplies RAF(P): Q_t (Eq. 13)."""
        return Q

    def _divisor(self, features: torch.Tensor, z: torch.Tensor | None, mem: Mapping[str, torch.Tensor]
                 ) -> torch.Tensor:
        """What O_R's numerator is divided by: norm(K) per head (B, h, 1, 1), Eq. (13)."""
        return mem["ksq"].clamp(min=tiny(features.dtype, 1e-12)).sqrt()[:, :, None, None]

    # -- the recurrent part ----------------------------------------------------------------
    def _accumulate(self, x: torch.Tensor, membrane: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RAF(x) and the next membrane (Sec. 3.3), or x itself without the RAF (ablation III)."""
        return self.raf(x, membrane) if self.part == "raf" else (x, membrane)

    def _normalised(self, numerator: torch.Tensor, features: torch.Tensor, z: torch.Tensor | None,
                    mem: Mapping[str, torch.Tensor], has_rest: torch.Tensor) -> torch.Tensor:
        """O_R (B, h, T, dh) from its numerator, the query features (B, h, T, dh) and, for the kernel form,
        the divisor z (B, h, T, dh). Zero where the step's R_i holds no valid position (has_rest (B, T)
        false: a document of one segment), where Eq. 22 is 0/0 and a learned negative threshold would
        otherwise fire into it."""
        o_r = numerator / self._divisor(features, z, mem)
        return o_r * has_rest[:, None, :, None].to(o_r.dtype)

    def _combine(self, o_s: torch.Tensor, o_r: torch.Tensor) -> torch.Tensor:
        """Eq. (11) O_S + O_R, or (10) O_S + g O_R; O_R alone without the segmented part."""
        o_r = o_r if self.gate is None else self.gate * o_r
        return o_s + o_r if self.segmented_part else o_r

    def _plus_recurrent(self, out: torch.Tensor, Q: torch.Tensor, mem: Mapping[str, torch.Tensor],
                        mask: torch.Tensor, seg: torch.Tensor, runs: SegmentRuns) -> torch.Tensor:
        """O_R for every step at once (Eq. 13 or 22, Eq. 16), the RAF run once per visited segment."""
        if self.part == "off":
            return out
        B, h, k, dh = mem["k"].shape
        T = seg.shape[1]
        P = self._remaining(mem, mask)  # (B, h, m, dh, c) Eq. (16)
        x, z = self._raf_input(P)  # (B, h, m, dh, dh), divisor (B, h, m, dh)
        # Algorithm 1: the RAF updates only when the segment index changes (and at t = 0): once per run
        R = runs.visited.shape[1]
        x_vis = x.gather(2, runs.visited[:, None, :, None, None].expand(B, h, R, dh, dh))  # (B, h, R, dh, dh)
        membrane = torch.zeros(B, h, dh, dh, dtype=Q.dtype, device=Q.device)  # reset at t = 0
        fired = []
        for x_r in x_vis.unbind(dim=2):  # one view per run (indexing each would zero-fill a full gradient per run)
            spikes, membrane = self._accumulate(x_r, membrane)
            fired.append(spikes)
        raf_out = torch.stack(fired, dim=2)  # (B, h, R, dh, dh)
        # features(Q_t) @ RAF(P) per step: the queries in (R, L) blocks, one matmul, back in step order
        features = self._query_features(Q)  # (B, h, T, dh)
        numerator = runs.from_blocks(runs.to_blocks(features) @ raf_out)  # (B, h, T, dh)
        z_t = None if z is None else z.gather(2, seg[:, None, :, None].expand(B, h, T, dh))  # (B, h, T, dh)
        m = x.shape[2]
        in_segment = F.pad(mask, (0, m * self.s - k)).view(B, m, self.s).sum(dim=-1)  # (B, m) valid keys per segment
        has_rest = (mask.sum(dim=1, keepdim=True) - in_segment).gather(1, seg) > 0  # (B, T): R_i not empty
        o_r = self._normalised(numerator, features, z_t, mem, has_rest)  # Eq. (13) / (22)
        if self.training:
            self.stats = {"o_s_rms": out.detach().pow(2).mean().sqrt(), "o_r_rms": o_r.detach().pow(2).mean().sqrt(),
                          "raf_fired": (raf_out.detach() > 0).float().mean()}
        return self._combine(out, o_r)  # Eq. (11)

    def _recurrent_step(self, out: torch.Tensor, Q: torch.Tensor, mem: Mapping[str, torch.Tensor],
                        mask: torch.Tensor, read: tuple[torch.Tensor, ...], seg: torch.Tensor, prev: torch.Tensor,
                        membrane: torch.Tensor, raf_out: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.part == "off":
            return out, membrane, raf_out
        Ks, Vs, keep = read  # (B, h, s, dh), (B, 1, s, 1): the segment the softmax part read
        changed = (seg != prev)[:, None, None, None]  # update only when the index changes
        z, scale = self._step_divisor(mem, Ks, keep)  # read every step; the (dh, dh) product only on change
        # eager mode skips the update when no row changed; traced/exported graphs always
        # compute it and select (same result, no data-dependent branch)
        if torch.jit.is_tracing() or torch.compiler.is_exporting() or bool(changed.any()):
            new_out, new_membrane = self._accumulate(self._step_raf_input(mem, Ks, Vs, keep, scale), membrane)
            raf_out = torch.where(changed, new_out, raf_out)
            membrane = torch.where(changed, new_membrane, membrane)
        features = self._query_features(Q)  # (B, h, 1, dh)
        has_rest = (mask.sum(dim=1).to(keep.dtype) > keep.sum(dim=(1, 2, 3)))[:, None]  # (B, 1): R_i not empty
        o_r = self._normalised(features @ raf_out, features, z, mem, has_rest)  # (B, h, 1, dh) Eq. (13) / (22)
        return self._combine(out, o_r), membrane, raf_out  # Eq. (11)


class KernelSRformerCrossAttention(SRformerCrossAttention):
    """``srformer`` with ``recurrent_norm="kernel"``: O_R in the form of App. A.1, Eq. (22), with the
    kernel phi = elu + 1 (Katharopoulos et al., 2020):

        O_R[t] = phi(Q_t) RAF(P_i / c_i) / (phi(Q_t) z_i / c_i)

    P_i = sum over the remaining positions R_i of phi(K_j)'V_j, z_i = sum over R_i of phi(K_j), and
    c_i = mean(z_i) (ours: dividing both by the same scalar leaves Eq. 22 unchanged and gives the RAF an
    input whose scale does not grow with the document, so its threshold means the same at any length).
    The running K'V carries sum(phi(K)) as one more column (``SRformerConfig.kv_columns``). The RAF runs
    with unit gain (:class:`RAF`). Without the RAF (``recurrent_part="linear"``) this is exactly Eq. 22,
    linear attention over R_i, on O_S's scale.
    """

    raf_unit_gain = True

    def memory(self, enc: torch.Tensor, mask: torch.Tensor, tok_emb: torch.Tensor,
               prev_emb: torch.Tensor) -> dict[str, torch.Tensor]:
        mem = super().memory(enc, mask, tok_emb, prev_emb)
        # the running sums of Eq. (22): phi(K)'[V, 1], (B, h, dh, dh + 1)
        mem["kv"] = kernel_product(mem["k"], mem["v"], mask[:, None, :, None].to(enc.dtype))
        return mem

    def _remaining(self, mem: Mapping[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """[P_i, z_i] for every segment i (B, h, m, dh, dh + 1): Eq. (16) with phi."""
        return remaining_products(mem, self.s, mask)

    def _raf_input(self, P: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """P_i / c_i (..., dh, dh) and z_i / c_i (..., dh) from [P_i, z_i] (..., dh, dh + 1)."""
        z = P[..., -1]  # (..., dh): sum of phi(K_j) over R_i
        c = z.mean(dim=-1, keepdim=True).clamp(min=tiny(P.dtype, 1e-6))  # (..., 1)
        return P[..., :-1] / c[..., None], z / c

    def _step_divisor(self, mem: Mapping[str, torch.Tensor], Ks: torch.Tensor, keep: torch.Tensor
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """z_i / c_i (B, h, 1, dh) and c_i (B, h, 1) of the step's segment: the running sum of phi(K) less
        S_i's (s * dh per step)."""
        z_rest = mem["kv"][..., -1] - (phi(Ks) * keep).sum(dim=-2)  # (B, h, dh); phi(K_Si), zero where not valid
        c = z_rest.mean(dim=-1, keepdim=True).clamp(min=tiny(Ks.dtype, 1e-6))  # (B, h, 1)
        return (z_rest / c)[:, :, None, :], c

    def _step_raf_input(self, mem: Mapping[str, torch.Tensor], Ks: torch.Tensor, Vs: torch.Tensor,
                        keep: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        """P_i / c_i (B, h, dh, dh): Eq. (16) with phi, scaled by the step's c_i."""
        assert scale is not None
        return (mem["kv"][..., :-1] - (phi(Ks) * keep).transpose(-2, -1) @ Vs) / scale[..., None]

    def _query_features(self, Q: torch.Tensor) -> torch.Tensor:
        """What multiplies RAF(P): phi(Q_t) (Eq. 22)."""
        return phi(Q)

    def _divisor(self, features: torch.Tensor, z: torch.Tensor | None, mem: Mapping[str, torch.Tensor]
                 ) -> torch.Tensor:
        """phi(Q_t) z_i / c_i (B, h, T, 1), Eq. (22)."""
        assert z is not None
        return (features * z).sum(dim=-1, keepdim=True).clamp(min=tiny(features.dtype, 1e-6))


def srformer_cross_attention(config: SRformerConfig) -> SRformerCrossAttention:
    """``srformer``: the class of the config's form of O_R (``recurrent_norm``)."""
    if config.recurrent_norm == "kernel":
        return KernelSRformerCrossAttention(config)
    return SRformerCrossAttention(config)


# the cross-attention of each mode (``SRformerConfig.cross_attention``), built from the config
CROSS_ATTENTION: dict[str, Callable[[SRformerConfig], CrossAttention]] = {
    "full": FullCrossAttention, "segmented": SegmentedCrossAttention, "srformer": srformer_cross_attention,
}


def cross_attention(config: SRformerConfig) -> CrossAttention:
    """The cross-attention a config names: its mode, and for the SRformer the form of O_R."""
    return CROSS_ATTENTION[config.cross_attention](config)


class SelfAttention(nn.Module):
    """Causal multi-head self-attention over the summary so far."""

    def __init__(self, config: SRformerConfig):
        super().__init__()
        self.n_head = config.n_head
        self.dh = config.d_model // config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.dh).permute(2, 0, 3, 1, 4)  # (B, h, T, dh)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.dh)  # (B, h, T, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, neg(att.dtype)).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, d))

    def step(self, x: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, valid: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, d); caches (B, h, t, dh) -> output (B, d), caches (B, h, t+1, dh).

        valid (B, t+1) marks the cache positions that hold this row's own earlier tokens (and the
        new one): rows of different documents decoded in one batch carry padding in between.
        """
        B, d = x.shape
        q, k, v = self.qkv(x).view(B, 3, self.n_head, 1, self.dh).unbind(1)  # (B, h, 1, dh)
        cache_k = torch.cat([cache_k, k], dim=2)
        cache_v = torch.cat([cache_v, v], dim=2)
        att = (q @ cache_k.transpose(-2, -1)) / math.sqrt(self.dh)  # (B, h, 1, t+1)
        att = att.masked_fill(~valid[:, None, None, :], neg(att.dtype)).softmax(dim=-1)
        return self.proj((att @ cache_v).reshape(B, d)), cache_k, cache_v


class Block(nn.Module):
    """Pre-LN decoder block: self-attention, cross-attention (the config's variant), MLP."""

    def __init__(self, config: SRformerConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.attn = SelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.cross = cross_attention(config)
        self.ln_3 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.mlp = nn.Sequential(nn.Linear(config.d_model, config.d_ff), nn.GELU(),
                                 nn.Linear(config.d_ff, config.d_model))
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, mem: Mapping[str, torch.Tensor], mask: torch.Tensor,
                seg: torch.Tensor, match: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.drop(self.attn(self.ln_1(x)))
        a, att = self.cross(self.ln_2(x), mem, mask, seg, match)
        x = x + self.drop(a)
        return x + self.drop(self.mlp(self.ln_3(x))), att

    def step(self, x: torch.Tensor, cache: Mapping[str, torch.Tensor], mem: Mapping[str, torch.Tensor],
             mask: torch.Tensor, seg: torch.Tensor, prev: torch.Tensor, context: torch.Tensor,
             self_valid: torch.Tensor) -> tuple[torch.Tensor, State, torch.Tensor, torch.Tensor]:
        """One decoder step of this block. cache holds this layer's "self_k", "self_v", "membrane",
        "raf_out"; self_valid (B, t+1) the self-attention positions this row may read. Returns the
        output (B, d), the cache's next values, and the cross-attention weights and positions (see
        :meth:`CrossAttention.step`)."""
        new: State = {}
        a, new["self_k"], new["self_v"] = self.attn.step(self.ln_1(x), cache["self_k"], cache["self_v"],
                                                         self_valid)
        x = x + a
        a, new["membrane"], new["raf_out"], att, pos = self.cross.step(
            self.ln_2(x), mem, mask, seg, prev, cache["membrane"], cache["raf_out"], context)
        x = x + a
        return x + self.mlp(self.ln_3(x)), new, att, pos


class PostLNBlock(Block):
    """Post-LN block, as BERT's layers (``norm_position="post"``), so MiniLM's layers can warm-start it
    (BERT2BERT-style, :func:`warm_start_from_minilm`)."""

    def forward(self, x: torch.Tensor, mem: Mapping[str, torch.Tensor], mask: torch.Tensor,
                seg: torch.Tensor, match: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.ln_1(x + self.drop(self.attn(x)))
        a, att = self.cross(x, mem, mask, seg, match)
        x = self.ln_2(x + self.drop(a))
        return self.ln_3(x + self.drop(self.mlp(x))), att

    def step(self, x: torch.Tensor, cache: Mapping[str, torch.Tensor], mem: Mapping[str, torch.Tensor],
             mask: torch.Tensor, seg: torch.Tensor, prev: torch.Tensor, context: torch.Tensor,
             self_valid: torch.Tensor) -> tuple[torch.Tensor, State, torch.Tensor, torch.Tensor]:
        new: State = {}
        a, new["self_k"], new["self_v"] = self.attn.step(x, cache["self_k"], cache["self_v"], self_valid)
        x = self.ln_1(x + a)
        a, new["membrane"], new["raf_out"], att, pos = self.cross.step(
            x, mem, mask, seg, prev, cache["membrane"], cache["raf_out"], context)
        x = self.ln_2(x + a)
        return self.ln_3(x + self.mlp(x)), new, att, pos


BLOCKS: dict[str, type[Block]] = {"pre": Block, "post": PostLNBlock}


class SRformer(nn.Module):
    """The decoder (and the encoder-side projections) of the summarizer, and its salience head.

    Word embeddings are a non-persistent buffer filled from MiniLM by
    ``models.srformer_weights.load_srformer`` (random in tests), so checkpoints hold only the
    decoder's own weights (and the head's, under the names of ``models.salience_head.CHECKPOINT_NAMES``).
    """

    def __init__(self, config: SRformerConfig):
        super().__init__()
        self.config = config
        self.register_buffer("wte", torch.randn(config.vocab_size, config.embed_dim) * 0.05, persistent=False)
        self.embed_in = nn.Linear(config.embed_dim, config.d_model, bias=False)
        self.wpe = nn.Embedding(config.max_target, config.d_model)
        self.ln_e = (nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)  # BERT's embedding LayerNorm
                     if config.norm_position == "post" else None)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([BLOCKS[config.norm_position](config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.embed_out = nn.Linear(config.d_model, config.embed_dim)  # tied to wte after this
        self.out_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.copy_gate = nn.Linear(config.d_model, 1)  # g: the vocabulary's share against the pointer's
        # what sentence copy reads: a_t per source token on the encoder's outputs, and its sentence weights
        self.salience = (SalienceHead(config.embed_dim, config.vocab_size, config.salience_lexical)
                         if config.salience else None)
        self.register_state_dict_post_hook(to_checkpoint_names)  # the head's tensors under their checkpoint names
        self.register_load_state_dict_pre_hook(from_checkpoint_names)

    # -- encoder side ----------------------------------------------------------------------
    def memory(self, enc: torch.Tensor, mask: torch.Tensor, source_ids: torch.Tensor,
               first_prev: torch.Tensor | None = None) -> list[dict[str, torch.Tensor]]:
        """Per-layer cross-attention keys/values and accumulators of encoder outputs (B, k, E).

        source_ids (B, k) are the tokens the encoder read; ``first_prev`` (B,) is the
        token before the first one ([CLS] at the start of a document, the last token
        of the previous window when a stream appends a window).
        """
        if first_prev is None:
            first_prev = torch.full_like(source_ids[:, 0], self.config.bos_id)
        prev_ids = torch.cat([first_prev[:, None], source_ids[:, :-1]], dim=1)  # (B, k)
        tok_emb, prev_emb = self.wte[source_ids], self.wte[prev_ids]  # (B, k, E)
        return [block.cross.memory(enc, mask, tok_emb, prev_emb) for block in self.blocks]

    def schedule(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """m (number of segments) and q (summary length of the schedule), each (B,)."""
        k_valid = mask.long().sum(dim=1).clamp(min=1)
        m = torch.div(k_valid + self.config.segment_size - 1, self.config.segment_size, rounding_mode="floor")
        return m, schedule_length(self.config, k_valid)

    def vocab(self, source_ids: torch.Tensor, mask: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Candidate output ids (B, V), their validity (B, V), and the column of each source token (B, k)."""
        c = self.config
        B = source_ids.shape[0]
        if c.output_vocab == "full":
            ids = torch.arange(c.vocab_size, device=source_ids.device).expand(B, -1)
            return ids, torch.ones_like(ids, dtype=torch.bool), source_ids.clamp(0, c.vocab_size - 1)
        rows = []
        for b in range(B):
            ids = source_ids[b][mask[b]]
            rows.append(torch.unique(torch.cat([ids, ids.new_tensor([c.eos_id])])))  # sorted
        width = max(len(r) for r in rows)
        ids = torch.full((B, width), c.pad_id, dtype=torch.long, device=source_ids.device)
        valid = torch.zeros(B, width, dtype=torch.bool, device=source_ids.device)
        for b, row in enumerate(rows):
            ids[b, : len(row)] = row
            valid[b, : len(row)] = True
        ids = torch.where(valid, ids, torch.full_like(ids, torch.iinfo(torch.long).max))  # sorted rows
        src_index = torch.searchsorted(ids, source_ids).clamp(max=width - 1)  # (B, k)
        return torch.where(valid, ids, torch.full_like(ids, c.pad_id)), valid, src_index

    @property
    def folds_output_head(self) -> bool:
        """Decoding folds the output layer once per document (:meth:`output_head`) where the candidates
        are the document's own ids; over all of WordPiece the folded weights would be vocab_size x d per row."""
        return self.config.output_vocab == "source"

    def output_head(self, vocab_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The tied output layer folded for candidate ids (B, V): weights (B, V, d) and biases (B, V).

        logits = (x W_o' + b_o) w' + b_w with w = wte[vocab_ids] (B, V, E) and W_o, b_o = embed_out,
        which is x (w W_o)' + (w b_o + b_w). Folded once per document, a decoder step reads V x d
        numbers per row instead of gathering V x E from the embedding table (d = 128 < E = 384).
        """
        w = self.wte[vocab_ids]
        return w @ self.embed_out.weight, w @ self.embed_out.bias + self.out_bias[vocab_ids]

    def _output(self, x: torch.Tensor, att: torch.Tensor, pos: torch.Tensor, vocab_ids: torch.Tensor,
                vocab_mask: torch.Tensor, src_index: torch.Tensor,
                head: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Log-probabilities (B, T, V) over vocab_ids from decoder states x (B, T, d).

        ``head``: the output layer folded for these ids (:meth:`output_head`), else it is applied as
        written. The pointer is mixed in: p = g p_vocab + (1 - g) p_copy, p_copy the last layer's
        cross-attention weights att (B, h, T, n) over source positions pos (B, n)
        (the attended segment in segmented/SRformer modes), averaged over heads
        and added up per token id.
        """
        x = self.ln_f(x)
        # float32 from here on whatever the weights' precision: NEG and 1e-30 below need its range
        if head is None:
            w = self.wte[vocab_ids]  # (B, V, E) tied output embeddings
            logits = (self.embed_out(x) @ w.transpose(1, 2) + self.out_bias[vocab_ids][:, None, :]).float()
        else:
            weight, bias = head
            logits = (x @ weight.transpose(1, 2) + bias[:, None, :]).float()  # (B, T, V)
        logits = logits.masked_fill(~vocab_mask[:, None, :], NEG)
        B, T, V = logits.shape
        gate = torch.sigmoid(self.copy_gate(x)).float()  # (B, T, 1)
        if pos.dim() == 2:  # the same positions for every step
            cols = src_index.gather(1, pos)[:, None, :].expand(B, T, pos.shape[1])  # (B, T, n)
        else:  # per step (B, T, n)
            cols = src_index.gather(1, pos.flatten(1)).view(pos.shape)
        p_copy = torch.zeros_like(logits).scatter_add(2, cols, att.float().mean(dim=1))  # (B, T, V)
        p = gate * logits.softmax(dim=-1) + (1 - gate) * p_copy
        return p.clamp_min(1e-30).log().masked_fill(~vocab_mask[:, None, :], NEG)

    def _source_context(self, vocab_ids: torch.Tensor, src_index: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Source tokens before each position, one back and two back (B, k); [CLS] then -1 before the start."""
        source = vocab_ids.gather(1, src_index)  # (B, k)
        start = torch.full_like(source[:, :1], self.config.bos_id)
        prev1 = torch.cat([start, source[:, :-1]], dim=1)
        prev2 = torch.cat([torch.full_like(start, -1), prev1[:, :-1]], dim=1)
        return prev1, prev2

    # -- parallel, teacher-forced ----------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, memory: list[dict[str, torch.Tensor]], mask: torch.Tensor,
                vocab_ids: torch.Tensor, vocab_mask: torch.Tensor, src_index: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) decoder input ([CLS] + summary) -> log-probabilities (B, T, V) over vocab_ids."""
        B, T = tokens.shape
        m, q = self.schedule(mask)
        seg = segment_index(torch.arange(T, device=tokens.device)[None, :], m[:, None], q[:, None])  # (B, T)
        x = self.embed_in(self.wte[tokens]) + self.wpe(torch.arange(T, device=tokens.device))  # (B, T, d)
        x = self.drop(x if self.ln_e is None else self.ln_e(x))
        prev1, prev2 = self._source_context(vocab_ids, src_index)  # (B, k)
        last2 = torch.cat([torch.full_like(tokens[:, :1], -1), tokens[:, :-1]], dim=1)  # (B, T)
        # the positions the cross-attention reads, (B, k) or per step (B, T, s), and their copy features
        match, pos = self.blocks[0].cross.copy_context((prev1, prev2), (tokens, last2), mask, seg, x.dtype)
        for block, mem in zip(self.blocks, memory, strict=True):
            x, att = block(x, mem, mask, seg, match)
        return self._output(x, att, pos, vocab_ids, vocab_mask, src_index)

    # -- incremental -----------------------------------------------------------------------------
    def init_cache(self, batch: int, device: torch.device | None = None) -> State:
        """Decoder cache before step 0: empty self-attention K/V, RAF state reset (Algorithm 1, t = 0)."""
        c = self.config
        dh = c.d_model // c.n_head
        cache: State = {"prev": torch.full((batch,), -1, dtype=torch.long, device=device),
                        "last": torch.full((batch,), -1, dtype=torch.long, device=device),
                        "self_mask": torch.zeros(batch, 0, dtype=torch.bool, device=device)}
        for layer in range(c.n_layer):
            cache[f"self_k{layer}"] = torch.zeros(batch, c.n_head, 0, dh, device=device)
            cache[f"self_v{layer}"] = torch.zeros(batch, c.n_head, 0, dh, device=device)
            cache[f"membrane{layer}"] = torch.zeros(batch, c.n_head, dh, dh, device=device)
            cache[f"raf_out{layer}"] = torch.zeros(batch, c.n_head, dh, dh, device=device)
        return cache

    def step(self, token: torch.Tensor, t: int | torch.Tensor, cache: Mapping[str, torch.Tensor],
             memory: list[dict[str, torch.Tensor]], mask: torch.Tensor, vocab_ids: torch.Tensor,
             vocab_mask: torch.Tensor, src_index: torch.Tensor,
             head: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, State]:
        """One decoder step: token (B,) at position t -> log-probabilities (B, V), the next cache.
        ``head``: the output layer folded for ``vocab_ids`` once per search (:meth:`output_head`)."""
        m, q = self.schedule(mask)
        t = torch.as_tensor(t, device=m.device).expand_as(m)  # (B,): one step index, or one per row (export)
        seg = segment_index(t, m, q)  # (B,)
        x = self.embed_in(self.wte[token]) + self.wpe(t)  # (B, d)
        x = x if self.ln_e is None else self.ln_e(x)
        # self_mask (B, t): which self-attention cache positions are this row's own (rows of different
        # documents decoded together are padded to one length); the new token's position is always valid
        self_valid = torch.cat([cache["self_mask"], torch.ones_like(token, dtype=torch.bool)[:, None]], dim=1)
        new: State = {"prev": seg, "last": token, "self_mask": self_valid}
        prev1, prev2 = self._source_context(vocab_ids, src_index)
        context = continuation(prev1, prev2, token[:, None], cache["last"][:, None], x.dtype)[:, :, 0]  # (B, 2, k)
        names = ("self_k", "self_v", "membrane", "raf_out")  # per-layer cache entries, suffixed by the layer
        for layer, (block, mem) in enumerate(zip(self.blocks, memory, strict=True)):
            x, block_cache, att, pos = block.step(x, {n: cache[f"{n}{layer}"] for n in names}, mem, mask, seg,
                                                  cache["prev"], context, self_valid)
            new.update({f"{n}{layer}": block_cache[n] for n in names})
        return self._output(x[:, None], att[:, :, None], pos, vocab_ids, vocab_mask, src_index, head)[:, 0], new

    # -- generation ---------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, memory: list[dict[str, torch.Tensor]], mask: torch.Tensor, source_ids: torch.Tensor,
                 max_len: int | None = None, beams: int = 1, no_repeat_ngram: int = 0,
                 length_penalty: float = 1.0, ends: frozenset[int] = frozenset()) -> list[list[int]]:
        """Greedy (beams=1) or beam search; returns token ids per document (without [CLS]/[SEP]).

        The searches are the service's own (``models.decoding``), driven here by :meth:`step`:
        training's dev selection, ``rtserve eval`` and the service decode the same way. Greedy
        decodes the batch's documents together; beam search one document at a time. The length
        cap is ``max_len`` or, when None, 1.25 * q of the document (bounded by max_target); with
        sentence-end ids ``ends`` (the service's free decoding), a summary does not end before q tokens and
        stops at the first sentence end at or past q.
        """
        c = self.config
        vocab_ids, vocab_mask, src_index = self.vocab(source_ids, mask)
        _, q = self.schedule(mask)
        limits = [min(max_len if max_len is not None else int(math.ceil(1.25 * int(q_b))), c.max_target)
                  for q_b in q.tolist()]
        targets = [min(int(q_b), limit) for q_b, limit in zip(q.tolist(), limits, strict=True)]
        row_vocab = [vocab_ids[b][vocab_mask[b]].cpu().numpy() for b in range(len(limits))]  # sorted ids
        if beams == 1:
            searches = [GreedySearch(c.bos_id, c.eos_id, row_vocab[b], limit, no_repeat_ngram, None, ends, targets[b],
                                     targets[b] if ends else 0) for b, limit in enumerate(limits)]
            self._drive(searches, memory, mask, vocab_ids, vocab_mask, src_index)
            return [search.result() for search in searches]
        results = []
        for b, limit in enumerate(limits):
            search = BeamSearch(c.bos_id, c.eos_id, row_vocab[b], limit, no_repeat_ngram, beams, length_penalty,
                                ends, targets[b], targets[b] if ends else 0)
            rows = torch.full((beams,), b, dtype=torch.long, device=mask.device)
            self._drive([search], [{n: t.index_select(0, rows) for n, t in mem.items()} for mem in memory],
                        mask[rows], vocab_ids[rows], vocab_mask[rows], src_index[rows])
            results.append(search.result())
        return results

    def _drive(self, searches: list[Search], memory: list[dict[str, torch.Tensor]], mask: torch.Tensor,
               vocab_ids: torch.Tensor, vocab_mask: torch.Tensor, src_index: torch.Tensor) -> None:
        """Step the decoder for every row of ``searches`` (their rows stacked in order) until all are done.

        Each search reads its own rows' log-probabilities and names every row's parent (beam
        reordering); the cache follows the parents. A finished search's rows keep stepping unread.
        """
        offsets = np.cumsum([0] + [search.rows for search in searches])
        cache = self.init_cache(int(offsets[-1]), mask.device)
        head = self.output_head(vocab_ids) if self.folds_output_head else None  # as the service's decode graph
        t = 0
        while not all(search.done for search in searches):
            tokens = torch.as_tensor(np.concatenate([search.tokens for search in searches]), device=mask.device)
            logp, cache = self.step(tokens, t, cache, memory, mask, vocab_ids, vocab_mask, src_index, head)
            logp = logp.float().cpu().numpy()
            parents = np.arange(offsets[-1])
            for search, start, end in zip(searches, offsets[:-1], offsets[1:], strict=True):
                if not search.done:
                    parents[start:end] = start + search.advance(logp[start:end])
            if not np.array_equal(parents, np.arange(offsets[-1])):
                index = torch.as_tensor(parents, device=mask.device)
                cache = {name: tensor.index_select(0, index) for name, tensor in cache.items()}
            t += 1


def continuation(prev1: torch.Tensor, prev2: torch.Tensor, last1: torch.Tensor, last2: torch.Tensor,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Copy-continuation indicators (B, 2, T, k): source j follows the summary's last token
    (prev1[j] == last1[t]) and its last two tokens (also prev2[j] == last2[t]); in ``dtype``, the
    decoder's (a float32 bias added to fp16 scores stops an fp16 ``decode_step``)."""
    one = prev1[:, None, :] == last1[:, :, None]  # (B, T, k)
    two = one & (prev2[:, None, :] == last2[:, :, None])
    return torch.stack([one, two], dim=1).to(dtype)


# --------------------------------------------------------------------------------------------
# Encoder side: MiniLM window by window
# --------------------------------------------------------------------------------------------


def encode_windows(encoder: nn.Module, ids: torch.Tensor, window: int, cls_id: int = 101,
                   sep_id: int = 102) -> torch.Tensor:
    """Encode a token sequence (n,) window by window: each window is [CLS] w [SEP]; returns (n, E)."""
    outs = []
    for start in range(0, ids.shape[0], window):
        chunk = ids[start: start + window]
        full = torch.cat([chunk.new_tensor([cls_id]), chunk, chunk.new_tensor([sep_id])])[None]  # (1, w+2)
        outs.append(encoder(input_ids=full, attention_mask=torch.ones_like(full))[0, 1:-1])  # (w, E)
    if not outs:
        return torch.zeros(0, encoder.config.hidden_size)
    return torch.cat(outs, dim=0)
