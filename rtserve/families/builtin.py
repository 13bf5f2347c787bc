"""The families that ship with rtserve: RMT (classify), SRformer (summarize), and the forecasters RSA,
R-Transformer, the vanilla Transformer and the ridge baseline (forecast).

What serves a task (its pipeline, the finish answer, the scorer of an exported entry, the reader of a
user's data files) is shared by the families of that task; ``CLASSIFY``, ``SUMMARIZE`` and ``FORECAST``
name those parts, for the records below and for families written elsewhere that reuse them.
"""

from __future__ import annotations

from rtserve.families import Family

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
    Family("linear", config="models.forecast_stream:LinearConfig", model="models.forecast_stream:LinearForecaster",
           **_FORECASTER),
    Family("rmt", adapter="models.serving.rmt:rmt_servable", recipe="models.training.rmt", **CLASSIFY),
    Family("srformer", adapter="models.serving.srformer:srformer_servable", recipe="models.training.srformer",
           **SUMMARIZE),
)
