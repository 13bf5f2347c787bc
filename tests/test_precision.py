"""fp16 and bf16 against fp32 on tiny models of every family, fresh random inputs.

Tolerances, per floating output, on the largest absolute difference relative to the largest
magnitude of the fp32 output (masked log-probabilities, -1e30, left out and required to stay
masked): fp16 <= 1e-2, bf16 <= 5e-2 (bf16 keeps 8 bits of mantissa, fp16 11). Integer outputs
must match exactly. Measured on the CPU; the trained models' figures are in docs/serving.md.
"""

import json

import numpy as np
import pytest
import torch

from models.serving.servable import build_servable
from service.runtime.backends import OnnxBackend, TorchBackend, load_backends
from tests.tiny_checkpoints import tiny_forecaster, tiny_rmt, tiny_srformer

TOLERANCE = {"fp16": 1e-2, "bf16": 5e-2, "fp32": 1e-4}  # fp32: on another device (tests/test_cuda.py)
MASKED = -1e29


def assert_close(reference: dict[str, np.ndarray], got: dict[str, np.ndarray], precision: str, where: str) -> None:
    for name, ref in reference.items():
        out = got[name]
        assert out.dtype == ref.dtype, f"{where}.{name}: {out.dtype} != {ref.dtype}"
        if not np.issubdtype(ref.dtype, np.floating):
            np.testing.assert_array_equal(out, ref, err_msg=f"{where}.{name}")
            continue
        keep = ref > MASKED
        assert (out[~keep] <= -6e4).all(), f"{where}.{name}: a masked entry came back unmasked"
        assert np.isfinite(out[keep]).all(), f"{where}.{name}: not finite in {precision}"
        scale = max(float(np.abs(ref[keep]).max()), 1e-6)
        worst = float(np.abs(out[keep] - ref[keep]).max()) / scale
        assert worst <= TOLERANCE[precision], f"{where}.{name}: {precision} off by {worst:.3g} of {scale:.3g}"


FAMILIES = {
    "rsa": lambda folder: tiny_forecaster(folder / "rsa-tiny", "rsa"),
    "rmt": lambda folder: tiny_rmt(folder / "rmt-tiny"),
    "srformer": lambda folder: tiny_srformer(folder / "srformer-tiny", mode="srformer"),
    "srformer-segmented": lambda folder: tiny_srformer(folder / "srformer-seg", mode="segmented"),
    "srformer-full-post-ln": lambda folder: tiny_srformer(folder / "srformer-full", mode="full",
                                                           norm_position="post"),
}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_torch_backend_in_lower_precision_matches_fp32(family, precision, tmp_path):
    servable = build_servable(FAMILIES[family](tmp_path))
    generator = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
    cases = []
    for graph in servable.graphs:  # every fp32 reference first: the graphs of a model share weights
        spec = {"inputs": [s.as_dict() for s in graph.inputs], "outputs": [s.as_dict() for s in graph.outputs]}
        inputs = {s.name: t.numpy() for s, t in zip(graph.inputs, graph.sample_inputs(4, generator), strict=True)}
        cases.append((graph, spec, inputs, TorchBackend(graph.module, spec).run(inputs)))
    for graph, spec, inputs, reference in cases:
        lowered = TorchBackend(graph.module, spec, "cpu", precision)
        assert next(graph.module.parameters()).dtype == getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[
            precision])
        assert_close(reference, lowered.run(inputs), precision, f"{family}.{graph.name}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["srformer", "segmented", "full"])
def test_srformer_decode_step_runs_in_half_precision(mode, dtype, tmp_path):
    """The decode_step runs in fp16 and bf16: a copy-continuation bias built in float32 would stop it ("expected
    scalar type Half but found Float"), and a -1e30 mask would overflow fp16."""
    graph = build_servable(tiny_srformer(tmp_path / "s", mode=mode)).graph("decode_step")
    inputs = graph.sample_inputs(2, torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference = graph.module(*inputs)
        lowered = graph.module.to(dtype)(*[t.to(dtype) if t.is_floating_point() else t for t in inputs])
    logp = lowered[0]
    assert logp.dtype == torch.float32 and torch.isfinite(logp).all()  # log-probabilities stay float32
    assert torch.equal(logp.argmax(dim=-1), reference[0].argmax(dim=-1)) or dtype == torch.bfloat16
    assert torch.equal(lowered[3], reference[3])  # the self-attention mask
    for got, expected in zip(lowered[4:], reference[4:], strict=True):  # the caches, in the module's dtype
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), expected, atol=5e-2 * expected.abs().max().item(), rtol=0)


@pytest.fixture(scope="module")
def rsa_entry(tiny_models):
    return tiny_models.entry("rsa-tiny", formats=("onnx",))


def test_onnx_fp16_conversion_matches_fp32_and_io_binding_matches_run(rsa_entry):
    manifest = json.loads((rsa_entry / "manifest.json").read_text())
    reference = load_backends(rsa_entry, manifest, "onnx")["step"]
    lowered = load_backends(rsa_entry, manifest, "onnx", precision="fp16")["step"]
    assert isinstance(lowered, OnnxBackend) and lowered.precision == "fp16" and lowered.device == "cpu"
    graph = build_servable(rsa_entry / "checkpoint").graph("step")
    generator = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
    inputs = {s.name: t.numpy() for s, t in zip(graph.inputs, graph.sample_inputs(4, generator), strict=True)}
    expected = reference.run(inputs)
    assert_close(expected, lowered.run(inputs), "fp16", "rsa.step")
    reference.io_binding = True  # the CUDA path's IO binding, run here on the CPU provider
    for name, value in reference.run(inputs).items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)
