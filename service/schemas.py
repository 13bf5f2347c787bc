"""Request and response bodies: every field described, with an example, so /docs is the manual."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Strict,
    StrictBool,
    Tag,
    WithJsonSchema,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

Task = Literal["classify", "summarize", "forecast"]

MODEL_FIELD = Field(
    None,
    description="Model name (its latest version), or `name:version`. Default: the task's default model "
    "(`RTSERVE_DEFAULT_MODELS`, else the first model of the task; `GET /models` marks it).",
    examples=["rmt-hyperpartisan"],
)

EXAMPLE_ROWS = [[5.827, 2.009, 1.599, 0.462, 4.203, 1.340, 30.531], [5.693, 2.076, 1.492, 0.426, 4.142, 1.371, 27.787]]
VARIABLES = ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]

# JSON numbers only (a string "1.5" or a boolean is refused, never silently converted), finite (NaN refused), within
# float32's range: the models compute in float32, where a larger value is infinite. Each forecaster takes a narrower
# range still (GET /models: value_range), checked against the model.
FLOAT32_MAX = 3.4028234663852886e38


def _within_float32(value: float) -> float:
    if not -FLOAT32_MAX <= value <= FLOAT32_MAX:
        raise PydanticCustomError(
            "float32_range", "Input should be within float32's range, -3.4028235e+38 to 3.4028235e+38 (each "
                             "forecaster takes a narrower one: GET /models, value_range)")
    return value


Number = Annotated[float, Strict(), Field(allow_inf_nan=False), AfterValidator(_within_float32),
                   WithJsonSchema({"type": "number", "minimum": -FLOAT32_MAX, "maximum": FLOAT32_MAX})]


# A document must hold a character that is neither whitespace nor a control character (422 otherwise). One pattern
# for the check (Python's re) and the schema (ECMA-262): both read it alike, as the whitespace they differ on is
# listed (ECMA's \s has U+FEFF, Python's the separators U+001C-U+001F and U+0085, which the controls cover).
VISIBLE_CHARACTER = r"[^\s\u0000-\u001f\u007f-\u009f\ufeff]"


def _json_integer(value: Any) -> Any:
    """JSON Schema's integer: 8 and 8.0, never "8" or true (pydantic's lax int takes both, its strict int neither)."""
    if isinstance(value, (str, bool, bytes)):
        raise ValueError("Input should be a JSON integer, not a string or a boolean")
    return value


def _integer(minimum: int, maximum: int | None = None) -> Any:
    # the schema written out: after a BeforeValidator pydantic would emit its own `ge`/`le` keys, not JSON Schema's
    schema: dict[str, Any] = {"type": "integer", "minimum": minimum}
    if maximum is not None:
        schema["maximum"] = maximum
    return Annotated[int, BeforeValidator(_json_integer), Field(ge=minimum, le=maximum), WithJsonSchema(schema)]


Seq = _integer(1)
MaxLength = _integer(1, 1024)
BeamSize = _integer(1, 8)
Rows = list[list[Number]]

STREAM_DESCRIPTION = (
    "Answer as Server-Sent Events (also when the request says `Accept: text/event-stream`): `token` events "
    "carrying the summary text as it is generated, whole words at a time, then one `done` event with the "
    "same object the JSON answer would hold. Greedy search (`beam_size` 1) streams while it decodes; beam "
    "search only knows its best summary at the end, so it sends one `token` event with the whole summary, "
    "then `done`."
)
MAX_LENGTH_DESCRIPTION = (
    "Most summary tokens (WordPiece tokens) to generate. Default: the model's own length rule (a share "
    "of the document's length, see `GET /models`). The summary ends at a word boundary at or below it; sentence "
    "copy writes whole sentences only, so a `max_length` below every sentence's length gives an empty summary."
)
BEAM_SIZE_DESCRIPTION = ("Beam width of free decoding: 1 is greedy search (streams word by word), 2-8 beam search; "
                         "2-8 without `decoding` means `decoding` free. Sentence copy runs no search and does not "
                         "read it. Default: the model's.")
DECODING_DESCRIPTION = (
    "How the summary is written. `sentence`: whole sentences of the document, as the document writes them "
    "(its case, spacing and words), chosen by the model's salience scores up to the model's summary length "
    "and kept in the document's order; it never splices sentences, and streams a sentence at a time. `free`: "
    "the decoder generates the text token by token (no repeated trigrams, ending at a sentence end past the "
    "model's length), with the document's letter case restored. The shipped summarizers' free text reads as word "
    "salad: blind readers scored its fluency 1.6 of 5 on news and 1.0 on papers, against about 4.9 for `sentence` "
    "(docs/summarization.md); use `free` to study the decoder, not to show summaries to readers. Default: the "
    "model's (`GET /models`: `settings.decoding`); `sentence` needs a model with a salience head."
)
Decoding = Literal["sentence", "free"]


class FieldError(BaseModel):
    """One field a request got wrong (validation errors only)."""

    loc: list[str | int] = Field(description="Where: `body`, then the field path.", examples=[["body", "rows", 0, 1]])
    msg: str = Field(description="What is wrong with it.", examples=["Input should be a valid number"])
    type: str = Field(description="pydantic's error type.", examples=["float_type"])


class ErrorBody(BaseModel):
    """Every error the service answers (4xx and 5xx) has this shape."""

    detail: str = Field(description="What went wrong and what to change.", examples=["piece 3 is out of order"])
    errors: list[FieldError] | None = Field(
        None, description="For 422 validation errors: every field that failed, with where and why.",
        examples=[[{"loc": ["body", "text"], "msg": "Field required", "type": "missing"}]],
    )
    expected_seq: int | None = Field(None, description="For 409 on sessions: the seq to send next.", examples=[2])
    request_id: str | None = Field(
        None, description="The request's id (the `X-Request-ID` header, sent or generated); quote it when "
        "reporting a problem: every log line of the request carries it.", examples=["5f0c9a1e2b7d4c61"],
    )


# ---- one-shot answers ----------------------------------------------------------------------------------


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(
        description="The document to classify, any length up to `RTSERVE_MAX_TEXT_CHARS` characters (longer: use "
        "a session). Text without a visible character (empty, or only whitespace or control characters) is refused "
        "(422); text whose characters the model reads no token of (e.g. lone combining marks) gives `label` null. A "
        "classifier answers for the kind of document it was trained on: the shipped `rmt-hyperpartisan` reads whole "
        "news articles (is this article hyperpartisan?), and on a short text its label is arbitrary.",
        json_schema_extra={"minLength": 1, "pattern": VISIBLE_CHARACTER},
        examples=["The senator said on Monday that the bill would pass ..."],
    )
    model: str | None = MODEL_FIELD


class Reading(BaseModel):
    """How much of the document the model read: nothing past its limit is ever silent."""

    tokens_read: int = Field(description="Document tokens the model read (or will read at finish).",
                             examples=[1008])
    tokens_total: int = Field(description="Document tokens received so far, read or not.", examples=[1500])
    truncated: bool = Field(description="True when tokens past the model's limit (`GET /models`: `max_tokens`) "
                            "were left unread (`RTSERVE_OVER_LIMIT=truncate`; with `refuse` such a document "
                            "is a 422).", examples=[False])


class ClassifyResult(Reading):
    label: str | None = Field(description="Most probable label; null before the first complete segment (or for "
                              "a document without tokens).", examples=["hyperpartisan"])
    probabilities: dict[str, float] = Field(
        description="Label -> probability (empty while `label` is null).",
        examples=[{"hyperpartisan": 0.91, "mainstream": 0.09}],
    )
    segments: int = Field(description="Segments the model read.", examples=[3])


class ClassifyResponse(ClassifyResult):
    model: str = Field(description="`name:version` that answered.", examples=["rmt-hyperpartisan:1"])


class SummarizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(
        description="The document to summarize (the model reads its first `max_tokens` tokens, see `GET /models`). "
        "Text without a visible character (empty, or only whitespace or control characters) is refused (422); text "
        "whose characters the model reads no token of (e.g. lone combining marks) gives an empty summary.",
        json_schema_extra={"minLength": 1, "pattern": VISIBLE_CHARACTER},
        examples=["Shares in the bank rose 5% on Monday after it reported a rise in profits ..."],
    )
    model: str | None = Field(None, description="Model name or `name:version`; default: the task's default.",
                              examples=["srformer-news"])
    stream: StrictBool = Field(False, description=STREAM_DESCRIPTION, examples=[False])
    max_length: MaxLength | None = Field(None, description=MAX_LENGTH_DESCRIPTION, examples=[60])
    beam_size: BeamSize | None = Field(None, description=BEAM_SIZE_DESCRIPTION, examples=[1])
    decoding: Decoding | None = Field(None, description=DECODING_DESCRIPTION, examples=["sentence"])

    def options(self) -> dict[str, object]:
        return {"max_length": self.max_length, "beam_size": self.beam_size, "decoding": self.decoding}


class SummaryResult(Reading):
    summary: str = Field(description="The summary, in the document's letter case.",
                         examples=["Shares in the bank rose 5% on Monday."])
    summary_tokens: int = Field(description="Tokens in the summary (WordPiece).", examples=[64])
    decoding: Decoding = Field(description="How it was written (see the request's `decoding`).",
                               examples=["sentence"])


class SummarizeResponse(SummaryResult):
    model: str = Field(description="`name:version` that answered.", examples=["srformer-news:1"])


class ForecastRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rows: Rows = Field(
        min_length=1,
        description="Observations, oldest first, one row per time step, one JSON number per variable in the "
        "model's order (see `GET /models`). Fewer rows than the model's look-back: `forecast` is null and "
        "`rows_needed` says how many more.",
        examples=[EXAMPLE_ROWS],
    )
    model: str | None = Field(None, description="Model name or `name:version`; default: the task's default.",
                              examples=["rsa-etth1-h24"])


def _rows_of(value: Any) -> Any:
    """A forecast's rows as lists (a pipeline hands them over as a float64 array)."""
    return value.tolist() if isinstance(value, np.ndarray) else value


