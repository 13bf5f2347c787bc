"""One record per model family, and the one registry that holds them.

A family is everything rtserve knows about one kind of model: the task it serves, how a checkpoint is
trained and scored (its recipe), how a user's data files are read (its reader), how export cuts a
checkpoint into step graphs (its adapter), how the service runs those graphs (its pipeline), what a
finished session answers, and how an exported entry is scored. The command, export and the service all
look here, as LitServe's server looks at one ``LitAPI``. This module is the bottom of the import graph: it
imports nothing of rtserve, and every layer (models, export, the service, the command) may import it.

The parts are named by import path (``"package.module:attribute"``) and imported on first use, so reading
the registry imports nothing heavy: the service on the ONNX path imports a pipeline and never torch,
export imports an adapter and never a training recipe (docs/architecture.md, "Layers").

The built-in families are at the end of this module. A family written outside the repository
joins through the ``rtserve.families`` entry-point group of its own package; the entry point's name is
the family's name::

    [project.entry-points."rtserve.families"]
    gru-classifier = "rtserve_gru_classifier.family:FAMILY"
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import re
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "rtserve.families"
TASKS = ("classify", "summarize", "forecast")  # the HTTP API's tasks: /classify, /summarize, /forecast
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_PATH = re.compile(r"[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?")


class UnknownFamily(LookupError):
    """No family of that name is built in or installed."""


def load_part(path: str) -> Any:
    """The object an import path names: ``"package.module:attribute"``, or a whole module (``"package.module"``)."""
    module_name, _, attribute = path.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module


@dataclass(frozen=True)
class Family:
    """One model family. Every part but ``name`` and ``task`` is an import path, imported when first used."""

    name: str  # as checkpoints and manifests name it: "rmt"
    task: str  # one of TASKS: the routes and answers it serves
    adapter: str  # "module:function": Checkpoint -> Servable, the step graphs export writes (torch)
    pipeline: str  # "module:Class": the service's runner of the exported graphs (numpy, never torch)
    finish: str  # "module:Class": the pydantic answer of POST /sessions/{id}/finish
    recipe: str | None = None  # "module" with train_main(argv) and eval_main(argv) -> exit status
    evaluate: str | None = None  # "module:function": async (LoadedModel, args) -> scores of an exported entry
    config: str | None = None  # "module:Class": the model's config dataclass (with ``model``: build_model)
    model: str | None = None  # "module:Class": the nn.Module built from that config
    # "module:function": reads a user's data file for the task (models.data.files: classify
    # (path, text_field, label_field) -> [LabelledText]; summarize (path, source_field, summary_field) ->
    # [TextPair]; forecast (path, columns, targets) -> SeriesTable), raising DataFileError on a bad line
    reader: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"family name {self.name!r}: use lower-case letters, digits, '-', '_' and '.'")
        if self.task not in TASKS:
            raise ValueError(f"family {self.name!r}: task {self.task!r} is not one of {TASKS}")
        for part in dataclasses.fields(self)[2:]:
            path = getattr(self, part.name)
            if path is not None and not _PATH.fullmatch(path):
                raise ValueError(f"family {self.name!r}: {part.name} {path!r} is not an import path "
                                 "('package.module:attribute')")

    def part(self, name: str) -> Any:
        """The named part (``"adapter"``, ``"pipeline"`` ...), imported; a clear error where the family has none."""
        path = getattr(self, name)
        if path is None:
            raise LookupError(f"family {self.name!r} has no {name}")
        return load_part(path)

    def build_model(self, config: Any) -> Any:
        """The family's model from its config dataclass, or that dataclass as a dict (unknown keys ignored)."""
        config_class, model_class = self.part("config"), self.part("model")
        if not dataclasses.is_dataclass(config):
            names = {field.name for field in dataclasses.fields(config_class)}
            config = config_class(**{key: value for key, value in config.items() if key in names})
        return model_class(config)


