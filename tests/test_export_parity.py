"""Exported graphs (ONNX Runtime, TorchScript) against a freshly built eager model.

Three chained steps on fresh random inputs, batch sizes 1 and 4, fp32,
max abs difference <= 1e-4 (DESIGN: state is carried from step to step).
"""

import json

import numpy as np
import onnx
import pytest
import torch

from export.exporter import export_checkpoint
from models.serving.servable import build_servable
from service.runtime.backends import load_backends
from tests.tiny_checkpoints import tiny_srformer

TOLERANCE = 1e-4


BOTH = ("onnx", "torchscript")


@pytest.fixture(scope="module")
def forecaster_entry(tiny_models):
    return tiny_models.checkpoint("rsa-tiny"), tiny_models.entry("rsa-tiny", formats=BOTH)


def test_entry_holds_graphs_manifest_and_state_spec(forecaster_entry):
    checkpoint, entry = forecaster_entry
    manifest = json.loads((entry / "manifest.json").read_text())
    assert entry.parts[-2:] == ("rsa-tiny", "1")
    assert manifest["task"] == "forecast" and manifest["family"] == "rsa"
    assert len(manifest["source_checkpoint_sha256"]) == 64
    assert [s["name"] for s in manifest["state_spec"]] == ["window", "rows_seen"]
    step = manifest["graphs"][0]
    assert step["name"] == "step" and set(step["files"]) == {"onnx", "torchscript"}
    assert step["dynamic_axes"]["values"] == {"0": "batch", "1": "rows"}
    assert step["state_outputs"] == {"window": "next_window", "rows_seen": "next_rows_seen"}
    onnx.checker.check_model(onnx.load(str(entry / step["files"]["onnx"])), full_check=True)
    assert (entry / "checkpoint" / "model.safetensors").exists()


SHARED = {"forecast": "rsa-tiny", "classify": "rmt-tiny", "summarize": "srformer-tiny"}  # the run's tiny models
VARIANTS = {"summarize-post-ln": lambda folder: tiny_srformer(folder / "srformer-post-tiny", norm_position="post"),
            "summarize-kernel": lambda folder: tiny_srformer(folder / "srformer-kernel-tiny", recurrent_norm="kernel")}


@pytest.fixture(scope="module", params=sorted([*SHARED, *VARIANTS]))
def family_entry(request, tiny_models, tmp_path_factory):
    if request.param in SHARED:
        name = SHARED[request.param]
        return tiny_models.checkpoint(name), tiny_models.entry(name, formats=BOTH)
    root = tmp_path_factory.mktemp(request.param)
    checkpoint = VARIANTS[request.param](root / "weights")
    return checkpoint, export_checkpoint(checkpoint, root / "repository")


@pytest.mark.parametrize("backend", ["onnx", "torchscript"])
@pytest.mark.parametrize("batch", [1, 4])
def test_every_exported_graph_matches_a_fresh_eager_model_over_chained_steps(family_entry, backend, batch):
    checkpoint, entry = family_entry
    manifest = json.loads((entry / "manifest.json").read_text())
    exported = load_backends(entry, manifest, backend)
    servable = build_servable(checkpoint)  # built after export: the exporter must not leave traces
    generator = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
    for graph in servable.graphs:
        carried: dict[str, torch.Tensor] = {}
        for _ in range(3):  # state outputs feed the next step; every other input is fresh
            fresh = dict(zip([spec.name for spec in graph.inputs], graph.sample_inputs(batch, generator), strict=True))
            inputs = {name: carried.get(name, tensor) for name, tensor in fresh.items()}
            assert all(t.float().abs().sum() > 0 for n, t in inputs.items() if t.is_floating_point()), "zeros"
            got = exported[graph.name].run({name: tensor.numpy() for name, tensor in inputs.items()})
            with torch.no_grad():
                expected = graph.module(*inputs.values())
            for spec, reference in zip(graph.outputs, expected, strict=True):
                np.testing.assert_allclose(got[spec.name], reference.numpy(), atol=TOLERANCE, rtol=0,
                                           err_msg=f"{graph.name}.{spec.name}")
            outputs = {spec.name: tensor for spec, tensor in zip(graph.outputs, expected, strict=True)}
            carried = {name: outputs[output] for name, output in graph.state_outputs.items()}


FP16_RELATIVE_TOLERANCE = 2e-3  # of the output's largest magnitude; fp16 has an 11-bit mantissa


