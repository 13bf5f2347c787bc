"""The SRformer's salience head: how much each source token says that its sentence belongs in the summary.

Sentence copy (``models/sentence_choice.py``, whose docstring has the sentence score z_j) reads the head:

- ``token``: a_t = w . e_t + b per source token t, on the frozen MiniLM encoder's output e_t;
- ``position``: p, the weights of a sentence's position;
- with a lexicon (``SRformerConfig.salience_lexical``): ``word``, a weight v_x per WordPiece id x;
  ``lexical``, q, the weights of a sentence's centrality and length; and ``idf``, the inverse document
  frequencies those are counted with.

The head is fitted apart from the decoder (``models/training/srformer_salience.py``), as the encoder is
frozen; the export runs ``token`` in the encoder-window graph and hands the rest to the service as
settings and assets (``models/serving/srformer.py``).

Checkpoints name the head's tensors as the SRformer first stored them, beside the decoder's
(``CHECKPOINT_NAMES``): a model holding the head as ``salience`` registers :func:`to_checkpoint_names`
and :func:`from_checkpoint_names` as its state-dict hooks, so its ``state_dict()`` and
``load_state_dict()`` speak the checkpoints' names.
"""

from __future__ import annotations

import torch
from torch import nn

from models.sentence_choice import Lexicon

# the head's tensors (under the model's "salience.") -> their names in a checkpoint
CHECKPOINT_NAMES = {
    "token.weight": "salience.weight",  # w (1, E)
    "token.bias": "salience.bias",  # b (1,)
    "position": "salience_position",  # p (3,)
    "word": "salience_token",  # v (vocab,)
    "lexical": "salience_lexical",  # q (2,)
    "idf": "salience_idf",  # (vocab,)
}


class SalienceHead(nn.Module):
    """a_t per source token, and the sentence-level weights sentence copy adds to their mean."""

    def __init__(self, embed_dim: int, vocab_size: int, lexical: bool) -> None:
        super().__init__()
        self.token = nn.Linear(embed_dim, 1)  # a_t = w . e_t + b
        self.position = nn.Parameter(torch.zeros(3))  # p: first sentence, 1 / (1 + j), j / n
        if lexical:
            self.word = nn.Parameter(torch.zeros(vocab_size))  # v_x per WordPiece id
            self.lexical = nn.Parameter(torch.zeros(2))  # q: centrality, length
            self.register_buffer("idf", torch.ones(vocab_size))  # counted on the training documents
        else:
            self.word, self.lexical, self.idf = None, None, None

    def forward(self, enc: torch.Tensor) -> torch.Tensor:
        """Encoder outputs (B, k, E) -> a_t (B, k)."""
        return self.token(enc).squeeze(-1)

    def lexicon(self) -> Lexicon | None:
        """The lexical part, as sentence copy reads it (None without one)."""
        if self.lexical is None or self.word is None or self.idf is None:
            return None
        q = self.lexical.detach().double().tolist()
        return Lexicon(self.word.detach().double().numpy(), self.idf.double().numpy(), (q[0], q[1]))


def to_checkpoint_names(module: nn.Module, state_dict: dict[str, torch.Tensor], prefix: str,
                        local_metadata: object) -> None:
    """State-dict hook of a model holding the head as ``salience``: its tensors under their checkpoint names."""
    for name, stored in CHECKPOINT_NAMES.items():
        if f"{prefix}salience.{name}" in state_dict:
            state_dict[prefix + stored] = state_dict.pop(f"{prefix}salience.{name}")


def from_checkpoint_names(module: nn.Module, state_dict: dict[str, torch.Tensor], prefix: str,
                          *args: object) -> None:
    """Load-state-dict pre-hook of that model: a checkpoint's names of the head's tensors to the head's own."""
    for name, stored in CHECKPOINT_NAMES.items():
        if prefix + stored in state_dict:
            state_dict[f"{prefix}salience.{name}"] = state_dict.pop(prefix + stored)
