"""Redis memory per session, per model of a model repository: what sizes a Redis for N concurrent sessions.

    python benchmarks/session_capacity.py --model-repository model_repository [--words 1000 2000] [--rows 96 720]

For each model it opens a session through the HTTP API (in-process app, a private embedded Redis), sends a
document in pieces, and reads (a) ``state_bytes`` the service reports and (b) what Redis holds for the
session: ``MEMORY USAGE`` of every key of the session plus its entries in the quota and live indexes.
Text is English prose (this repository's docs, repeated), series are random rows: state size depends on
token and row counts, not content. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import redis
from fastapi.testclient import TestClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.app import create_app  # noqa: E402
from service.embedded_redis import EmbeddedRedis  # noqa: E402
from service.settings import Settings  # noqa: E402

PREFIX = "capacity"


def prose(words: int) -> str:
    text = re.sub(r"[`|#*\[\]()]", " ", (ROOT / "docs" / "serving.md").read_text())
    vocabulary = text.split()
    return " ".join(vocabulary[i % len(vocabulary)] for i in range(words))


def session_bytes(client: redis.Redis, session_id: str) -> int:
    keys = list(client.scan_iter(match=f"{PREFIX}:{{{session_id}}}:*"))
    total = sum(client.memory_usage(key, samples=0) or 0 for key in keys)
    # one member in the quota index and one in the live index: measured as the growth of those sorted sets
    return total


def index_entry_bytes(client: redis.Redis) -> float:
    """Bytes one more member adds to a sorted set of 1,000 members, as the indexes hold them."""
    key = f"{PREFIX}:probe"
    client.delete(key)
    client.zadd(key, {f"{i:032d}": 1e9 + i for i in range(1000)})
    before = client.memory_usage(key, samples=0)
    client.zadd(key, {f"x{i:031d}": 1e9 + i for i in range(1000)})
    after = client.memory_usage(key, samples=0)
    client.delete(key)
    return (after - before) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--words", type=int, nargs="+", default=[600, 2000], help="document lengths (text models)")
    parser.add_argument("--rows", type=int, nargs="+", default=[96, 720], help="series lengths (forecast models)")
    parser.add_argument("--pieces", type=int, default=4, help="pieces each document is sent in")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with EmbeddedRedis() as server:
        raw = redis.Redis.from_url(server.url)
        per_index_entry = index_entry_bytes(raw)
        settings = Settings(model_repository=args.model_repository, redis_url=server.url, redis_key_prefix=PREFIX)
        print("| model | task | document | consumed | state_bytes (service) | Redis bytes per session "
              "(keys + 2 index entries) | sessions per GB of Redis |")
        print("|---|---|---|---|---|---|---|")
        with TestClient(create_app(settings)) as client:
            for model in client.get("/models").json():
                name, task = f"{model['name']}:{model['version']}", model["task"]
                lengths = args.rows if task == "forecast" else args.words
                for length in lengths:
                    if task == "forecast":
                        width = len(model["manifest"]["settings"]["variables"])
                        document = (rng.standard_normal((length, width)) * 3 + 10).round(3).tolist()
                        field, unit = "rows", f"{length} rows"
                    else:
                        document, field, unit = prose(length), "text", f"{length} words"
                    size = -(-len(document) // args.pieces)
                    session = client.post("/sessions", json={"task": task, "model": name}).json()["id"]
                    for seq, start in enumerate(range(0, len(document), size), start=1):
                        response = client.post(f"/sessions/{session}/segments",
                                               json={"seq": seq, field: document[start : start + size]})
                        assert response.status_code == 200, response.text
                    status = client.get(f"/sessions/{session}").json()
                    used = session_bytes(raw, session) + 2 * per_index_entry
                    print(f"| {name} | {task} | {unit} | {status['consumed']} | {status['state_bytes']:,} | "
                          f"{used:,.0f} | {2**30 / used:,.0f} |")
                    client.delete(f"/sessions/{session}")


if __name__ == "__main__":
    main()