class ForecastResult(BaseModel):
    forecast: Annotated[list[list[float]] | None, BeforeValidator(_rows_of)] = Field(
        description="The next `horizon` rows x variables (null until `rows_needed` is 0).", examples=[EXAMPLE_ROWS]
    )
    horizon: int = Field(description="Rows forecast.", examples=[24])
    variables: list[str] = Field(description="The forecast's columns, in order: the model's targets (a row sent "
                                 "holds the columns of `GET /models`: `manifest.settings.variables`).",
                                 examples=[VARIABLES])
    rows_seen: int = Field(description="Rows read so far.", examples=[96])
    rows_needed: int = Field(description="Rows still missing before a forecast is possible.", examples=[0])


class ForecastResponse(ForecastResult):
    model: str = Field(description="`name:version` that answered.", examples=["rsa-etth1-h24:1"])


# ---- sessions ------------------------------------------------------------------------------------------


class SessionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": [
        {"required": ["task"], "properties": {"task": {"type": "string"}}},
        {"required": ["model"], "properties": {"model": {"type": "string"}}},
    ]})
    task: Task | None = Field(None, description="Task; its default model is used unless `model` is given. Name a "
                              "`task`, a `model`, or both.", examples=["classify"])
    model: str | None = MODEL_FIELD


class SessionInfo(BaseModel):
    id: str = Field(description="Session id (random, 192 bits): the `{session_id}` of the other session routes.",
                    examples=["0nJx3kq7VdW2c9aYbR5mTfLs8HhPzE1u"])
    model: str = Field(description="`name:version` bound to the session.", examples=["rmt-hyperpartisan:1"])
    task: Task = Field(description="The model's task.", examples=["classify"])
    seq: int = Field(description="Pieces applied so far; send `seq + 1` next.", examples=[0])
    consumed: int = Field(description="Tokens (text) or rows (series) consumed.", examples=[0])
    segments: int = Field(description="Model steps applied.", examples=[0])
    state_bytes: int = Field(description="Bytes of state stored in Redis.", examples=[6144])
    status: Literal["open", "finished"] = Field(description="`finished` after /finish.", examples=["open"])
    created_at: float = Field(description="Unix time of creation.", examples=[1795000000.0])
    expires_at: float = Field(
        description="Unix time (whole seconds) it expires if idle; every request on the session moves it to "
        "`RTSERVE_SESSION_TTL_SECONDS` from then, never past the session's maximum lifetime.",
        examples=[1795001800.0],
    )


