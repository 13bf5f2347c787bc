"""The floor: the least a server must do per piece for a forecast (RSA) or classify (RMT) session.

``rtserve bench`` runs this beside the service and divides the service's CPU per piece by this
server's (the ``floor`` scenario). It is bare Starlette on uvicorn (uvloop, httptools) with redis-py
(hiredis when installed) and ONNX Runtime, and per piece it does what the service's piece does, no
more:

1. for a session whose last piece it did not apply, one round trip: the service's own ``BEGIN`` script (meta,
   the stored state, the lock taken); for one whose last piece it applied, none: it keeps that piece's state,
   as the service does;
2. the model's ``step.onnx`` at batch 1, ONNX Runtime with one intra-op thread and no spinning, run on
   the event loop (nothing here batches or hands off);
3. one round trip: the service's own ``COMMIT`` script (state, result, seq, unlock, the live and quota
   indexes);
4. a JSON answer with the session's counters and the running result (orjson).

The state is stored as raw array bytes, of the service's sizes: an RSA window and row count
(2.7 KB); an RMT memory plus a carry-over region the size of the text cutter's pending text and
ids (18 KB), written back as it was read. An RMT piece is tokenized whole (the bench's pieces each
complete exactly one segment) and packed as ``[CLS] ids [SEP]``, padded to the segment. The piece's
digest (the stored ``piece_sha``) is SHA-256 of the body's bytes. There is no validation beyond what
the arithmetic needs, no metrics, no logging, no request ids: what is left is the cost of HTTP,
Redis, the graph and JSON in Python.

    python benchmarks/floor_server.py --model-repository model_repository --redis-url unix:///tmp/r.sock \\
        --port 8101
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
import redis.asyncio as aioredis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from service.sessions.scripts import BEGIN, COMMIT, CREATE

PREFIX = "rtserve-floor"
OWNER = "anonymous"
TTL_SECONDS = 3600
LOCK_MS = 30_000
CLS_ID, SEP_ID = 101, 102


def answer(content: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status, media_type="application/json")


def onnx_step(entry: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(entry / "step.onnx"), sess_options=options, providers=["CPUExecutionProvider"])


class Forecaster:
    """RSA: state = the last L rows (float32) and the row count (int64)."""

    task = "forecast"

    def __init__(self, entry: Path, manifest: dict[str, Any]) -> None:
        settings = manifest["settings"]
        self.session = onnx_step(entry)
        self.lookback, self.horizon = int(settings["lookback"]), int(settings["horizon"])
        self.variables = list(settings["variables"])
        self.width = len(self.variables)

    def new_state(self) -> bytes:
        return np.zeros((self.lookback, self.width), np.float32).tobytes() + np.zeros(1, np.int64).tobytes()

    def step(self, state: bytes, piece: dict[str, Any]) -> tuple[bytes, dict[str, Any], int]:
        window = np.frombuffer(state, np.float32, self.lookback * self.width).reshape(1, self.lookback, self.width)
        rows_seen = np.frombuffer(state, np.int64, 1, offset=window.nbytes)
        values = np.asarray(piece["rows"], dtype=np.float32)[None]  # (1, T, C)
        next_window, next_rows, forecast, ready = self.session.run(
            None, {"window": window, "rows_seen": rows_seen, "values": values})
        seen = int(next_rows[0])
        result = {"forecast": forecast[0].tolist() if ready[0] else None, "horizon": self.horizon,
                  "variables": self.variables, "rows_seen": seen, "rows_needed": max(0, self.lookback - seen)}
        return next_window.tobytes() + next_rows.tobytes(), result, values.shape[1]


class Classifier:
    """RMT: state = the memory (float32) plus the cutter's carry-over region, kept at its size."""

    task = "classify"

    def __init__(self, entry: Path, manifest: dict[str, Any]) -> None:
        from tokenizers import Tokenizer

        settings = manifest["settings"]
        self.session = onnx_step(entry)
        self.tokenizer = Tokenizer.from_file(str(entry / manifest["assets"]["tokenizer"]))
        self.segment = int(settings["segment_size"])
        self.labels = list(settings["labels"])
        from safetensors.numpy import load

        self.memory = load((entry / "initial_state.safetensors").read_bytes())["memory"]  # (1, m, d)
        # pending text (bytes) + pending ids (int64) of the service's text cutter
        self.carry_bytes = int(settings["pending_bytes"]) + 8 * (self.segment - 2)

    def new_state(self) -> bytes:
        return self.memory.tobytes() + bytes(self.carry_bytes)

    def step(self, state: bytes, piece: dict[str, Any]) -> tuple[bytes, dict[str, Any], int]:
        memory = np.frombuffer(state, np.float32, self.memory.size).reshape(self.memory.shape)
        content = self.tokenizer.encode(piece["text"], add_special_tokens=False).ids[: self.segment - 2]
        ids = np.zeros((1, self.segment), np.int64)
        ids[0, : len(content) + 2] = [CLS_ID, *content, SEP_ID]
        mask = (np.arange(self.segment) < len(content) + 2).astype(np.int64)[None]
        next_memory, logits = self.session.run(None, {"memory": memory, "input_ids": ids, "attention_mask": mask})
        shifted = np.exp(logits[0].astype(np.float64) - logits[0].max())
        probabilities = shifted / shifted.sum()
        result = {"label": self.labels[int(probabilities.argmax())],
                  "probabilities": dict(zip(self.labels, probabilities.tolist(), strict=True)), "segments": 1}
        return next_memory.tobytes() + state[memory.nbytes:], result, len(content)


