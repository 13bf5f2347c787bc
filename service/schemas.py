"""Request and response bodies: every field described, with an example, so /docs is the manual."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Task = Literal["classify", "summarize", "forecast"]

MODEL_FIELD = Field(
    None,
    description="Model name, or `name:version`. Default: the configured default for the task.",
    examples=["rmt-hyperpartisan"],
)

EXAMPLE_ROWS = [[5.827, 2.009, 1.599, 0.462, 4.203, 1.340, 30.531], [5.693, 2.076, 1.492, 0.426, 4.142, 1.371, 27.787]]


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="The document to classify, any length.", examples=["The senator said ..."])
    model: str | None = MODEL_FIELD


class ClassifyResponse(BaseModel):
    model: str = Field(description="`name:version` that answered.", examples=["rmt-hyperpartisan:1"])
    label: str | None = Field(description="Most probable label (null before any text).", examples=["hyperpartisan"])
    probabilities: dict[str, float] = Field(
        description="Label -> probability.", examples=[{"hyperpartisan": 0.91, "mainstream": 0.09}]
    )
    segments: int = Field(description="Segments the model read.", examples=[3])
    tokens: int = Field(description="Tokens read so far.", examples=[1200])


class SummarizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="The document to summarize.", examples=["Shares in ... rose 5% on Monday ..."])
    model: str | None = Field(None, description="Model name or `name:version`.", examples=["srformer-news"])
    stream: bool = Field(False, description="Send the summary as Server-Sent Events, token by token.")
    max_length: int | None = Field(None, ge=1, le=1024, description="Most summary tokens; default: the model's.")
    beam_size: int | None = Field(None, ge=1, le=8, description="Beam width; 1 is greedy. Default: the model's.")


class SummarizeResponse(BaseModel):
    model: str = Field(description="`name:version` that answered.", examples=["srformer-news:1"])
    summary: str = Field(description="The summary.", examples=["Shares in ... rose 5%."])
    tokens: int = Field(description="Document tokens read.", examples=[512])
    summary_tokens: int = Field(description="Tokens generated.", examples=[64])


class ForecastRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rows: list[list[float]] = Field(
        description="Observations, oldest first, one row per time step, one value per variable in the model's "
        "order (see GET /models). At least the model's look-back of rows.",
        examples=[EXAMPLE_ROWS],
    )
    model: str | None = Field(None, description="Model name or `name:version`.", examples=["rsa-etth1-h24"])


class ForecastResponse(BaseModel):
    model: str = Field(description="`name:version` that answered.", examples=["rsa-etth1-h24:1"])
    forecast: list[list[float]] | None = Field(
        description="The next `horizon` rows x variables (null until `rows_needed` is 0).", examples=[EXAMPLE_ROWS]
    )
    horizon: int = Field(description="Rows forecast.", examples=[24])
    variables: list[str] = Field(description="Column order.", examples=[["HUFL", "HULL", "MUFL", "MULL", "LUFL",
                                                                         "LULL", "OT"]])
    rows_seen: int = Field(description="Rows read so far.", examples=[96])
    rows_needed: int = Field(description="Rows still missing before a forecast is possible.", examples=[0])


class SessionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: Task | None = Field(None, description="Task; its default model is used unless `model` is given.",
                              examples=["classify"])
    model: str | None = MODEL_FIELD


class SessionInfo(BaseModel):
    id: str = Field(description="Session id (random, 192 bits).", examples=["0nJx3...Q"])
    model: str = Field(description="`name:version` bound to the session.", examples=["rmt-hyperpartisan:1"])
    task: Task = Field(description="The model's task.", examples=["classify"])
    seq: int = Field(description="Pieces applied so far; send `seq + 1` next.", examples=[0])
    consumed: int = Field(description="Tokens (text) or rows (series) consumed.", examples=[0])
    segments: int = Field(description="Model steps applied.", examples=[0])
    state_bytes: int = Field(description="Bytes of state stored in Redis.", examples=[6144])
    status: Literal["open", "finished"] = Field(description="`finished` after /finish.", examples=["open"])
    created_at: float = Field(description="Unix time of creation.", examples=[1795000000.0])
    expires_at: float = Field(description="Unix time it expires if idle.", examples=[1795001800.0])


class SegmentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seq: int = Field(ge=1, description="1 for the first piece, +1 per piece. A retry repeats the number.",
                     examples=[1])
    text: str | None = Field(None, description="Next piece of text (classify, summarize); may split words.",
                             examples=["The senator said "])
    rows: list[list[float]] | None = Field(None, description="Next rows (forecast).", examples=[EXAMPLE_ROWS])


class SegmentResponse(BaseModel):
    session: SessionInfo
    replayed: bool = Field(description="True when this `seq` was already applied and the stored result is "
                                       "returned.", examples=[False])
    result: dict[str, Any] = Field(
        description="The running result: class probabilities (classify), forecast (forecast), what has been "
        "consumed (summarize).",
        examples=[{"label": "mainstream", "probabilities": {"hyperpartisan": 0.2, "mainstream": 0.8}}],
    )


class FinishRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stream: bool = Field(False, description="Summaries: send tokens as Server-Sent Events.")
    max_length: int | None = Field(None, ge=1, le=1024, description="Summaries: most tokens; default: the model's.")
    beam_size: int | None = Field(None, ge=1, le=8, description="Summaries: beam width; default: the model's.")


class FinishResponse(BaseModel):
    session: SessionInfo
    result: dict[str, Any] = Field(description="The final result, shaped like the one-shot endpoint's answer.",
                                   examples=[{"summary": "Shares rose."}])


class ErrorBody(BaseModel):
    detail: str = Field(description="What went wrong and what to change.", examples=["piece 3 is out of order"])
    expected_seq: int | None = Field(None, description="For 409 on sessions: the seq to send next.", examples=[2])


class ModelInfo(BaseModel):
    name: str = Field(examples=["rsa-etth1-h24"])
    version: str = Field(examples=["1"])
    task: Task = Field(examples=["forecast"])
    family: str = Field(examples=["rsa"])
    backend: str = Field(description="onnx, torchscript or torch.", examples=["onnx"])
    device: str = Field(description="Where the model runs: cpu or cuda:N.", examples=["cpu"])
    precision: str = Field(description="fp32, fp16 or bf16.", examples=["fp32"])
    providers: list[str] = Field(
        description="Execution providers the model's sessions actually use (ONNX Runtime's, in order of "
        "preference; CPU or CUDA for torch backends).",
        examples=[["CPUExecutionProvider"]],
    )
    max_batch_size: int = Field(description="Largest batch the batcher forms for this model.", examples=[32])
    manifest: dict[str, Any] = Field(description="The entry's manifest.json.")