class TextPiece(BaseModel):
    model_config = ConfigDict(extra="forbid", title="TextPiece")
    seq: Seq = Field(description="1 for the first piece, +1 per piece. A retry repeats the number "
                           "(and the content): it is answered from the stored result, never applied twice.",
                           examples=[1])
    text: str = Field(description="Next piece of text (classify and summarize sessions); pieces may split words, "
                      "and a piece may be empty or only whitespace (finishing a session whose text has no token "
                      "is refused: 409).", examples=["The senator said on Mon"])


class RowsPiece(BaseModel):
    model_config = ConfigDict(extra="forbid", title="RowsPiece")
    seq: Seq = Field(description="1 for the first piece, +1 per piece. A retry repeats the number "
                           "(and the content): it is answered from the stored result, never applied twice.",
                           examples=[1])
    rows: Rows = Field(min_length=1, description="Next rows (forecast sessions), one JSON number per variable.",
                       examples=[EXAMPLE_ROWS])


class _TextAndRows(BaseModel):
    """A piece holding both `text` and `rows`: refused with the one message that says which to drop (never in the
    schema: no such piece exists)."""

    @model_validator(mode="before")
    @classmethod
    def refuse(cls, body: Any) -> Any:
        raise PydanticCustomError(
            "text_and_rows", "send `text` (classify and summarize sessions) or `rows` (forecast sessions), not both: "
            "drop the one this session does not read")