class Floor:
    def __init__(self, repository: Path, redis_url: str, only: set[str]) -> None:
        self.redis = aioredis.Redis.from_url(redis_url, decode_responses=False)
        self.models: dict[str, Forecaster | Classifier] = {}
        for manifest_path in sorted(repository.glob("*/*/manifest.json")):
            manifest = json.loads(manifest_path.read_text())
            ref = f"{manifest['name']}:{manifest['version']}"
            kind = {"rsa": Forecaster, "rmt": Classifier}.get(manifest["family"])
            if kind is not None and (not only or ref in only):
                self.models[ref] = kind(manifest_path.parent, manifest)
        self.begin = self.redis.register_script(BEGIN)
        self.commit_sha = ""
        self.create = self.redis.register_script(CREATE)
        self.kept: dict[str, tuple[int, bytes, dict[bytes, bytes]]] = {}  # session -> seq, state, meta fields

    async def start(self) -> None:
        self.commit_sha = await self.redis.script_load(COMMIT)
        await self.redis.script_load(BEGIN)

    @staticmethod
    def keys(session_id: str) -> list[str]:
        return [f"{PREFIX}:{{{session_id}}}:{part}" for part in ("meta", "state", "result", "chunks", "lock")]

    async def open(self, request: Request) -> Response:
        ref = orjson.loads(await request.body())["model"]
        model = self.models[ref]
        session_id = secrets.token_urlsafe(24)
        now, state = time.time(), model.new_state()
        fields = {"model": ref, "task": model.task, "owner": OWNER, "quota": OWNER, "seq": 0, "created": now,
                  "deadline": now + TTL_SECONDS, "consumed": 0, "segments": 0, "state_bytes": len(state),
                  "piece_sha": "", "status": "open"}
        meta, state_key = self.keys(session_id)[:2]
        # the session's keys only (no quota, no live index): ARGV now, limit, id, idle expiry, ttl, state, meta
        await self.create(keys=[meta, state_key], args=[now, 0, session_id, now + TTL_SECONDS, TTL_SECONDS, state,
                                                        *(str(x) for kv in fields.items() for x in kv)])
        return answer({"id": session_id, "seq": 0}, 201)

    async def piece(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        body = await request.body()
        piece = orjson.loads(body)
        seq = piece["seq"]
        keys = self.keys(session_id)
        kept = self.kept.get(session_id)
        token = ""
        if kept is not None and kept[0] == seq - 1:
            _, stored, fields = kept
        else:
            token = f"{seq}:{secrets.token_hex(8)}"
            reply = await self.begin(keys=keys[:3] + keys[4:], args=[seq, OWNER, token, LOCK_MS])
            if not reply or int(reply[4]) != 1:
                return answer({"detail": "not the next piece, or the session is gone or busy"}, 409)
            fields, stored = dict(zip(reply[0][::2], reply[0][1::2], strict=True)), reply[2]
        ref = fields[b"model"].decode()
        state, result, units = self.models[ref].step(stored, piece)
        indexes = [f"{PREFIX}:live:{ref}", f"{PREFIX}:owner:{OWNER}:sessions"]
        consumed, segments = int(fields[b"consumed"]) + units, int(fields[b"segments"]) + 1
        committed = await self.redis.execute_command(
            "EVALSHA", self.commit_sha, 7, *keys, *indexes, seq - 1, seq, state, orjson.dumps(result), TTL_SECONDS,
            hashlib.sha256(body).hexdigest(), consumed, segments, len(state), token, "", time.time() + TTL_SECONDS,
            session_id, "")
        if int(committed[0]) != 1:
            self.kept.pop(session_id, None)
            return answer({"detail": "lost the race"}, 409)
        fields[b"segments"], fields[b"consumed"] = str(segments).encode(), str(consumed).encode()
        self.kept[session_id] = (seq, state, fields)
        session = {"id": session_id, "seq": seq, "segments": int(fields[b"segments"]),
                   "consumed": int(fields[b"consumed"])}
        return answer({"session": session, "replayed": False, "result": result})

    async def finish(self, request: Request) -> Response:
        keys = self.keys(request.path_params["session_id"])
        result = await self.redis.get(keys[2])
        return Response(result or b"{}", media_type="application/json")

    async def delete(self, request: Request) -> Response:
        self.kept.pop(request.path_params["session_id"], None)
        await self.redis.delete(*self.keys(request.path_params["session_id"]))
        return Response(status_code=204)

    async def ready(self, request: Request) -> Response:
        await self.redis.ping()
        return answer({"status": "ready", "models": sorted(self.models)})


def create_app(repository: Path, redis_url: str, only: set[str]) -> Starlette:
    floor = Floor(repository, redis_url, only)
    routes = [
        Route("/readyz", floor.ready),
        Route("/sessions", floor.open, methods=["POST"]),
        Route("/sessions/{session_id}/segments", floor.piece, methods=["POST"]),
        Route("/sessions/{session_id}/finish", floor.finish, methods=["POST"]),
        Route("/sessions/{session_id}", floor.delete, methods=["DELETE"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await floor.start()
        yield
        await floor.redis.aclose()

    return Starlette(routes=routes, lifespan=lifespan)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repository", type=Path, required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--models", default="", help="comma-separated name:version (default: every RSA and RMT)")
    options = parser.parse_args()
    app = create_app(options.model_repository, options.redis_url, {m for m in options.models.split(",") if m})
    uvicorn.run(app, host=options.host, port=options.port, loop="uvloop", http="httptools", access_log=False,
                log_level="warning")


if __name__ == "__main__":
    main()
