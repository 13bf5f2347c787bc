"""Captured step graphs, tested on a CPU with the stand-in capture: batch buckets, padding, static buffers, the
fallbacks, and which mode each graph runs in (measured record, setting, device). The CUDA captures themselves:
tests/test_cuda_graphs.py, on a GPU host."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from models.serving.servable import build_servable
from service.runtime.backends import TorchBackend, load_backends
from service.runtime.step_graphs import MAX_SHAPES, StepGraphs, batch_buckets, bucket_for, pad_rows, stand_in_capture
from service.runtime.step_modes import RECORD, choose, fastest, read_record, write_record
from tests.test_precision import FAMILIES


def test_buckets_are_powers_of_two_up_to_the_largest_batch():
    assert batch_buckets(32) == [1, 2, 4, 8, 16, 32] and batch_buckets(48) == [1, 2, 4, 8, 16, 32, 48]
    assert batch_buckets(1) == [1]
    assert [bucket_for(rows, batch_buckets(48)) for rows in (1, 3, 8, 33, 48, 49)] == [1, 4, 8, 48, 48, None]


def test_padding_repeats_a_real_row():
    rows = torch.randn(3, 4)
    padded = pad_rows(rows, 8)
    assert padded.shape == (8, 4) and torch.equal(padded[:3], rows) and torch.equal(padded[3:], rows[:1].expand(5, 4))


def step_cases(family: str, tmp_path):
    servable = build_servable(FAMILIES[family](tmp_path))
    return [graph for graph in servable.graphs if graph.name != "decode_step"]


@pytest.mark.parametrize("family", ["rsa", pytest.param("rmt", marks=pytest.mark.slow),
                                    pytest.param("srformer", marks=pytest.mark.slow)])
def test_replayed_graphs_answer_as_the_eager_step_for_every_batch_size_in_any_order(family, tmp_path):
    generator = torch.Generator().manual_seed(0)
    for graph in step_cases(family, tmp_path):
        graphed = StepGraphs(graph.module, 8, stand_in_capture)
        with torch.inference_mode():
            for rows in (5, 1, 8, 3, 12, 5, 2):  # 12: above the largest bucket, eagerly
                inputs = graph.sample_inputs(rows, generator)
                expected = graph.module(*inputs)
                got = graphed(*inputs)
                for name, want, have in zip([s.name for s in graph.outputs], expected, got, strict=True):
                    assert have.shape == want.shape, (graph.name, name, rows)
                    torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5, msg=f"{graph.name}.{name} {rows}")
        assert graphed.eager_calls == 1 and graphed.replays == 6 and graphed.failure is None


def test_a_shape_past_the_limit_and_a_failed_capture_run_eagerly():
    graphed = StepGraphs(lambda x: (x * 2,), 4, stand_in_capture)
    with torch.inference_mode():
        for width in range(1, MAX_SHAPES + 3):  # each width of the other axis is a capture of its own
            x = torch.randn(3, width)
            torch.testing.assert_close(graphed(x)[0], x * 2)
    assert graphed.shapes() == MAX_SHAPES and graphed.eager_calls == 2 and graphed.replays == MAX_SHAPES

    def refuse(module, inputs, pool):
        raise RuntimeError("operation not permitted when stream is capturing")

    module = torch.nn.Linear(3, 2)
    failing = StepGraphs(lambda x: (module(x),), 4, refuse)
    with torch.inference_mode():
        x = torch.randn(3, 3)
        torch.testing.assert_close(failing(x)[0], module(x))
    assert failing.failure and "not permitted" in failing.failure and failing.eager_calls == 1


def test_warming_captures_every_bucket_at_one_shape_of_the_other_axes(tmp_path):
    """The samples a graph draws differ in their other axes from draw to draw (a forecaster's piece of any length):
    warming captures each bucket on the rows of one draw, so one shape, not one per bucket."""
    (graph,) = step_cases("rsa", tmp_path)
    generator = torch.Generator().manual_seed(0)
    lengths = {graph.sample_inputs(1, generator)[2].shape[1] for _ in range(8)}
    assert len(lengths) > 1  # else this test would not tell a draw per bucket from one draw
    graphed = StepGraphs(graph.module, 8, stand_in_capture)
    with torch.inference_mode():
        graphed.warm(lambda rows: graph.sample_inputs(rows, generator))
    assert graphed.shapes() == 1 and graphed.replays == len(graphed.buckets) and graphed.eager_calls == 0


def test_the_backend_copies_a_graphs_outputs_out_before_the_next_call_overwrites_them(tmp_path):
    (graph,) = step_cases("rsa", tmp_path)
    spec = {"inputs": [s.as_dict() for s in graph.inputs], "outputs": [s.as_dict() for s in graph.outputs]}
    eager = TorchBackend(graph.module, spec)
    graphed = TorchBackend(graph.module, spec, mode="graphs", largest_batch=8, capture=stand_in_capture)
    assert graphed.providers == ["CPU", "CUDA graphs"]
    generator = torch.Generator().manual_seed(1)
    calls = [{s.name: t.numpy() for s, t in zip(graph.inputs, graph.sample_inputs(rows, generator), strict=True)}
             for rows in (3, 3, 6)]
    answers = [graphed.run(inputs) for inputs in calls]  # kept across calls, as a batcher's callers keep them
    for inputs, answer in zip(calls, answers, strict=True):
        for name, want in eager.run(inputs).items():
            np.testing.assert_allclose(answer[name], want, rtol=1e-5, atol=1e-5)
    assert graphed.graphs is not None and graphed.graphs.replays == 3


def test_the_mode_is_the_measured_fastest_unless_set_and_eager_on_a_cpu_or_for_a_decode_graph(tmp_path):
    step, decode = {"name": "step"}, {"name": "decode_step", "axis_masks": {"source": "source_mask"}}
    rates = {"eager": {"1": 280.0, "32": 6000.0}, "graphs": {"1": 900.0, "32": 9000.0}}
    assert fastest(rates) == "graphs"
    assert fastest({"eager": {"1": 10.0, "8": 80.0}, "graphs": {"1": 12.0, "8": 70.0}}) == "eager"
    record = write_record(tmp_path, "NVIDIA H200", "2.11.0+cu130", {"step": rates})
    assert read_record(tmp_path) == record and json.loads((tmp_path / RECORD).read_text())["graphs"]["step"]["mode"] \
        == "graphs"
    assert choose("auto", step, "cuda:0", record).mode == "graphs"
    assert choose("auto", step, "cuda:0", None).mode == "eager"
    assert choose("eager", step, "cuda:0", record).mode == "eager"
    assert choose("compile", step, "cuda:0", record).mode == "compile"
    assert choose("graphs", step, "cpu", record).mode == "eager"
    assert choose("graphs", decode, "cuda:0", record).mode == "eager"
    with pytest.raises(ValueError, match="unknown step mode"):
        choose("fast", step, "cuda:0", record)


def test_a_cpu_service_runs_its_torch_steps_eagerly_whatever_the_record(tiny_models):
    entry = tiny_models.entry("rsa-tiny", formats=())
    manifest = json.loads((entry / "manifest.json").read_text())
    write_record(entry, "NVIDIA H200", "2.11", {"step": {"eager": {"1": 1.0}, "graphs": {"1": 2.0}}})
    try:
        backends = load_backends(entry, manifest, "torch", step_mode="graphs", max_batch_size=8)
        assert all(b.mode == "eager" and b.providers == ["CPU"] for b in backends.values())  # type: ignore[attr-defined]
    finally:
        (entry / RECORD).unlink()
