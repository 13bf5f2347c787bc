"""Backends: one interface over ONNX Runtime, TorchScript and eager PyTorch.

A backend runs one graph of a model-repository entry on one device ("cpu" or
"cuda:N") in one precision (fp32, fp16, bf16): named numpy arrays in, named
numpy arrays out, names and dtypes from the entry's manifest. Whatever the
device and the precision setting, floating outputs come back as float32 numpy
arrays, so the rest of the service never sees either; the one exception is an
entry exported in fp16 (ONNX only), whose graphs take and return float16 end to
end, as its manifest declares, so that its state is stored at half the bytes.
torch is imported only by the
TorchScript and eager backends, so an ONNX-only service never loads it on the
hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from models.onnx_fp16 import to_float16
from service.devices import DeviceConfigError, device_index, torch_dtype
from service.runtime.device_states import STATE_HANDLE, DeviceStates

BACKENDS = ("onnx", "torchscript", "torch")


class Backend(Protocol):
    name: str
    device: str  # "cpu" or "cuda:N": where the graph runs (the batcher reads the GPU's energy by it)
    precision: str  # "fp32", "fp16" or "bf16"
    providers: list[str]

    def run(self, inputs: Mapping[str, np.ndarray], keep: Collection[str] = ()) -> dict[str, np.ndarray]:
        """``keep``: inputs the caller will pass again, as the very same array objects, unchanged (see
        :class:`DeviceCopies`)."""
        ...

    def drop_kept(self) -> None:
        """Free the device copies kept for ``keep`` inputs."""
        ...


class DeviceCopies:
    """Device copies of the inputs a caller passes again unchanged, made once instead of at every call.

    A decode step's fixed inputs (each document's encoder keys and values, its output layer: megabytes per
    row) are the same arrays from one step to the next until the batch re-forms; on a GPU, copying them to
    the device at every step would move more bytes than the step computes on. For a name in ``keep``,
    :meth:`get` reuses the device copy while the caller passes the very same array object and copies
    again when it passes another. The array is held with its copy, so ``is`` cannot match a new array at
    a recycled address. The caller must not change a kept array in place and pass that object again
    (:class:`~service.runtime.decode_loop.DecodeLoop` makes a new array, or view, at every change).
    """

    def __init__(self, to_device: Callable[[np.ndarray], Any]) -> None:
        self._to_device = to_device
        self._kept: dict[str, tuple[np.ndarray, Any]] = {}  # name -> (the caller's array, its device copy)
        self.bytes_copied = 0  # host-to-device bytes of the copies made

    def get(self, name: str, given: np.ndarray, array: np.ndarray) -> Any:
        """The device copy of ``array`` (``given`` coerced to the graph's dtype) for input ``name``."""
        kept = self._kept.get(name)
        if kept is not None and kept[0] is given:
            return kept[1]
        copy = self._to_device(array)
        self.bytes_copied += array.nbytes
        self._kept[name] = (given, copy)
        return copy

    def clear(self) -> None:
        self._kept.clear()


def onnx_providers_for(device: str) -> list[Any]:
    """ONNX Runtime providers for ``device``: the CPU alone, or CUDA device N then the CPU."""
    if device == "cpu":
        return ["CPUExecutionProvider"]
    import onnxruntime as ort

    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise DeviceConfigError(
            f"{device} asked of the onnx backend but onnxruntime has no CUDAExecutionProvider (providers "
            f"{available}): install onnxruntime-gpu (`make ORT=gpu`) or set RTSERVE_DEVICE=cpu"
        )
    return [("CUDAExecutionProvider", {"device_id": device_index(device)}), "CPUExecutionProvider"]


def fp16_onnx_model(path: str | Path) -> bytes:
    """The graph at ``path`` with float16 weights and arithmetic, its inputs and outputs still float32."""
    import onnx

    return to_float16(onnx.load(str(path)), keep_io_types=True).SerializeToString()


def onnx_session(
    path: str | Path, intra_op_threads: int = 0, device: str = "cpu", precision: str = "fp32", spinning: bool = False
) -> Any:
    """An ONNX Runtime session with full graph optimization on ``device``, fp32 or (converted) fp16.

    ``spinning``: let the intra-op threads busy-wait between ops (ONNX Runtime's default). Off here by
    default: on a CPU that the event loop and other models share, spinning threads take the cores
    they need (measured with ``rtserve bench``: docs/serving.md)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = intra_op_threads
    if not spinning:  # idle pool threads sleep instead of busy-waiting for the next op
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers = onnx_providers_for(device)
    graph = fp16_onnx_model(path) if precision == "fp16" else str(path)
    session = ort.InferenceSession(graph, sess_options=options, providers=providers)
    if device != "cpu" and session.get_providers()[0] != "CUDAExecutionProvider":
        # ONNX Runtime falls back to the CPU when the CUDA provider cannot load (missing cuDNN, driver ...)
        raise DeviceConfigError(
            f"onnxruntime could not start the CUDA provider for {path} on {device} (see its log above); the "
            f"session got {session.get_providers()}. Fix the CUDA install or set RTSERVE_DEVICE=cpu"
        )
    return session


def _coerce(inputs: Mapping[str, np.ndarray], specs: list[dict[str, Any]]) -> list[np.ndarray]:
    """Inputs in manifest order and dtype; a missing name is a programming error worth a clear message."""
    arrays = []
    for spec in specs:
        if spec["name"] not in inputs:
            raise KeyError(f"graph input {spec['name']!r} missing; got {sorted(inputs)}")
        arrays.append(np.ascontiguousarray(inputs[spec["name"]], dtype=np.dtype(spec["dtype"])))
    return arrays


class OnnxBackend:
    """An ONNX Runtime session. On CUDA, inputs and outputs go through IO binding: each input is copied
    to the GPU once per batch (a ``keep`` input once while it stays the same array) and each output back
    to host memory, with no per-call provider round trip."""

    name = "onnx"

    def __init__(self, path: Path, graph: Mapping[str, Any], intra_op_threads: int = 0, device: str = "cpu",
                 precision: str = "fp32", convert: bool = True, spinning: bool = False) -> None:
        """``convert``: lower an fp32 graph to ``precision`` at load (False: the file is already in it)."""
        self.device, self.precision = device, precision
        self.session = onnx_session(path, intra_op_threads, device, precision if convert else "fp32", spinning)
        self.providers = list(self.session.get_providers())
        self.io_binding = device != "cpu"
        device_type = "cuda" if device.startswith("cuda") else "cpu"
        self.device_copies = DeviceCopies(lambda array: ort_value_on(array, device_type, device_index(device)))
        # the exporter drops inputs a graph never reads (e.g. the RAF state of a full-attention
        # SRformer): feed only what the session takes
        taken = {node.name for node in self.session.get_inputs()}
        self.input_specs = [spec for spec in graph["inputs"] if spec["name"] in taken]
        self.output_names = [spec["name"] for spec in graph["outputs"]]

    def run(self, inputs: Mapping[str, np.ndarray], keep: Collection[str] = ()) -> dict[str, np.ndarray]:
        outputs = self._run(inputs, keep)
        if STATE_HANDLE in inputs:  # ONNX Runtime keeps no state on the device: every row's is copied each step
            outputs[STATE_HANDLE] = np.zeros(np.asarray(inputs[STATE_HANDLE]).reshape(-1).shape[0], dtype=np.int64)
        return outputs

    def _run(self, inputs: Mapping[str, np.ndarray], keep: Collection[str] = ()) -> dict[str, np.ndarray]:
        arrays = _coerce(inputs, self.input_specs)
        if not self.io_binding:
            feed = {spec["name"]: array for spec, array in zip(self.input_specs, arrays, strict=True)}
            outputs = self.session.run(self.output_names, feed)
            return dict(zip(self.output_names, outputs, strict=True))
        binding = self.session.io_binding()
        for spec, array in zip(self.input_specs, arrays, strict=True):
            name = spec["name"]
            if name in keep:
                binding.bind_ortvalue_input(name, self.device_copies.get(name, inputs[name], array))
            else:
                binding.bind_cpu_input(name, array)  # ORT copies it to the session's device
        for name in self.output_names:
            binding.bind_output(name, "cpu")  # results land in host memory, as numpy
        self.session.run_with_iobinding(binding)
        return dict(zip(self.output_names, binding.copy_outputs_to_cpu(), strict=True))

    def drop_kept(self) -> None:
        self.device_copies.clear()


def ort_value_on(array: np.ndarray, device_type: str, device_id: int) -> Any:
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_numpy(array, device_type, device_id)


class _TorchModuleBackend:
    """Shared by TorchScript and eager: positional tensors in, tuple of tensors out.

    The module is moved to the device and cast to the precision once; each batch's inputs are
    moved once (floating ones cast, integer and bool ones unchanged; a ``keep`` input once while it
    stays the same array), its outputs come back as float32 numpy arrays.
    """

    name = "torch"

    def __init__(self, module: Any, graph: Mapping[str, Any], device: str = "cpu", precision: str = "fp32",
                 mode: str = "eager", largest_batch: int = 32, capture: Any = None,
                 device_states: DeviceStates | None = None) -> None:
        """``mode``: eager, graphs (captured CUDA graphs per batch bucket up to ``largest_batch``) or compile
        (:mod:`service.runtime.step_graphs`); ``capture``: the graphs' capture function (default: CUDA's);
        ``device_states``: where the rows' next states are kept on the device for callers that pass
        :data:`STATE_HANDLE` (:mod:`service.runtime.device_states`; None: never kept)."""
        self.state_outputs: dict[str, str] = dict(graph.get("state_outputs") or {})  # state input -> its output
        self.device_states = device_states if self.state_outputs else None
        self.device, self.precision = device, precision
        self.dtype = torch_dtype(precision)
        self.module = module.to(device=device, dtype=self.dtype) if precision != "fp32" else module.to(device)
        self.providers = ["CUDA" if device.startswith("cuda") else "CPU"]
        self.input_specs = list(graph["inputs"])
        self.output_names = [spec["name"] for spec in graph["outputs"]]
        self.copies_to_device = device != "cpu"  # on the CPU a tensor is a view of the array, nothing to keep
        self.device_copies = DeviceCopies(self._to_device)
        self.mode, self.graphs = mode, None
        self.call: Any = self.module
        if mode == "graphs":
            from service.runtime.step_graphs import StepGraphs, cuda_capture

            self.call = self.graphs = StepGraphs(self.module, largest_batch, capture or cuda_capture)
            self.providers.append("CUDA graphs")
        elif mode == "compile":
            from service.runtime.step_graphs import PaddedCompile

            self.call = PaddedCompile(self.module, largest_batch)
            self.providers.append("torch.compile")

    def warm(self, sample: Any) -> None:
        """Capture every batch bucket now on ``sample(rows)`` (host tensors), not at the first batches served."""
        if self.graphs is not None:
            import torch

            with torch.inference_mode():
                self.graphs.warm(lambda rows: [self._to_device(t.numpy()) for t in sample(rows)])

    def _to_device(self, array: np.ndarray) -> Any:
        import torch

        tensor = torch.from_numpy(array)
        dtype = self.dtype if tensor.is_floating_point() else tensor.dtype
        return tensor.to(self.device, dtype=dtype, non_blocking=True)

    def run(self, inputs: Mapping[str, np.ndarray], keep: Collection[str] = ()) -> dict[str, np.ndarray]:
        import torch

        arrays = _coerce(inputs, self.input_specs)
        handles = inputs.get(STATE_HANDLE)
        resident = None  # the rows' states where their last step left them, when every row's is kept
        if handles is not None and self.device_states is not None:
            resident = self.device_states.stacked(np.asarray(handles), list(self.state_outputs))
        tensors = []
        for spec, array in zip(self.input_specs, arrays, strict=True):
            name = spec["name"]
            if resident is not None and name in resident:
                tensors.append(resident[name])
            elif self.copies_to_device and name in keep:
                tensors.append(self.device_copies.get(name, inputs[name], array))
            else:
                tensors.append(self._to_device(array))
        with torch.inference_mode():
            outputs = self.call(*tensors)
            # a captured graph's outputs are its static buffers, overwritten by the next call: copied out here (to
            # the host from a GPU; on a CPU, where .cpu() is the tensor itself, by a copy)
            copy = self.graphs is not None and not self.copies_to_device
            host = {name: _host(tensor, copy) for name, tensor in zip(self.output_names, outputs, strict=True)}
            if handles is not None:
                host[STATE_HANDLE] = self._keep_states(dict(zip(self.output_names, outputs, strict=True)),
                                                       np.asarray(handles), resident is not None)
        return host

    def _keep_states(self, outputs: Mapping[str, Any], handles: np.ndarray, reused: bool) -> np.ndarray:
        """The batch's next states kept on the device, a handle per row (0s when none are kept); the handles the
        batch came with are dropped: their states have moved on."""
        rows = int(handles.reshape(-1).shape[0])
        if self.device_states is None:
            return np.zeros(rows, dtype=np.int64)
        if reused:
            self.device_states.forget(handles)
        return self.device_states.keep({state: outputs[out] for state, out in self.state_outputs.items()}, rows)

    def drop_kept(self) -> None:
        self.device_copies.clear()


def _host(tensor: Any, copy: bool) -> np.ndarray:
    """A float32 (floating) or same-dtype numpy array of ``tensor``, on the host."""
    host = (tensor.float() if tensor.is_floating_point() else tensor).cpu().numpy()
    return host.copy() if copy else host


class TorchScriptBackend(_TorchModuleBackend):
    name = "torchscript"

    def __init__(self, path: Path, graph: Mapping[str, Any], device: str = "cpu", precision: str = "fp32") -> None:
        import warnings

        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript; still loads
            module = torch.jit.load(str(path), map_location=device).eval()
        super().__init__(module, graph, device, precision)


class TorchBackend(_TorchModuleBackend):
    """Eager PyTorch, rebuilt from the entry's ``checkpoint/`` with the ``models`` code."""

    name = "torch"


