"""All service settings, read from the environment with the ``RTSERVE_`` prefix.

Every field here is listed in the README's settings table. Nothing else in
the service reads environment variables.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RTSERVE_", env_file=None, extra="ignore")

    host: str = Field("127.0.0.1", description="Interface the HTTP server binds to.")
    port: int = Field(8000, ge=1, le=65535, description="TCP port of the HTTP server.")
    model_repository: Path = Field(
        Path("model_repository"), description="Folder of exported models (one folder per model/version)."
    )
    redis_url: str | None = Field(
        None,
        description="Redis server for session state. Unset: an embedded Redis is started with the service.",
    )
    redis_key_prefix: str = Field("rtserve", description="Namespace of every Redis key the service writes.")
    redis_timeout_seconds: float = Field(2.0, gt=0, description="Socket timeout for Redis operations.")
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
    max_rows: int = Field(100_000, ge=1, description="Most series rows accepted in one request (422 above).")
    max_segments_per_session: int = Field(10_000, ge=1, description="Most pieces one session may receive (429).")
    max_sessions_per_key: int = Field(
        1_000, ge=1,
        description="Most live sessions one API key (without keys: one client address) may hold (429).",
    )
    session_lock_seconds: float = Field(
        1.0, gt=0, le=60,
        description="Lease of the lock a replica holds while it computes a piece; refreshed while the step runs.",
    )
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Accepted API keys (JSON list or comma-separated). Empty: no authentication.",
    )
    max_batch_size: int = Field(32, ge=1, description="Largest batch the dynamic batcher forms per model.")
    max_queue_delay_ms: float = Field(5.0, ge=0, description="How long the batcher waits to fill a batch.")
    backend: str = Field("onnx", description="Default backend: onnx, torchscript or torch.")
    intra_op_threads: int = Field(
        0, ge=0, description="Threads per model graph on the CPU (ONNX Runtime intra-op; torch). 0: runtime default."
    )
    model_backends: dict[str, str] = Field(
        default_factory=dict,
        description='Backend per model name as JSON, overriding the default, e.g. {"rmt-hyperpartisan": "torch"}.',
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
    shutdown_timeout_seconds: float = Field(10.0, ge=0, description="Grace period for in-flight requests.")
    log_level: str = Field("info", description="uvicorn / service log level.")
    access_log: bool = Field(False, description="Log one line per HTTP request (uvicorn's access log).")

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_api_keys(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [key.strip() for key in text.split(",") if key.strip()]
        return value


@lru_cache
def get_settings() -> Settings:
    return Settings()
