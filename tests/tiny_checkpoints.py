"""Tiny random checkpoints of each family, written the way training writes them.

They keep the test suite fast; trained weights come from the training recipes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from models.checkpoint import save_checkpoint

VARIABLES = ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]


def tiny_forecaster(folder: Path, family: str = "rsa", lookback: int = 32, horizon: int = 8, seed: int = 0) -> Path:
    from models.families import family as family_record

    torch.manual_seed(seed)
    record = family_record(family)
    config_class = record.part("config")
    sizes = {"lookback": lookback, "horizon": horizon}
    if family != "linear":
        sizes.update(patch_len=8, stride=8, d_model=16, n_layers=1, n_heads=4, d_ff=32)
    names = {f for f in config_class.__dataclass_fields__}
    config = config_class(**{k: v for k, v in sizes.items() if k in names})
    model = record.build_model(config)
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
                  max_source: int = 200, norm_position: str = "pre", salience: bool = True,
                  salience_lexical: bool | None = None, **options: object) -> Path:
    """A small random SRformer decoder over the pip-installed MiniLM encoder.

    Short encoder windows so a paragraph spans several windows; the decoder's word embeddings are
    MiniLM's, as in training, and are not stored. With a (random) salience head: its default decoding is
    sentence copy; the head has its (random) lexicon unless ``salience_lexical`` is False.
    """
    from models.srformer import SRformer, SRformerConfig

    torch.manual_seed(seed)
    config = SRformerConfig(cross_attention=mode, segment_size=8, d_model=32, n_layer=2, n_head=2, d_ff=64,
                            max_target=128, encoder_window=encoder_window, max_source=max_source, dropout=0.0,
                            norm_position=norm_position, salience=salience,
                            salience_lexical=salience if salience_lexical is None else salience_lexical,
                            **options)  # type: ignore[arg-type]
    model = SRformer(config)
    head = model.salience
    if head is not None:
        torch.nn.init.normal_(head.position)
    if head is not None and head.lexical is not None:
        torch.nn.init.normal_(head.lexical)
        torch.nn.init.normal_(head.word, std=0.5)
        torch.nn.init.uniform_(head.idf, 1.0, 5.0)
    extras = {"task": "summarize", "beams": 1, "no_repeat_ngram": 3}
    return save_checkpoint(folder, "srformer", config, model.state_dict(), extras)


TINY_MODELS = {  # name -> how to build its checkpoint in a folder of that name
    "rsa-tiny": lambda folder: tiny_forecaster(folder, "rsa", lookback=32, horizon=8),
    "rmt-tiny": lambda folder: tiny_rmt(folder),
    "srformer-tiny": lambda folder: tiny_srformer(folder),
}
LIGHT_TINY_MODELS = {"rsa-tiny"}  # exported with one intra-op thread, not timed


class TinyModels:
    """The tiny checkpoints of ``TINY_MODELS`` and their exports, each built on first use, once per run.

    ``checkpoint(name)`` is a checkpoint folder; ``repository(*names, formats=...)`` a model repository
    holding exactly those models (entries hard-linked from one export per model and formats). Every test
    that asks gets the same folders: tests read them and never write into them; a test that must change
    one copies it first (``shutil.copytree``). ``changed()`` lists any file written since it was built.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._checkpoints: dict[str, Path] = {}
        self._entries: dict[tuple[str, tuple[str, ...]], Path] = {}
        self._repositories: dict[tuple[tuple[str, ...], tuple[str, ...]], Path] = {}
        self._built: dict[Path, tuple[int, int]] = {}  # file -> (size, mtime_ns) when built

    def checkpoint(self, name: str) -> Path:
        if name not in self._checkpoints:
            self._checkpoints[name] = self._seal(TINY_MODELS[name](self.root / "weights" / name))
        return self._checkpoints[name]

    def entry(self, name: str, formats: tuple[str, ...] = ("onnx",)) -> Path:
        """``<name>/1`` exported in ``formats`` (``()``: no graphs, for the eager backends)."""
        key = (name, tuple(formats))
        if key not in self._entries:
            from export.exporter import export_checkpoint

            out = self.root / "exports" / ("-".join(formats) or "eager")
            # the tiny forecaster's step is light (one thread, as an idle machine's timing decides), fixed here: a
            # busy test machine can time the pool faster, and the tests of the light-graph path need it; the other
            # tiny models' graphs run MiniLM or decode (the pool). Nothing is timed, so no export caps a CPU batch
            # by a busy machine's timings (export/exporter.py cpu_batch_cap, tested on its own)
            threads = 1 if name in LIGHT_TINY_MODELS else 0
            entry = export_checkpoint(self.checkpoint(name), out, formats=tuple(formats), cpu_threads=threads)
            self._entries[key] = self._seal(entry)
        return self._entries[key]

    def repository(self, *names: str, formats: tuple[str, ...] = ("onnx",)) -> Path:
        key = (tuple(sorted(names)), tuple(formats))
        if key not in self._repositories:
            folder = self.root / "repositories" / ("+".join(key[0]) + "." + ("-".join(formats) or "eager"))
            for name in key[0]:
                entry = self.entry(name, formats)
                shutil.copytree(entry, folder / name / entry.name, copy_function=os.link)
            self._repositories[key] = self._seal(folder)
        return self._repositories[key]

    def _seal(self, folder: Path) -> Path:
        for path in folder.rglob("*"):
            if path.is_file():
                stat = path.stat()
                self._built[path] = (stat.st_size, stat.st_mtime_ns)
        return folder

    def changed(self) -> list[str]:
        """Files written, added or removed since they were built (a shared folder a test wrote into)."""
        now = {path: (path.stat().st_size, path.stat().st_mtime_ns) for path in self.root.rglob("*") if path.is_file()}
        return sorted(str(path) for path in set(now) | set(self._built) if now.get(path) != self._built.get(path))
