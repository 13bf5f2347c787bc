"""loadtest/machine_pace.py: how fast the machine runs, taken by the bench before and after its run."""

from __future__ import annotations

import json

from loadtest import machine_pace
from loadtest.bench import forecaster_step
from loadtest.bench_report import pace_lines


def test_the_pace_times_the_interpreter_and_the_forecasters_step_in_cpu_time(forecast_repository):
    folder, _ = forecast_repository
    step = forecaster_step(folder, "no-such-model")  # not named: the first RSA forecaster, as the bench picks it
    assert step is not None and step.name == "step.onnx" and step.parent.parent.name == "rsa-tiny"
    assert machine_pace.python_seconds(200_000) > 0
    cost = machine_pace.step_ms_per_row(step, rows=4, calls=5)
    assert 0 < cost < 1000
    # more rows stacked cost more CPU in all, not per row: the figure is per row of the batch
    assert machine_pace.step_ms_per_row(step, rows=16, calls=5) < 16 * cost


def test_a_repository_without_a_forecaster_gives_the_interpreters_pace_alone(classify_repository, tmp_path):
    folder, _ = classify_repository
    assert forecaster_step(folder, "rsa-etth1-h24") is None
    assert machine_pace.pace(None)["step_ms_per_row"] is None
    # a forecaster whose graph file is missing (a carried copy) or unreadable: the step is left out, the run goes on
    entry = tmp_path / "rsa-carried" / "1"
    entry.mkdir(parents=True)
    (entry / "manifest.json").write_text(json.dumps({"name": "rsa-carried", "task": "forecast", "family": "rsa",
                                                     "graphs": [{"name": "step", "files": {"onnx": "step.onnx"}}]}))
    assert forecaster_step(tmp_path, "rsa-carried") is None
    (entry / "step.onnx").write_bytes(b"not a graph")
    assert forecaster_step(tmp_path, "rsa-carried") == entry / "step.onnx"
    assert machine_pace.pace(entry / "step.onnx")["step_ms_per_row"] is None


def test_a_pace_that_moved_during_the_run_is_said_and_one_that_held_is_not():
    before = {"python_s": 1.0, "step_ms_per_row": 0.2}
    assert machine_pace.drift_note(before, {"python_s": 1.1, "step_ms_per_row": 0.21}) is None
    moved = machine_pace.drift_note(before, {"python_s": 0.5, "step_ms_per_row": 0.21})
    assert moved is not None and "Python additions s 1 -> 0.5" in moved and "step" not in moved.split(":")[0]
    assert machine_pace.drift_note(before, {"python_s": 1.0, "step_ms_per_row": None}) is None


def test_the_report_gives_the_pace_before_and_after_and_nothing_where_it_was_not_taken():
    pace = {"before": {"python_s": 0.88, "step_ms_per_row": 0.185}, "after": {"python_s": 0.8, "step_ms_per_row": 0.19}}
    [line] = pace_lines(json.loads(json.dumps(pace)))
    assert line.startswith("Pace, before / after the run: ten million Python additions 0.88 / 0.8 s of CPU")
    assert "0.185 / 0.19 ms of CPU a row" in line
    without_step = {"before": {"python_s": 1.0, "step_ms_per_row": None}, "after": {"python_s": 1.0,
                                                                                "step_ms_per_row": None}}
    assert "step" not in pace_lines(without_step)[0] and pace_lines(None) == []