def _piece_kind(body: Any) -> str | None:
    """Which piece a body is, by its fields: its errors are then about that piece only."""
    if isinstance(body, dict):
        if "rows" in body and "text" in body:
            return "TextAndRows"
        return "RowsPiece" if "rows" in body else "TextPiece" if "text" in body else None
    return type(body).__name__


PIECE_KINDS = ("TextPiece", "RowsPiece", "TextAndRows")  # the tags pydantic puts in error locations (not fields)
SegmentRequest = Annotated[
    Annotated[TextPiece, Tag("TextPiece")] | Annotated[RowsPiece, Tag("RowsPiece")]
    | Annotated[_TextAndRows, Tag("TextAndRows"), SkipJsonSchema()],
    Discriminator(_piece_kind, custom_error_type="piece_missing",
                  custom_error_message="send `seq` with `text` (classify and summarize sessions) or `rows` (forecast "
                                       "sessions)"),
    Field(description="`seq` and either `text` or `rows`."),
]


class SummarizeProgress(Reading):
    """A summarize session's running result: what the encoder has read (the summary comes at finish)."""

    encoded_tokens: int = Field(description="Tokens the encoder has already turned into memory.", examples=[510])
    windows: int = Field(description="Encoder windows closed.", examples=[1])


class SegmentResponse(BaseModel):
    session: SessionInfo = Field(description="The session after this piece.")
    replayed: bool = Field(description="True when this `seq` was already applied and the stored result is "
                                       "returned.", examples=[False])
    result: ClassifyResult | ForecastResult | SummarizeProgress | SummaryResult = Field(
        description="The running result after this piece: label probabilities (classify), the forecast "
        "(forecast), what has been read (summarize). A retry of the last `seq` after finish returns the final "
        "result (for summaries: the summary).",
        examples=[{"label": "mainstream", "probabilities": {"hyperpartisan": 0.2, "mainstream": 0.8},
                   "segments": 1, "tokens_read": 130, "tokens_total": 130, "truncated": False}],
    )


class FinishRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stream: StrictBool = Field(False, description="Summaries only. " + STREAM_DESCRIPTION + " On a session "
                               "already finished the stored summary is sent again, as one `token` event.",
                               examples=[False])
    max_length: MaxLength | None = Field(None, description="Summaries only. " + MAX_LENGTH_DESCRIPTION,
                                         examples=[60])
    beam_size: BeamSize | None = Field(None, description="Summaries only. " + BEAM_SIZE_DESCRIPTION,
                                        examples=[1])
    decoding: Decoding | None = Field(None, description="Summaries only. " + DECODING_DESCRIPTION,
                                      examples=["sentence"])

    def options(self) -> dict[str, object]:
        return {"max_length": self.max_length, "beam_size": self.beam_size, "decoding": self.decoding}


SESSION_AFTER = Field(description="The session after finishing (`status` finished).")


class ClassifyFinish(ClassifyResponse):
    session: SessionInfo = SESSION_AFTER


class SummarizeFinish(SummarizeResponse):
    session: SessionInfo = SESSION_AFTER


class ForecastFinish(ForecastResponse):
    session: SessionInfo = SESSION_AFTER


FinishResponse = ClassifyFinish | SummarizeFinish | ForecastFinish


# ---- Server-Sent Events (summaries) -------------------------------------------------------------------


class TokenEvent(BaseModel):
    """`event: token` — the next piece of summary text; concatenated, the pieces are the summary."""

    text: str = Field(description="Text to append (whole words, with their leading space).", examples=[" shares"])


class ErrorEvent(ErrorBody):
    """`event: error` — the answer could not be completed after the stream began; the last event."""

    status: int = Field(description="The HTTP status the error would have had before the stream began (503: "
                        "retry as `detail` says).", examples=[503])


# ---- models --------------------------------------------------------------------------------------------


class ModelInfo(BaseModel):
    name: str = Field(description="Model name, as requests name it.", examples=["rsa-etth1-h24"])
    version: str = Field(description="Version (the repository folder under the name).", examples=["1"])
    task: Task = Field(description="What it does.", examples=["forecast"])
    family: str = Field(description="Model family: rmt, srformer, rsa, rtransformer, ...", examples=["rsa"])
    default: bool = Field(description="True for the model that answers the task when a request names no model.",
                          examples=[True])
    backend: str = Field(description="onnx, torchscript or torch.", examples=["onnx"])
    device: str = Field(description="Where the model runs: cpu or cuda:N.", examples=["cpu"])
    precision: str = Field(description="fp32, fp16 or bf16.", examples=["fp32"])
    providers: list[str] = Field(
        description="Execution providers the model's sessions actually use (ONNX Runtime's, in order of "
        "preference; CPU or CUDA for torch backends).",
        examples=[["CPUExecutionProvider"]],
    )
    max_batch_size: int = Field(description="Largest batch the batcher forms for this model.", examples=[32])
    value_range: dict[str, list[float]] | None = Field(
        description="Forecasters: per variable, the lowest and highest value the model takes (its training mean "
        "± 1e12 standard deviations, where its float32 arithmetic stays finite); a row outside is refused (422). "
        "Null for text models.",
        examples=[{"HUFL": [-5.8e12, 5.8e12], "OT": [-9.2e12, 9.2e12]}],
    )
    max_tokens: int | None = Field(
        description="Most tokens of a document the model reads (text models); past it, `RTSERVE_OVER_LIMIT` decides: "
        "read the first tokens and answer `truncated: true`, or 422. Null for forecasters (their look-back slides).",
        examples=[None],
    )
    manifest: dict[str, Any] = Field(
        description="The entry's manifest.json: settings (segment length, look-back, labels, ... and `metrics`: the "
        "model's measured test scores), graphs, state spec.",
        examples=[{"task": "forecast", "family": "rsa", "settings": {"lookback": 96, "horizon": 24, "metrics": {
            "test": {"mse": 0.296, "mae": 0.346}}}}],
    )
