"""Tiny random checkpoints of each family, written the way training writes them.

They keep the test suite fast; trained weights come from the training recipes.
"""

from __future__ import annotations

from pathlib import Path

import torch

from models.checkpoint import save_checkpoint

VARIABLES = ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]


def tiny_forecaster(folder: Path, family: str = "rsa", lookback: int = 32, horizon: int = 8, seed: int = 0) -> Path:
    from models.training.forecasters import FAMILIES

    torch.manual_seed(seed)
    config_class, model_class = FAMILIES[family]
    sizes = {"lookback": lookback, "horizon": horizon}
    if family != "linear":
        sizes.update(patch_len=8, stride=8, d_model=16, n_layers=1, n_heads=4, d_ff=32)
    names = {f for f in config_class.__dataclass_fields__}
    config = config_class(**{k: v for k, v in sizes.items() if k in names})
    model = model_class(config)
    generator = torch.Generator().manual_seed(seed)
    mean = (torch.randn(len(VARIABLES), generator=generator) * 5).tolist()
    std = (torch.rand(len(VARIABLES), generator=generator) * 3 + 0.5).tolist()
    extras = {
        "task": "forecast",
        "scaler": {"mean": mean, "std": std},
        "variables": VARIABLES,
        "lookback": lookback,
        "horizon": horizon,
    }
    return save_checkpoint(folder, family, config, model.state_dict(), extras)


def tiny_rmt(folder: Path, segment_size: int = 32, max_segments: int = 6, seed: int = 0) -> Path:
    """An RMT over the pip-installed MiniLM with small segments and a random memory and head.

    Only layers >= memory_layer, the memory and the head are stored (as training stores them).
    """
    from models.rmt import RMTConfig, rmt_from_minilm, trained_state_dict

    config = RMTConfig(memory_size=4, segment_size=segment_size, max_segments=max_segments, memory_layer=5)
    model = rmt_from_minilm(config, seed=seed)
    with torch.no_grad():  # a head that separates documents, so probabilities differ from 0.5
        model.head.out.weight.mul_(20)
    extras = {"task": "classify", "label_names": ["mainstream", "hyperpartisan"]}
    return save_checkpoint(folder, "rmt", config, trained_state_dict(model, torch.float32), extras)


def tiny_srformer(folder: Path, mode: str = "srformer", encoder_window: int = 24, seed: int = 0,
                  max_source: int = 200, norm_position: str = "pre") -> Path:
    """A small random SRformer decoder over the pip-installed MiniLM encoder.

    Short encoder windows so a paragraph spans several windows; the decoder's word embeddings are
    MiniLM's, as in training, and are not stored.
    """
    from models.srformer import SRformer, SRformerConfig

    torch.manual_seed(seed)
    config = SRformerConfig(cross_attention=mode, segment_size=8, d_model=32, n_layer=2, n_head=2, d_ff=64,
                            max_target=128, encoder_window=encoder_window, max_source=max_source, dropout=0.0,
                            norm_position=norm_position)
    model = SRformer(config)
    extras = {"task": "summarize", "beams": 1, "no_repeat_ngram": 3}
    return save_checkpoint(folder, "srformer", config, model.state_dict(), extras)