# ---- the built-in families -------------------------------------------------------------------------
# RMT (classify), SRformer (summarize), and the forecasters RSA, R-Transformer, the vanilla Transformer and the
# ridge baseline (forecast). What serves a task (its pipeline, the finish answer, the scorer of an exported entry,
# the reader of a user's data files) is shared by the families of that task; CLASSIFY, SUMMARIZE and FORECAST name
# those parts, for the records below and for families written elsewhere that reuse them.
CLASSIFY = {
    "task": "classify",
    "reader": "models.data.files:read_labelled_texts",
    "pipeline": "service.runtime.classify:ClassifyPipeline",
    "finish": "service.schemas:ClassifyFinish",
    "evaluate": "rtserve.evaluate:score_classifier",
}
SUMMARIZE = {
    "task": "summarize",
    "reader": "models.data.files:read_text_pairs",
    "pipeline": "service.runtime.summarize:SummarizePipeline",
    "finish": "service.schemas:SummarizeFinish",
    "evaluate": "rtserve.evaluate:score_summarizer",
}
FORECAST = {
    "task": "forecast",
    "reader": "models.data.files:read_series",
    "pipeline": "service.runtime.forecast:ForecastPipeline",
    "finish": "service.schemas:ForecastFinish",
    "evaluate": "rtserve.evaluate:score_forecaster",
}
_FORECASTER = {**FORECAST, "adapter": "models.serving.forecasters:forecast_servable",
               "recipe": "models.training.forecasters"}

BUILT_IN = (
    Family("rsa", config="models.rsa:RSAConfig", model="models.rsa:RSAForecaster", **_FORECASTER),
    Family("rtransformer", config="models.rtransformer:RTransformerConfig",
           model="models.rtransformer:RTransformerForecaster", **_FORECASTER),
    Family("vanilla", config="models.vanilla:VanillaConfig", model="models.vanilla:VanillaForecaster", **_FORECASTER),
    Family("linear", config="models.linear:LinearConfig", model="models.linear:LinearForecaster", **_FORECASTER),
    Family("rmt", adapter="models.serving.rmt:rmt_servable", recipe="models.training.rmt", **CLASSIFY),
    Family("srformer", adapter="models.serving.srformer:srformer_servable", recipe="models.training.srformer",
           **SUMMARIZE),
)


@functools.cache
def _registry() -> tuple[dict[str, Family], dict[str, str]]:
    """``({name: record}, {name: why it could not be loaded})``: the built-in records, then the installed ones."""
    records = {record.name: record for record in BUILT_IN}
    broken: dict[str, str] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        where = f"entry point {point.name} = {point.value} ({ENTRY_POINT_GROUP})"
        if point.name in records:
            broken[point.name] = f"{where}: a family {point.name!r} is already registered"
            continue
        try:
            record = point.load()
        except Exception as error:  # one broken package must not hide the other families
            broken[point.name] = f"{where} cannot be loaded: {type(error).__name__}: {error}"
            continue
        if not isinstance(record, Family):
            broken[point.name] = f"{where} is a {type(record).__name__}, not a models.families.Family"
        elif record.name != point.name:
            broken[point.name] = f"{where} names family {record.name!r}: name the entry point after its family"
        else:
            records[record.name] = record
    for why in broken.values():
        log.warning("family not registered: %s", why)
    return records, broken


def family(name: str) -> Family:
    """The record of family ``name``; :class:`UnknownFamily` says what is installed when there is none."""
    records, broken = _registry()
    if name in records:
        return records[name]
    if name in broken:
        raise UnknownFamily(broken[name])
    raise UnknownFamily(
        f"no model family {name!r}: the families are {sorted(records)}. A family from another package joins "
        f"when that package is installed (entry-point group {ENTRY_POINT_GROUP!r})"
    )


def families(task: str | None = None) -> list[Family]:
    """Every registered family (of ``task``), built-in first."""
    return [record for record in _registry()[0].values() if task is None or record.task == task]


def refresh() -> None:
    """Read the installed entry points again (after a package was installed into the running interpreter)."""
    _registry.cache_clear()
