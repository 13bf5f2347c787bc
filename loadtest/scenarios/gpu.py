"""The ``gpu`` scenario: per model, segments/s and J/segment at 1 and N sessions, from NVML's energy counter
(:mod:`loadtest.bench_gpu`) read before and after a window of served runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loadtest import bench_inputs as inputs
from loadtest.bench_gpu import EnergyMeter, energy_rates
from loadtest.bench_inputs import SessionInput
from loadtest.harness import median
from loadtest.scenarios.common import Bench
from loadtest.sessions import served_pieces


def gpu_sessions(bench: Bench, model: Mapping[str, Any], count: int) -> list[SessionInput]:
    """One-step pieces for any loaded model: RMT segments, encoder windows, rows."""
    entry = bench.repository / model["name"] / model["version"]
    manifest, settings = model["manifest"], model["manifest"]["settings"]
    if model["task"] == "classify":
        texts = inputs.hyperpartisan_texts(bench.data)
        return inputs.classify_sessions(entry, manifest, texts, count, bench.counts.pieces)
    if model["task"] == "summarize":
        texts = inputs.bbc_texts(bench.data, count * 4)
        return inputs.summarize_sessions(entry, manifest, texts, count, bench.counts.pieces)
    values = inputs.etth1_values(bench.data, list(settings["variables"]))
    return inputs.forecast_sessions(values, int(settings["lookback"]), count, bench.counts.rsa_piece_rows,
                                    bench.counts.rsa_extra_pieces)


GPU_WINDOW_SECONDS = 2.0  # NVML's energy counter moves about every 100 ms: a window of 20 such steps or more


async def energy_window(bench: Bench, ref: str, sessions: Sequence[SessionInput],
                        meter: EnergyMeter) -> dict[str, float]:
    """Segments/s and J/segment of ``sessions`` served again and again for at least GPU_WINDOW_SECONDS.

    The energy is read once before and once after the whole window, so the sessions' opening and closing
    between the passes is in the joules (it is part of serving them); segments/s is over the pieces' time.
    """
    energy_before = meter.millijoules()
    steps, seconds = 0, 0.0
    while seconds < GPU_WINDOW_SECONDS:
        run = await served_pieces(bench.client, ref, sessions)
        steps, seconds = steps + run.steps, seconds + run.wall_seconds
    return energy_rates(meter.millijoules() - energy_before, steps, seconds)


async def run_gpu(bench: Bench, meter: EnergyMeter, described: list[dict[str, Any]]) -> dict[str, Any]:
    high = bench.counts.gpu_sessions
    on_gpu = [m for m in described if str(m.get("device", "cpu")).startswith("cuda")]
    results: dict[str, Any] = {"gpus": meter.names, "fraction_on_gpu": len(on_gpu) / len(described), "models": {}}
    for model in described:
        ref = f"{model['name']}:{model['version']}"
        sessions = gpu_sessions(bench, model, high)
        await served_pieces(bench.client, ref, sessions)  # warm-up, untimed
        row: dict[str, Any] = {"providers": model["providers"], "sessions_high": high}
        for count in (1, high):
            rates = [await energy_window(bench, ref, sessions[:count], meter) for _ in range(bench.repeats)]
            row[str(count)] = {key: median([rate[key] for rate in rates]) for key in rates[0]}
        row["joules_ratio"] = row[str(high)]["joules_per_segment"] / row["1"]["joules_per_segment"]
        results["models"][ref] = row
    return results
