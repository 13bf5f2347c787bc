"""The summarizer's decoder without HTTP: 32 BBC documents decoded all at once vs one after another.

    .venv/bin/python benchmarks/decode_batching.py                                   # model_repository/
    .venv/bin/python benchmarks/decode_batching.py --baseline /tmp/old-repository    # side by side

The documents are those of ``rtserve bench``'s ``decode`` scenario (one or two whole encoder windows
each). They are read once (the encoder is untimed); then every summary is decoded through the
service's own pipeline, decode loop and backend, in this process: all 32 searches at once (they
share every step of the decode loop) and one search at a time. Printed per repository: decode
tokens/s both ways, their ratio, the split of the wall time between the decode graph (the
backend's calls) and everything else (the searches, re-forming the batch, the thread hop), and the
megabytes per step a GPU backend would copy to the device: every input at every step, and with the
fixed inputs kept on the device between re-forms (counted here from the arrays, on any machine). With
``--baseline``, the two repositories alternate in one process, ``--repeats`` times each, medians.
This is the ceiling of the HTTP bench's ``decode`` ratio on the same machine: no HTTP, no client.
For a model with a salience head, the same documents are also finished with sentence copy (no decoder
step), one at a time, beside free decoding: milliseconds per summary, both measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest import bench_inputs as inputs
from service.runtime.backends import DeviceCopies
from service.runtime.registry import LoadedModel, load_model
from service.settings import Settings


@dataclass
class Timed:
    """The decode graph's calls, timed: wrapped around a backend's ``run``. Also counted: the bytes a GPU
    backend would copy to the device, copying every input at every call (``all_bytes``), and keeping the
    ``keep`` inputs (``unkept_bytes`` of the others plus what :class:`~service.runtime.backends.DeviceCopies`,
    the backends' own rule, would copy of the kept ones)."""

    backend: Any
    seconds: float = 0.0
    calls: int = 0
    rows: int = 0
    all_bytes: int = 0
    unkept_bytes: int = 0
    run: Any = field(init=False)
    kept: DeviceCopies = field(default_factory=lambda: DeviceCopies(lambda array: None))  # counts, copies nothing

    def __post_init__(self) -> None:
        self.run = self.backend.run
        self.backend.run = self._run

    def _run(self, feed: dict, keep: Collection[str] = ()) -> dict:
        started = time.perf_counter()
        outputs = self.run(feed, keep)
        self.seconds += time.perf_counter() - started
        self.calls += 1
        self.rows += len(feed["token"])
        self.all_bytes += sum(array.nbytes for array in feed.values())
        self.unkept_bytes += sum(array.nbytes for name, array in feed.items() if name not in keep)
        for name in keep:
            self.kept.get(name, feed[name], feed[name])
        return outputs

    def reset(self) -> None:
        self.seconds, self.calls, self.rows, self.all_bytes, self.unkept_bytes = 0.0, 0, 0, 0, 0
        self.kept.bytes_copied = 0


async def read(model: LoadedModel, texts: list[str]) -> list[tuple[dict, list]]:
    """Each document read into (state, chunks), as a session's pieces would leave it."""
    documents = []
    for pieces in texts:
        pipeline, state, chunks = model.pipeline, model.pipeline.new_state(), []
        for piece in pieces:
            consumed = await pipeline.consume(state, piece)
            state = consumed.state
            if consumed.chunk is not None:
                chunks.append(consumed.chunk)
        documents.append((state, chunks))
    return documents


async def decode(model: LoadedModel, documents: list[tuple[dict, list]], concurrent: bool,
                 decoding: str = "free") -> tuple[float, int]:
    async def one(document: tuple[dict, list]) -> int:
        finished = await model.pipeline.finish(document[0], document[1], None, options={"decoding": decoding})
        return int(finished.result["summary_tokens"])

    started = time.perf_counter()
    if concurrent:
        tokens = sum(await asyncio.gather(*(one(document) for document in documents)))
    else:
        tokens = 0
        for document in documents:
            tokens += await one(document)
    return time.perf_counter() - started, tokens


async def measure(repositories: dict[str, Path], model_name: str, data: Path, count: int, repeats: int
                  ) -> dict[str, Any]:
    models = {label: load_model(repository / model_name / "1", "onnx",
                                Settings(model_repository=repository, redis_url=None))
              for label, repository in repositories.items()}
    first = next(iter(models.values()))
    sessions = inputs.decode_sessions(first.entry, first.manifest, inputs.bbc_texts(data, count * 4), count)
    texts = [[json.loads(piece)["text"] for piece in session.pieces] for session in sessions]
    documents = {label: await read(model, texts) for label, model in models.items()}
    timers = {label: Timed(model.batchers["decode_step"].backend) for label, model in models.items()}
    runs: dict[str, list[dict[str, float]]] = {f"{label} {kind}": [] for label in models
                                               for kind in ("concurrent", "one at a time")}
    for label, model in models.items():  # warm-up, untimed
        await decode(model, documents[label][:1], concurrent=False)
    for repeat in range(repeats):
        order = list(models) if repeat % 2 == 0 else list(reversed(models))
        for label in order:
            for concurrent in (True, False):
                timers[label].reset()
                seconds, tokens = await decode(models[label], documents[label], concurrent)
                timer = timers[label]
                runs[f"{label} {'concurrent' if concurrent else 'one at a time'}"].append({
                    "tokens_per_second": tokens / seconds, "graph_share": timer.seconds / seconds,
                    "mean_batch": timer.rows / max(timer.calls, 1),
                    "graph_ms_per_row": 1000 * timer.seconds / max(timer.rows, 1),
                    "mb_per_step_every_input": timer.all_bytes / 1e6 / max(timer.calls, 1),
                    "mb_per_step_kept": (timer.unkept_bytes + timer.kept.bytes_copied) / 1e6 / max(timer.calls, 1),
                })
    copies: dict[str, list[dict[str, float]]] = {}
    for label, model in models.items():  # sentence copy: the same finish, no decoder step (salience head)
        if model.manifest["settings"].get("salience_position") is None:
            continue
        for _ in range(repeats):
            free_seconds, _ = await decode(model, documents[label], concurrent=False)
            copy_seconds, copied = await decode(model, documents[label], concurrent=False, decoding="sentence")
            copies.setdefault(f"{label} sentence copy", []).append({
                "tokens_per_second": copied / copy_seconds,
                "ms_per_summary": 1000 * copy_seconds / len(documents[label]),
                "free_ms_per_summary": 1000 * free_seconds / len(documents[label])})
    for model in models.values():
        for runner in model.batchers.values():
            await runner.close()
    return {name: {key: statistics.median(run[key] for run in values) for key in values[0]}
            for name, values in (runs | copies).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--baseline", type=Path, help="a second repository, measured in turn with the first")
    parser.add_argument("--model", default="srformer-news")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--documents", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    repositories = {"this": args.repository} | ({"baseline": args.baseline} if args.baseline else {})
    results = asyncio.run(measure(repositories, args.model, args.data, args.documents, args.repeats))
    print(f"{args.documents} documents, {args.repeats} repeats, medians\n")
    print("| repository, decoding | tokens/s | mean batch | graph ms per row | graph share of wall "
          "| MB to a GPU per step: every input / fixed inputs kept |")
    print("|---|---|---|---|---|---|")
    for name, row in results.items():
        if "ms_per_summary" in row:
            continue
        print(f"| {name} | {row['tokens_per_second']:.0f} | {row['mean_batch']:.1f} | {row['graph_ms_per_row']:.3f} "
              f"| {row['graph_share']:.2f} | {row['mb_per_step_every_input']:.2f} / {row['mb_per_step_kept']:.2f} |")
    print()
    for name, row in results.items():
        if "ms_per_summary" in row:
            print(f"{name}, one at a time: {row['ms_per_summary']:.1f} ms per summary against "
                  f"{row['free_ms_per_summary']:.1f} ms decoding freely "
                  f"(copy / free = {row['ms_per_summary'] / row['free_ms_per_summary']:.2f})")
    for label in repositories:
        ratio = results[f"{label} concurrent"]["tokens_per_second"] / results[f"{label} one at a time"][
            "tokens_per_second"]
        print(f"{label}: concurrent / one at a time = {ratio:.2f}")
    if args.baseline:
        for kind in ("concurrent", "one at a time"):
            gain = results[f"this {kind}"]["tokens_per_second"] / results[f"baseline {kind}"]["tokens_per_second"]
            print(f"this / baseline, {kind}: {gain:.2f}")


if __name__ == "__main__":
    main()