def load_backends(
    entry: Path,
    manifest: Mapping[str, Any],
    backend: str,
    intra_op_threads: int = 0,
    device: str = "cpu",
    precision: str = "fp32",
    spinning: bool = False,
    step_mode: str = "auto",
    max_batch_size: int = 32,
    device_state_bytes: int = 0,
) -> dict[str, Backend]:
    """One backend per graph of the entry on a resolved ``device`` ("cpu", "cuda:N") in ``precision``;
    ``intra_op_threads`` > 0 caps each graph's CPU threads (0: each graph's own from its manifest, ONNX Runtime's
    default where it names none); ``spinning`` lets ONNX Runtime's busy-wait; ``step_mode`` (torch on CUDA: auto,
    eager, graphs, compile) and ``max_batch_size``, the largest batch bucket: :mod:`service.runtime.step_modes`;
    ``device_state_bytes``: the bound of the states kept on a CUDA device (:mod:`service.runtime.device_states`).

    An entry exported in fp16 (``rtserve export --fp16``: float16 inputs, outputs and state) runs as
    it is, in fp16, whether ``precision`` says fp32 (the default) or fp16.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    exported = manifest.get("precision", "fp32")
    if exported != "fp32":
        if precision not in ("fp32", exported):
            raise DeviceConfigError(
                f"{entry} was exported in {exported}; it cannot run in {precision}: export it in fp32 or set "
                f"its precision to {exported}"
            )
        precision = exported
    if backend != "onnx" and intra_op_threads > 0:
        import torch

        torch.set_num_threads(intra_op_threads)  # process-wide for torch
    if backend == "torch":
        return torch_backends(entry, manifest, device, precision, step_mode, max_batch_size,
                              device_states_on(device, device_state_bytes))
    loaded: dict[str, Backend] = {}
    for graph in manifest["graphs"]:
        file_name = graph["files"].get(backend)
        if file_name is None:
            raise FileNotFoundError(f"{entry} has no {backend} export of graph {graph['name']!r}")
        if backend == "onnx":
            # unset (0), a light graph keeps the one thread its export found enough on a CPU (export/exporter.py)
            threads = intra_op_threads or (int(graph.get("intra_op_threads", 0)) if device == "cpu" else 0)
            loaded[graph["name"]] = OnnxBackend(
                entry / file_name, graph, threads, device, precision, convert=exported == "fp32", spinning=spinning,
            )
        else:
            loaded[graph["name"]] = TorchScriptBackend(entry / file_name, graph, device, precision)
    return loaded


_DEVICE_STATES: dict[str, DeviceStates] = {}


def device_states_on(device: str, max_bytes: int) -> DeviceStates | None:
    """The one table of kept states of a CUDA ``device`` in this process (every model's graphs share its bound);
    None on a CPU, where a state's tensor is a view of its host array and nothing is copied to keep."""
    if not device.startswith("cuda") or max_bytes <= 0:
        return None
    table = _DEVICE_STATES.setdefault(device, DeviceStates(max_bytes))
    table.max_bytes = max_bytes
    return table


def torch_backends(entry: Path, manifest: Mapping[str, Any], device: str, precision: str, step_mode: str = "auto",
                   max_batch_size: int = 32, device_states: DeviceStates | None = None) -> dict[str, Backend]:
    """Eager PyTorch graphs rebuilt from the entry's checkpoint, each in the mode chosen for it on ``device``
    (:func:`service.runtime.step_modes.choose`); captured graphs are captured for every bucket here, at load."""
    import logging

    import torch

    from models.serving.servable import build_servable
    from service.runtime.step_modes import choose, read_record

    servable = build_servable(entry / "checkpoint", name=manifest["name"])
    record = read_record(entry)
    loaded: dict[str, Backend] = {}
    for spec in manifest["graphs"]:
        graph = servable.graph(spec["name"])
        choice = choose(step_mode, spec, device, record)
        backend = TorchBackend(graph.module, spec, device, precision, choice.mode, max_batch_size,
                               device_states=device_states)
        if choice.mode == "graphs":
            generator = torch.Generator().manual_seed(0)
            backend.warm(lambda rows, graph=graph, generator=generator: graph.sample_inputs(rows, generator))
        logging.getLogger(__name__).info("%s %s: %s (%s)", manifest["name"], spec["name"], choice.mode, choice.why)
        loaded[spec["name"]] = backend
    return loaded
