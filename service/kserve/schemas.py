"""The KServe v2 REST bodies as OpenAPI documents them (``/docs``): every field described, with an example. The
router reads the bodies itself (:mod:`service.kserve.tensors`: JSON or binary tensor data); these models are the
schema, and the error body."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.kserve.tensors import DATATYPES

Datatype = Field(description="The tensor's datatype: " + ", ".join(DATATYPES) + ".", examples=["FP32"],
                 json_schema_extra={"enum": list(DATATYPES)})
Shape = Field(description="The tensor's shape (no batch axis: rtserve's models take one input per request).",
              examples=[[24, 7]], json_schema_extra={"items": {"type": "integer", "minimum": 0}})
Parameters = Field(None, description="Protocol parameters (name -> a boolean, number or string).",
                   examples=[{"binary_data_size": 672}])


class V2Error(BaseModel):
    """Every error of the /v2 routes (KServe v2's error body; the request id is in the X-Request-ID header)."""

    error: str = Field(description="What went wrong and what to change.",
                       examples=["inference input 'ROWS' data-type is 'FP64', but model 'rsa-etth1-h24' expects "
                                 "'FP32'"])


class ServerMetadata(BaseModel):
    name: str = Field(description="The server.", examples=["rtserve"])
    version: str = Field(description="Its version.", examples=["0.1.0"])
    extensions: list[str] = Field(description="The protocol extensions it serves.",
                                  examples=[["binary_tensor_data", "sequence", "model_configuration", "statistics"]])


class MetadataTensor(BaseModel):
    name: str = Field(description="The tensor's name.", examples=["ROWS"])
    datatype: str = Field(description="Its datatype.", examples=["FP32"])
    shape: list[int] = Field(description="Its shape; -1: any size.", examples=[[-1, 7]])


class ModelMetadata(BaseModel):
    name: str = Field(description="The model's name.", examples=["rsa-etth1-h24"])
    versions: list[str] = Field(description="Its loaded versions.", examples=[["1"]])
    platform: str = Field(description="Always `rtserve`.", examples=["rtserve"])
    inputs: list[MetadataTensor] = Field(description="What it takes: `TEXT` (BYTES [1]) or `ROWS` (FP32 [-1, C]).")
    outputs: list[MetadataTensor] = Field(description="What it gives: the one-shot answer's fields, in capitals.")


class InferInput(BaseModel):
    model_config = ConfigDict(title="InferInputTensor", extra="forbid")
    name: str = Field(description="`TEXT` (text models) or `ROWS` (forecasters).", examples=["ROWS"])
    shape: list[int] = Shape
    datatype: str = Datatype
    parameters: dict[str, Any] | None = Parameters
    data: list[Any] | None = Field(
        None, description="The elements, flat or nested in row-major order (BYTES: strings). Absent when "
        "`parameters.binary_data_size` says how many bytes of the binary part after the JSON header are its data "
        "(the header `Inference-Header-Content-Length` gives the JSON header's length).",
        examples=[[[5.827, 2.009, 1.599, 0.462, 4.203, 1.34, 30.531]]])


class RequestedOutput(BaseModel):
    model_config = ConfigDict(title="InferRequestedOutputTensor", extra="forbid")
    name: str = Field(description="An output of the model's metadata.", examples=["FORECAST"])
    parameters: dict[str, Any] | None = Field(None, description="`binary_data`: true for this output's data raw "
                                              "after the JSON header.", examples=[{"binary_data": True}])


class InferenceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | None = Field(None, description="Echoed in the answer.", examples=["42"])
    parameters: dict[str, Any] | None = Field(
        None, description="`sequence_id` (uint64 or string), `sequence_start`, `sequence_end` (Triton's sequence "
        "extension: a sequence is one rtserve session), `sequence_seq` (rtserve's: the piece's number, 1 for the "
        "start, for exactly-once), `binary_data_output` (every output raw), and for summaries `decoding`, "
        "`max_length`, `beam_size`.",
        examples=[{"sequence_id": 7, "sequence_start": True, "sequence_end": False}])
    inputs: list[InferInput] = Field(description="The model's one input.")
    outputs: list[RequestedOutput] | None = Field(None, description="The outputs to answer (default: all).")


class InferOutput(BaseModel):
    model_config = ConfigDict(title="InferOutputTensor")
    name: str = Field(description="The output's name.", examples=["FORECAST"])
    shape: list[int] = Field(description="Its shape.", examples=[[24, 7]])
    datatype: str = Field(description="Its datatype.", examples=["FP64"])
    parameters: dict[str, Any] | None = Field(None, description="`binary_data_size` when its data is raw after the "
                                              "JSON header.", examples=[None])
    data: list[Any] | None = Field(None, description="The elements, flat in row-major order (absent when raw).",
                                   examples=[[0.5, 1.25]])


class InferenceResponse(BaseModel):
    model_name: str = Field(description="The model that answered.", examples=["rsa-etth1-h24"])
    model_version: str | None = Field(None, description="Its version.", examples=["1"])
    id: str | None = Field(None, description="The request's `id`.", examples=["42"])
    parameters: dict[str, Any] | None = Field(
        None, description="For a piece of a sequence: `session_id` (the rtserve session holding it), `sequence_seq` "
        "(the pieces it has applied), `replayed` (a retried `sequence_seq` answered from the stored result), and the "
        "request's sequence controls.",
        examples=[{"session_id": "v2Qm9yZ2V0IGFib3V0IGl0LCBpdCdzIGEgaGFzaA", "sequence_seq": 1, "replayed": False}])
    outputs: list[InferOutput] = Field(description="The outputs asked for (default: all).")


class RepositoryEntry(BaseModel):
    name: str = Field(description="The model's name.", examples=["rsa-etth1-h24"])
    version: str = Field(description="One of its versions.", examples=["1"])
    state: str = Field(description="READY, or UNAVAILABLE when it did not load.", examples=["READY"])
    reason: str = Field(description="Why it did not load (empty when READY).", examples=[""])