def test_fp16_onnx_export_stays_within_its_stated_tolerance(forecaster_entry, tmp_path):
    checkpoint, _ = forecaster_entry
    entry = export_checkpoint(checkpoint, tmp_path / "fp16", formats=("onnx",), fp16=True)
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["precision"] == "fp16"
    assert {s["dtype"] for s in manifest["graphs"][0]["inputs"]} == {"float16", "int64"}
    exported = load_backends(entry, manifest, "onnx")["step"]
    eager = build_servable(checkpoint).graph("step")
    sample = eager.sample_inputs(4, torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,)))))
    got = exported.run({spec.name: t.numpy() for spec, t in zip(eager.inputs, sample, strict=True)})
    with torch.no_grad():
        expected = eager.module(*sample)
    reference = expected[2].numpy()
    error = np.abs(got["forecast"].astype(np.float64) - reference).max()
    assert error <= FP16_RELATIVE_TOLERANCE * np.abs(reference).max(), error


def test_fp16_is_refused_for_torchscript(forecaster_entry, tmp_path):
    with pytest.raises(ValueError, match="fp16 is an ONNX option"):
        export_checkpoint(forecaster_entry[0], tmp_path / "x", formats=("onnx", "torchscript"), fp16=True)


@pytest.mark.slow
def test_a_full_attention_summarizer_whose_graph_drops_unused_inputs_still_runs(tmp_path):
    """Full cross-attention never reads the RAF state; the exporter prunes those inputs."""
    checkpoint = tiny_srformer(tmp_path / "weights" / "srformer-full", mode="full")
    entry = export_checkpoint(checkpoint, tmp_path / "repository", formats=("onnx",))
    manifest = json.loads((entry / "manifest.json").read_text())
    decode = load_backends(entry, manifest, "onnx")["decode_step"]
    graph = build_servable(checkpoint).graph("decode_step")
    sample = graph.sample_inputs(2, torch.Generator().manual_seed(3))
    got = decode.run({spec.name: t.numpy() for spec, t in zip(graph.inputs, sample, strict=True)})
    with torch.no_grad():
        expected = graph.module(*sample)
    np.testing.assert_allclose(got["logp"], expected[0].numpy(), atol=TOLERANCE, rtol=0)


@pytest.mark.slow
async def test_an_fp16_summarizer_export_summarizes_on_the_cpu_provider(tmp_path):
    """ONNX Runtime's CPU provider has no float16 ScatterElements with reduction "add" (the copy
    distribution): the fp16 export keeps that op in float32, its casts sorted into place."""
    from service.runtime.pipeline import run_whole
    from service.runtime.registry import load_model
    from service.settings import Settings

    checkpoint = tiny_srformer(tmp_path / "weights" / "srformer-half")
    entry = export_checkpoint(checkpoint, tmp_path / "repository", formats=("onnx",), fp16=True)
    manifest = json.loads((entry / "manifest.json").read_text())
    decode = next(graph for graph in manifest["graphs"] if graph["name"] == "decode_step")
    scatter = [node for node in onnx.load(str(entry / decode["files"]["onnx"])).graph.node
               if node.op_type == "ScatterElements"]
    assert scatter and manifest["precision"] == "fp16"
    model = load_model(entry, "onnx", Settings(model_repository=tmp_path / "repository"))
    text = "The council voted to close the library on Sundays. Residents said the cut would hurt students. " * 3
    _, finished = await run_whole(model.pipeline, text, options={"max_length": 12})
    assert 0 < finished.result["summary_tokens"] <= 12 and finished.result["summary"]
    for runner in model.batchers.values():
        await runner.close()


def test_a_light_graph_runs_on_one_thread_unless_a_setting_says_otherwise(forecaster_entry, tiny_models,
                                                                           monkeypatch, tmp_path):
    from export import exporter

    summarizer = json.loads((tiny_models.entry("srformer-tiny") / "manifest.json").read_text())
    decode = next(graph for graph in summarizer["graphs"] if graph["axis_masks"])
    assert decode["intra_op_threads"] == 0  # a decode graph batches many rows that each read a whole document
    head = next(graph for graph in summarizer["graphs"] if graph["name"] == "output_head")
    assert head["intra_op_threads"] == 0  # served for a document's candidates, far more than its sample's
    _, entry = forecaster_entry
    manifest = json.loads((entry / "manifest.json").read_text())
    step = manifest["graphs"][0]
    # the export timed the tiny RSA step on this machine: one thread where it was light, the pool if the
    # machine was too busy for one thread to keep up (the decision itself is checked below, on set timings)
    assert step["intra_op_threads"] in (0, 1)
    step["intra_op_threads"] = 1  # as the export writes it for a light graph

    def threads(intra_op_threads):
        backend = load_backends(entry, manifest, "onnx", intra_op_threads)["step"]
        return backend.session.get_session_options().intra_op_num_threads

    assert threads(0) == 1 and threads(3) == 3  # the manifest's 1, unless RTSERVE_INTRA_OP_THREADS is set
    graph = build_servable(forecaster_entry[0]).graphs[0]
    path = entry / step["files"]["onnx"]

    def timed(one_thread, pool, batched_one_thread=None, batched_pool=None):
        def milliseconds(_path, _graph, rows, _runs, threads=(1, 0)):
            timed = {1: one_thread, 0: pool} if rows == 1 else {1: batched_one_thread, 0: batched_pool}
            return [timed[count] for count in threads]

        monkeypatch.setattr(exporter, "thread_milliseconds", milliseconds)
        return exporter.light_graph_threads(path, graph)

    assert timed(0.2, 0.3, 2.0, 2.1) == 1  # light: one thread no slower than the pool, alone or batched
    assert timed(0.5, 0.9, 5.2, 4.6) == 1  # the pool a tenth faster on a batch: not worth its CPU
    assert timed(0.2, 0.3, 2.0, 1.0) == 0  # the pool runs a batch of 16 twice as fast
    assert timed(0.4, 0.2, 2.0, 2.1) == 0  # the pool runs a batch of one twice as fast
    assert timed(3.0, 3.0, 30.0, 30.0) == 0  # slower than LIGHT_GRAPH_MS on one thread: the pool
    monkeypatch.setattr(exporter, "LIGHT_GRAPH_MS", 1e-6)
    assert timed(0.2, 0.3, 2.0, 2.1) == 0
    # `rtserve export --cpu-threads N` writes N instead of timing (an export on another or a busy machine)
    written = exporter.export_checkpoint(forecaster_entry[0], tmp_path, formats=("onnx",), cpu_threads=3)
    assert json.loads((written / "manifest.json").read_text())["graphs"][0]["intra_op_threads"] == 3


