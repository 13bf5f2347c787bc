"""loadtest/bench_runs.py: every Triton-side report in one table, one row per report, read off the reports' JSON."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest import bench_runs


def side(cpu: float, rate: float) -> dict[str, float]:
    return {"server_cpu_ms_per_piece": cpu, "pieces_per_second": rate}


def rsa_row(triton_cpu: float, stream: float, binary: float, http: float, rate: float) -> dict:
    return {
        "sides": {"triton-0ms": side(triton_cpu, 1000.0), "triton-0ms-binary": side(triton_cpu, 1000.0),
                  "rtserve-ws": side(stream * triton_cpu, rate * 1000)},
        "ratios": {
            "rtserve-ws/triton-0ms": {"server_cpu_ms_per_piece": stream, "pieces_per_second": rate},
            "rtserve-ws-binary/triton-0ms-binary": {"server_cpu_ms_per_piece": binary, "pieces_per_second": rate + 0.1},
            "rtserve-http/triton-0ms": {"server_cpu_ms_per_piece": http, "pieces_per_second": 0.9},
        },
    }


def report(path: Path, cpu: str, triton_cpu: float, stream: float, with_rmt: bool = True,
           pace: dict | None = None) -> Path:
    models = {"forecast": {"sessions": {"16": rsa_row(triton_cpu, stream, 0.7, 1.1, 1.2),
                                        "32": rsa_row(triton_cpu, stream + 0.05, 0.75, 1.2, 1.3)}}}
    if with_rmt:
        models["classify"] = {"sessions": {
            count: {"sides": {}, "ratios": {"rtserve-ws/triton-0ms": {"server_cpu_ms_per_piece": value}}}
            for count, value in (("16", 0.98), ("32", 1.04))}}
    machine = {"cpu": cpu, "cores": 2, "platform": "Linux", "python": "3.11"} | ({"pace": pace} if pace else {})
    path.write_text(json.dumps({"machine": machine, "scenarios": {"triton": {"models": models}}}))
    return path


def test_one_row_per_report_fastest_machine_first_with_the_ratios_the_targets_read(tmp_path):
    slow = report(tmp_path / "bench-amd-epyc-2c-run3.json", "AMD EPYC", 1.2, 0.95,
                  pace={"before": {"python_s": 1.97, "step_ms_per_row": 0.25},
                        "after": {"python_s": 0.88, "step_ms_per_row": None}})
    fast = report(tmp_path / "bench-intel-xeon-processor-2c.json", "Intel(R) Xeon(R) Processor", 0.4, 0.75,
                  with_rmt=False)
    sweep = tmp_path / "bench-sweep.json"
    sweep.write_text(json.dumps({"machine": {"cpu": "x", "cores": 2}, "scenarios": {"sweep": {}}}))
    lines = bench_runs.table([slow, sweep, fast], links_from=tmp_path).splitlines()
    assert lines[2] == ("| [Intel Xeon #1](bench-intel-xeon-processor-2c.md) | 0.40 / 0.40 | 0.75 / 0.80 | 0.70 / 0.75 "
                        "| 1.10 / 1.20 | 1.30 / 1.40 | – / – | – / – | – / – |")
    assert lines[3] == ("| [AMD EPYC #3](bench-amd-epyc-2c-run3.md) | 1.20 / 1.20 | 0.95 / 1.00 | 0.70 / 0.75 "
                        "| 1.10 / 1.20 | 1.30 / 1.40 | 0.98 / 1.04 | 1.97 / 0.88 | 0.250 / – |")
    summary = " ".join(lines[5:-1])
    assert "2 reports. Ranges: over a stream 0.75-1.00, with binary frames 0.70-0.75" in summary
    assert "RMT over a stream 0.98-1.04" in summary and all(len(line) <= 120 for line in lines[5:])
    assert lines[-1] == "Without the Triton side: bench-sweep.json."


def test_a_cpu_named_with_its_clock_is_labelled_as_one_named_without(tmp_path):
    path = report(tmp_path / "bench-intel-xeon-2c-run4.json", "Intel(R) Xeon(R) Processor @ 2.00GHz", 1.8, 1.1)
    assert bench_runs.table([path], links_from=tmp_path).splitlines()[2].startswith(
        "| [Intel Xeon #4](bench-intel-xeon-2c-run4.md) | 1.80 / 1.80 |")


def test_the_command_prints_the_table_of_the_reports_given(tmp_path, capsys):
    path = report(tmp_path / "bench-amd-epyc-2c.json", "AMD EPYC", 0.5, 0.8)
    assert bench_runs.main([str(path)]) == 0
    assert "| AMD EPYC #1 (bench-amd-epyc-2c.md) | 0.50 / 0.50 | 0.80 / 0.85 |" in capsys.readouterr().out


def test_the_table_in_serving_md_is_the_one_the_reports_in_docs_give():
    """docs/serving.md quotes every Triton-side report; a report added or replaced without the table regenerated fails
    here (`python -m loadtest.bench_runs docs/bench-*.json --links-from docs`)."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    table = bench_runs.table(sorted(docs.glob("bench-*.json")), links_from=docs)
    assert table in (docs / "serving.md").read_text()
