"""Where an SRformer's weights come from: a checkpoint for the decoder and the salience head, the
pip-installed MiniLM for the word embeddings (and, to warm-start a decoder, for its layers).

    model = load_srformer("weights/srformer-news")                      # served as trained
    model = load_srformer(checkpoint, recurrent_part="off")              # scored with O_R zeroed
    load_decoder_weights(model, load_checkpoint("runs/full"))           # a full-attention decoder, trained on

A checkpoint's config is the :class:`~models.srformer.SRformerConfig` it was trained with, as a dict
(:func:`srformer_config`). Configs written before the copy aids were part of every model carry them as
switches, ``copy``, ``token_features`` and ``copy_bias`` (``RETIRED_SWITCHES``): every shipped checkpoint
has them on, which is now the model itself, so they are dropped on load; one that turned any of them off
is refused. The state dict's names are the model's (``SRformer.state_dict``), the salience head's under
the names checkpoints have always given them (``models/salience_head.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from models.checkpoint import Checkpoint, load_checkpoint
from models.minilm import minilm_config, minilm_state_dict
from models.srformer import SRformer, SRformerConfig

# config fields of earlier checkpoints that are now always so: the pointer over the attended segment mixed with
# the vocabulary, the previous token's embedding in the keys and the token's in the values, the copy bias
RETIRED_SWITCHES = {"copy": True, "token_features": True, "copy_bias": True}


def srformer_config(stored: Mapping[str, object], **overrides: object) -> SRformerConfig:
    """The config a checkpoint records (``Checkpoint.config``), changed by ``overrides``."""
    fields = dict(stored)
    for name, always in RETIRED_SWITCHES.items():
        value = fields.pop(name, always)
        if value != always:
            raise ValueError(f"the checkpoint was trained with {name}={value}: that variant is no longer built "
                             f"(every SRformer has {name}={always})")
    return SRformerConfig(**{**fields, **overrides})  # type: ignore[arg-type]


@torch.no_grad()
def warm_start_from_minilm(model: SRformer) -> None:
    """BERT2BERT-style start (Rothe et al., 2020): the decoder's embedding LayerNorm and positions, and
    each block's self-attention, MLP and their LayerNorms from MiniLM's layers 0..n_layer-1 (the
    self-attention made causal by the decoder's mask). Cross-attention, the copy gate and the output
    projection keep their random initialization; ``embed_in`` starts as the identity."""
    c, bert = model.config, minilm_config()
    shape = (c.norm_position, c.d_model, c.embed_dim, c.n_head, c.d_ff, c.layer_norm_eps)
    if shape != ("post", bert.hidden_size, bert.hidden_size, bert.num_attention_heads, bert.intermediate_size,
                 bert.layer_norm_eps) \
            or c.n_layer > bert.num_hidden_layers:
        raise ValueError(f"warm start needs MiniLM's shape (post-LN, d={bert.hidden_size}, "
                         f"{bert.num_attention_heads} heads, d_ff={bert.intermediate_size}, eps={bert.layer_norm_eps}, "
                         f"at most {bert.num_hidden_layers} layers), not {shape} with {c.n_layer} layers")
    mini = minilm_state_dict()
    assert model.ln_e is not None
    model.embed_in.weight.copy_(torch.eye(c.d_model))
    positions = min(c.max_target, mini["embeddings.position_embeddings.weight"].shape[0])
    model.wpe.weight[:positions] = (mini["embeddings.position_embeddings.weight"][:positions]
                                    + mini["embeddings.token_type_embeddings.weight"][0])
    model.ln_e.load_state_dict({"weight": mini["embeddings.LayerNorm.weight"],
                                "bias": mini["embeddings.LayerNorm.bias"]})
    for i, block in enumerate(model.blocks):
        layer = {name[len(f"layer.{i}."):]: t for name, t in mini.items() if name.startswith(f"layer.{i}.")}
        for part in ("weight", "bias"):
            block.attn.qkv.get_parameter(part).copy_(torch.cat([layer[f"attention.{n}.{part}"]
                                                                for n in ("query", "key", "value")]))
            block.attn.proj.get_parameter(part).copy_(layer[f"attention.dense.{part}"])
            block.ln_1.get_parameter(part).copy_(layer[f"attention.LayerNorm.{part}"])
            block.mlp[0].get_parameter(part).copy_(layer[f"intermediate.{part}"])
            block.mlp[2].get_parameter(part).copy_(layer[f"output.{part}"])
            block.ln_3.get_parameter(part).copy_(layer[f"LayerNorm.{part}"])


def load_srformer(folder: str | Checkpoint | None = None, config: SRformerConfig | None = None,
                  **overrides: object) -> SRformer:
    """A model with MiniLM's word embeddings; decoder weights from a checkpoint (its folder, or the checkpoint
    already loaded) if given, its config changed by ``overrides`` (e.g. ``recurrent_part="off"`` to score it
    with O_R zeroed)."""
    checkpoint = None
    if folder is not None:
        checkpoint = folder if isinstance(folder, Checkpoint) else load_checkpoint(folder)
        config = srformer_config(checkpoint.config, **overrides)
    model = SRformer(config or SRformerConfig())
    model.wte.copy_(minilm_state_dict()["embeddings.word_embeddings.weight"])
    if checkpoint is not None:
        load_decoder_weights(model, checkpoint)
    return model.eval()


def load_decoder_weights(model: SRformer, checkpoint: Checkpoint) -> None:
    """Load a checkpoint's decoder weights (as float32) into ``model``, possibly of another cross-attention mode.

    The projections are shared by every mode, so a full-attention decoder can be scored or trained
    further as a segmented or SRformer one. What only the SRformer has (the RAF, the gate) keeps its
    fresh initialisation when the checkpoint was trained in another mode, and so does a salience head the
    checkpoint has not fitted yet; any other mismatch is an error.
    """
    def srformer_only(name: str) -> bool:
        return ".raf." in name or name.endswith(".gate")

    state_dict = {name: tensor.float() for name, tensor in checkpoint.state_dict.items()}
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    trained_mode = checkpoint.config["cross_attention"]
    fitted_salience = checkpoint.config.get("salience", False)  # a head fitted later starts fresh
    fresh = [name for name in missing if (trained_mode == "srformer" or not srformer_only(name))
             and (fitted_salience or not name.startswith("salience"))]
    if fresh or unexpected:
        raise ValueError(f"{checkpoint.folder} does not fit this model: missing {fresh}, unexpected {list(unexpected)}")
