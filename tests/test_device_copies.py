"""Inputs a caller passes again unchanged (``keep``) are copied to the device once, and never served stale.

The GPU path of both backends (ONNX Runtime's IO binding, torch's device tensors), run here with the
device copies made on the CPU: the same answers as a plain call, no second copy of the same array, a
fresh copy for a new one.
"""

import json

import numpy as np
import pytest
import torch

from models.serving.servable import build_servable
from service.runtime.backends import load_backends


@pytest.fixture(scope="module")
def entry(tiny_models):
    return tiny_models.entry("rsa-tiny", formats=("onnx",))


def sample(entry, rows=3):
    graph = build_servable(entry / "checkpoint").graph("step")
    generator = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
    return {s.name: t.numpy() for s, t in zip(graph.inputs, graph.sample_inputs(rows, generator), strict=True)}


@pytest.mark.parametrize("backend_name", ["onnx", "torch"])
def test_a_kept_input_is_copied_once_and_a_new_array_is_copied_again(entry, backend_name):
    manifest = json.loads((entry / "manifest.json").read_text())
    backend = load_backends(entry, manifest, backend_name)["step"]
    if backend_name == "onnx":
        backend.io_binding = True  # the CUDA path: bound inputs, kept ones as OrtValues made once
    else:
        backend.copies_to_device = True  # the CUDA path: kept device tensors
    inputs = sample(entry)
    floating = [name for name, array in inputs.items() if np.issubdtype(array.dtype, np.floating)]
    kept = max(floating, key=lambda name: inputs[name].nbytes)  # the biggest, as a document's encoder memory
    plain = backend.run(inputs)

    def same(got, expected):
        for name, value in expected.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)

    same(backend.run(inputs, keep={kept}), plain)
    copied = backend.device_copies.bytes_copied
    assert copied == inputs[kept].nbytes
    same(backend.run(inputs, keep={kept}), plain)  # the same array object: no second copy
    assert backend.device_copies.bytes_copied == copied

    changed = dict(inputs, **{kept: inputs[kept] * 1.5 + 0.25})  # a new array, other values
    expected = backend.run(changed)
    assert not all(np.array_equal(expected[name], plain[name]) for name in plain)  # the input matters
    same(backend.run(changed, keep={kept}), expected)  # copied again, not the stale copy
    assert backend.device_copies.bytes_copied == 2 * copied

    backend.drop_kept()
    same(backend.run(changed, keep={kept}), expected)
    assert backend.device_copies.bytes_copied == 3 * copied