def test_a_heavy_graph_s_cpu_batches_stop_where_its_rows_cost_more(tiny_models, monkeypatch, tmp_path):
    """The export times a heavy graph's CPU per row at batches of 4, 8, 16 and 32 (inputs shaped as served) and caps
    its CPU batch at the size whose row costs least; loaded on a CPU its batcher stops there, unless the model's
    RTSERVE_MODEL_MAX_BATCH_SIZES entry says otherwise."""
    from export import exporter
    from service.runtime.registry import load_model
    from service.settings import Settings

    assert exporter.batch_cap({4: 57.1, 8: 56.0, 16: 58.9, 32: 66.7}) == 8  # a row at 32 costs 19 % more than at 8
    assert exporter.batch_cap({4: 20.1, 8: 19.5, 16: 19.2, 32: 20.4}) == 16
    assert exporter.batch_cap({4: 18.4, 8: 19.2, 16: 20.6, 32: 21.4}) == 4
    assert exporter.batch_cap({4: 3.0, 8: 2.0, 16: 1.0, 32: 1.0}) is None  # the larger of two that cost the same
    assert exporter.batch_cap({4: 4.0, 8: 2.0, 16: 1.0, 32: 0.9}) is None  # larger batches cheaper per row

    servable = build_servable(tiny_models.checkpoint("rmt-tiny"))
    graph, entry = servable.graphs[0], tiny_models.entry("rmt-tiny")
    costs = exporter.cpu_ms_per_row(entry / "step.onnx", graph, 0, sizes=(1, 2), runs=1)  # timed, on full segments
    assert set(costs) == {1, 2} and all(ms > 0 for ms in costs.values())
    assert graph.served_inputs(2, torch.Generator())[1].shape[1] == servable.settings["segment_size"]
    assert exporter.cpu_batch_cap(entry / "step.onnx", graph, 1) == (None, None)  # a light graph is not timed
    given = json.loads((entry / "manifest.json").read_text())["graphs"][0]
    assert given["cpu_max_batch_size"] is None and given["cpu_ms_per_row"] is None  # exported with threads given

    # the export's wiring and the service's cap, on the tiny forecaster's step (the quickest to export), timed as
    # if it were heavy
    seen = []

    def timed(_path, timed_graph, threads):
        seen.append((timed_graph.name, threads))
        return {4: 57.1, 8: 56.0, 16: 55.2, 32: 66.7}

    monkeypatch.setattr(exporter, "cpu_ms_per_row", timed)
    monkeypatch.setattr(exporter, "light_graph_threads", lambda _path, _graph: 0)
    entry = exporter.export_checkpoint(tiny_models.checkpoint("rsa-tiny"), tmp_path, formats=("onnx",))
    step = json.loads((entry / "manifest.json").read_text())["graphs"][0]
    assert seen == [("step", 0)] and step["cpu_max_batch_size"] == 16
    assert step["cpu_ms_per_row"] == {"4": 57.1, "8": 56.0, "16": 55.2, "32": 66.7}

    def largest(settings):
        model = load_model(entry, "onnx", settings)
        return model.batchers["step"].max_batch_size, model.max_batch_size

    assert largest(Settings(device="cpu")) == (16, 16)
    assert largest(Settings(device="cpu", max_batch_size=8)) == (8, 8)  # the smaller of the two
    assert largest(Settings(device="cpu", model_max_batch_sizes={"rsa-tiny": 32})) == (32, 32)  # the model's own
