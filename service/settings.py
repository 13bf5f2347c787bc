"""All service settings, read from the environment with the ``RTSERVE_`` prefix.

Every field here is listed in the README's settings table. Nothing else in
the service reads environment variables.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.devices import check_device, check_precision

Device = Annotated[str, AfterValidator(check_device)]  # auto, cpu, cuda or cuda:N, lower-cased
Precision = Annotated[str, AfterValidator(check_precision)]  # fp32, fp16 or bf16, lower-cased
StepMode = Literal["auto", "eager", "graphs", "compile"]


def per_model(what: str, example: tuple[str, object], overriding: str = "the default") -> Any:
    """A setting per model name, as a JSON object; a model it does not name takes the default (the lookups are
    :class:`Settings`' ``*_for`` methods). ``example``: a model name and its value, for the description."""
    return Field(default_factory=dict, description=f"{what} per model name as JSON, overriding {overriding}, e.g. "
                 f"{json.dumps(dict([example]))}.")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RTSERVE_", env_file=None, extra="ignore")

    host: str = Field("127.0.0.1", description="Interface the HTTP server binds to.")
    port: int = Field(8000, ge=1, le=65535, description="TCP port of the HTTP server.")
    grpc_port: int | None = Field(
        None, ge=1, le=65535, description="TCP port of the KServe v2 gRPC server (`inference.GRPCInferenceService`, "
        "Triton's clients and perf_analyzer), on RTSERVE_HOST. Unset: no gRPC server (the KServe v2 REST routes, "
        "/v2/..., are always served on RTSERVE_PORT).",
    )
    model_repository: Path = Field(
        Path("model_repository"), description="Folder of exported models (one folder per model/version)."
    )
    redis_url: str | None = Field(
        None,
        description="Redis server for session state. Unset: an embedded Redis is started with the service.",
    )
    redis_cluster: bool = Field(
        False,
        description="RTSERVE_REDIS_URL names one node of a Redis Cluster: the client learns the slot map from it "
        "and follows failovers. Needs RTSERVE_REDIS_URL.",
    )
    redis_key_prefix: str = Field("rtserve", description="Namespace of every Redis key the service writes.")
    redis_timeout_seconds: float = Field(
        2.0, gt=0, description="How long one Redis operation may take once it has a connection, before the request "
        "answers 503; time the replica's own event loop ran behind lengthens it, up to three times this in all (on a "
        "Redis Cluster: each command's socket timeout, so that a failover's retries run their course), a new "
        "connection's connect included.",
    )
    redis_max_connections: int = Field(
        256, ge=1, description="Redis connections per replica; a request waits for a free one (never fails at once)."
    )
    redis_pool_timeout_seconds: float = Field(
        10.0, gt=0, description="Longest wait for a free Redis connection before answering 503."
    )
    embedded_redis_dir: Path | None = Field(
        None, description="Where the embedded Redis keeps its socket and files (default: a temporary folder)."
    )
    session_ttl_seconds: int = Field(1800, ge=1, description="Idle time after which a session expires.")
    session_max_lifetime_seconds: int = Field(86400, ge=1, description="Hard limit on a session's age.")
    max_body_bytes: int = Field(2_000_000, ge=1024, description="Largest accepted request body (413 above).")
    max_text_chars: int = Field(200_000, ge=1, description="Longest accepted text, in characters (422 above).")
    over_limit: Literal["truncate", "refuse"] = Field(
        "truncate",
        description="A document longer than its model reads (GET /models: `max_tokens`): `truncate` reads the "
        "first tokens and answers `truncated: true`; `refuse` answers 422 and applies nothing.",
    )
    max_rows: int = Field(100_000, ge=1, description="Most series rows accepted in one request (422 above).")
    max_segments_per_session: int = Field(10_000, ge=1, description="Most pieces one session may receive (429).")
    max_sessions_per_key: int = Field(
        1_000, ge=1,
        description="Most live sessions one API key (without keys: one client address) may hold (429).",
    )
    session_lock_seconds: float = Field(
        1.0, gt=0, le=60,
        description="Lease of the lock a replica holds while it computes a piece or holds a session's stream open; "
        "renewed while it does.",
    )
    state_cache_bytes: int = Field(
        256 * 2**20, ge=0,
        description="Bytes of session states a replica keeps in memory after it applied a session's last piece, so "
        "that the session's next piece is computed without reading its state back from Redis (the commit still "
        "checks it is current). The least recently used are dropped past it; 0 keeps none.",
    )
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Accepted API keys (JSON list or comma-separated). Empty: no authentication.",
    )
    max_batch_size: int = Field(
        32, ge=1, description="Largest batch the dynamic batcher forms per model graph on the CPU."
    )
    max_batch_size_cuda: int = Field(
        256, ge=1, description="Largest batch per model graph on a CUDA device (a GPU wants far larger batches)."
    )
    model_max_batch_sizes: dict[str, int] = per_model("Largest batch", ("srformer-news", 64),
                                                      "both defaults and a graph's CPU cap from its export")
    max_queue_delay_ms: float = Field(
        5.0, ge=0, description="Longest wait for company the last batch promised (fewer rows queued than it had): "
        "a request that finds the worker free waits up to this long after a batch of more than one row.",
    )
    light_batches_on_loop: bool = Field(
        True, description="A light graph's batch that holds every request in flight runs on the event loop, not "
        "on the graph's thread (nothing else could use the loop meanwhile; the two hops cost more CPU than such a "
        "step). Off: only a lone request's call does. What it saves depends on the host: measure both.",
    )
    backend: str = Field("onnx", description="Default backend: onnx, torchscript or torch.")
    intra_op_threads: int = Field(
        0, ge=0, description="Threads per model graph on the CPU (ONNX Runtime intra-op; torch). 0: one for a graph "
        "its export found light (a batch of one in under 2 ms on one thread, not 1.5 times as fast on every "
        "core), else the runtime default."
    )
    intra_op_spinning: bool = Field(
        False, description="Let ONNX Runtime's intra-op threads busy-wait between ops (its own default). Off: on a "
        "CPU shared with the event loop and other models, spinning threads take the cores those need.",
    )
    model_backends: dict[str, str] = per_model("Backend", ("rmt-hyperpartisan", "torch"))
    device: Device = Field(
        "auto",
        description="Default device: auto (cuda:0 where the model's backend sees a GPU, else cpu), cpu, cuda or "
        "cuda:N. A CUDA device that is not there fails startup.",
    )
    model_devices: dict[str, Device] = per_model("Device", ("rsa-etth1-h24", "cpu"))
    precision: Precision = Field(
        "fp32",
        description="Default precision: fp32, fp16 (onnx, torch backends) or bf16 (torch backend).",
    )
    model_precisions: dict[str, Precision] = per_model("Precision", ("rmt-hyperpartisan", "bf16"))
    step_mode: StepMode = Field(
        "auto",
        description="How a torch step runs on a CUDA device: `auto` (the mode the entry's step_modes.json measured "
        "fastest, eager without one), `eager`, `graphs` (CUDA graphs captured per batch bucket) or `compile` "
        "(torch.compile). On a CPU, and for decode graphs, always eager.",
    )
    model_step_modes: dict[str, StepMode] = per_model("Step mode", ("rmt-hyperpartisan", "graphs"))
    device_state_bytes: int = Field(
        2**30, ge=0,
        description="Bytes of session states the torch backend keeps on a CUDA device where their step left them, "
        "for the callers that pass their state's handle back (the step then copies no state to the device); the "
        "least recently used are dropped past it. 0 keeps none; the CPU keeps none.",
    )
    default_models: dict[str, str] = Field(
        default_factory=dict,
        description='Default model per task as JSON, e.g. {"summarize": "srformer-news"}.',
    )
    request_read_timeout_seconds: float = Field(
        10.0, gt=0, description="Time a client has to send a request's headers, and again its body (408 / closed)."
    )
    keep_alive_timeout_seconds: float = Field(
        5.0, gt=0, description="An idle keep-alive connection is closed after this long."
    )
    shutdown_drain_seconds: float = Field(
        0.0, ge=0, description="On SIGTERM, how long /readyz answers 503 (draining) while requests are still accepted "
        "and served, before the service stops accepting: time for load balancers to stop routing here. 0: stop "
        "accepting at once.",
    )
    shutdown_timeout_seconds: float = Field(
        10.0, ge=0, description="After the drain, how long requests in flight (streams included) have to finish; "
        "what is still running then is answered 503 (a stream: an `error` event).",
    )
    workers: int = Field(
        1, ge=1, description="HTTP front ends serving one port. Above 1, one engine process owns the models (one "
        "copy per device) and batches the rows of every front end together; the front ends parse, validate, talk "
        "to Redis and run the pipelines around the graphs, each on its own core. They share one Redis and one "
        "metrics folder.",
    )
    engine_socket: Path | None = Field(
        None, description="Set by the service for its front ends (RTSERVE_WORKERS above 1): the engine process's "
        "Unix socket. A process with it set loads no graph and sends every step to that engine.",
    )
    metrics_dir: Path | None = Field(
        None, description="With several workers: a folder of their own where they keep their metric files (an "
        "earlier run's are deleted at start; any other *.db file there is refused). Default: a temporary folder.",
    )
    log_level: str = Field("info", description="uvicorn / service log level.")
    access_log: bool = Field(
        False, description="Log one line per HTTP request: method, route template (never the path: no session ids), "
        "status, duration, request id.",
    )
    opentelemetry: bool = Field(
        False, description="FastAPI's own OpenTelemetry spans, metrics and logs, sent to the providers the process "
        "configured (e.g. under `opentelemetry-instrument`). Off, FastAPI skips them: its check for configured "
        "providers cost every request 0.1 ms of CPU, and the service's Prometheus metrics cover its requests.",
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="`text` lines, or `json`: one object per line with `request_id` on every line.",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Origins a browser may call the API from (JSON list or comma-separated; `*` for any). Empty: "
        "no CORS headers (browsers on other origins are refused).",
    )
    gzip_minimum_bytes: int = Field(
        1000, ge=0, description="Answers larger than this are gzip-compressed for clients that accept it (never "
        "Server-Sent Events). 0 turns compression off.",
    )

    @field_validator("api_keys", "cors_origins", mode="before")
    @classmethod
    def _split_api_keys(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [key.strip() for key in text.split(",") if key.strip()]
        return value

    @field_validator("model_max_batch_sizes")
    @classmethod
    def _check_batch_sizes(cls, value: dict[str, int]) -> dict[str, int]:
        for name, size in value.items():
            if size < 1:
                raise ValueError(f"batch size {size} for model {name!r} must be at least 1")
        return value

    @model_validator(mode="after")
    def _cluster_needs_a_url(self) -> Settings:
        if self.redis_cluster and not self.redis_url:
            raise ValueError("RTSERVE_REDIS_CLUSTER=true needs RTSERVE_REDIS_URL (any one node of the cluster); "
                             "the embedded Redis is a single server")
        return self

    def backend_for(self, model: str) -> str:
        return self.model_backends.get(model, self.backend)

    def device_for(self, model: str) -> str:
        """The device setting of ``model`` (auto, cpu, cuda, cuda:N), before resolution."""
        return self.model_devices.get(model, self.device)

    def step_mode_for(self, model: str) -> str:
        return self.model_step_modes.get(model, self.step_mode)

    def precision_for(self, model: str) -> str:
        return self.model_precisions.get(model, self.precision)

    def batch_size_for(self, model: str, device: str) -> int:
        """Largest batch of ``model`` on its resolved ``device`` ("cpu" or "cuda:N")."""
        if model in self.model_max_batch_sizes:
            return self.model_max_batch_sizes[model]
        return self.max_batch_size_cuda if device.startswith("cuda") else self.max_batch_size

