"""Triton python-backend model: one exported rtserve step graph behind Triton's sequence batcher, its state kept
per correlation id in this process (the Triton side of ``rtserve bench --only triton``).

It runs inside Triton's python-backend stub, in the peer venv (numpy<2), never in rtserve's: it imports nothing
of rtserve except, for a text model, the text cutter (``models/text_stream.py``, numpy and ``tokenizers`` only).

One inference request = one piece of one sequence (rtserve: one ``POST /sessions/{id}/segments``). What it reads,
all from the rtserve model-repository entry named by the ``entry`` parameter:

- ``manifest.json``: the ``step`` graph's inputs and outputs; ``state_outputs`` maps each state input to the
  output that carries it to the next step (RSA: ``window``, ``rows_seen``; RMT: ``memory``). The other inputs
  are the piece's (RSA: ``values``; RMT: ``input_ids``, ``attention_mask``), the other outputs the answer's.
- ``initial_state.safetensors``: a new sequence's state, every array rtserve keeps for a session (RMT's includes
  the text cutter's pending text and ids).
- ``step.onnx``, run by ONNX Runtime (CPU, ``intra_op_threads``, inter-op 1, idle threads not spinning: rtserve's
  settings).

Inputs per request (batch dimension 1):
    the graph's piece inputs, as tensors (``text`` = "0"), or TEXT (BYTES [1, 1], ``text`` = "1"): the piece's
    text, cut into segments by the same cutter rtserve's classify pipeline runs, with the entry's tokenizer;
    START / END / CORRID: the sequence batcher's controls.
Outputs: the graph's answer outputs after this piece's last step (a rank-1 output is sent as [1, 1]), and STEPS
(INT64 [1, 1]): the graph steps this sequence has applied, for the client's order check.

Batching: the requests of one ``execute`` are stepped together, the k-th step of each piece in one ORT call per
shape of the piece inputs (rtserve's batcher stacks equal shapes too); two pieces of one sequence are never in
one call (the sequence batcher does not send them together; the code takes them in turn anyway).
START resets the state to the initial state; END drops it after the step; a piece for an unknown sequence
without START is an error. Nothing is durable: a restart of Triton loses every sequence.

Parameters (config.pbtxt): entry, intra_op_threads, text ("1": TEXT input), source_root (where ``models/`` is,
for the text cutter), cache_capacity (sequences kept at most, least recently used dropped first).
"""

import json
import os
import sys
from collections import OrderedDict
from typing import Any

# The stub embeds its own libpython in isolated mode (PYTHONPATH is ignored): the peer venv's site-packages
# (numpy, onnxruntime, safetensors, tokenizers) are put on sys.path here; the bench exports PEER_SITE_PACKAGES.
_SITE = os.environ.get("PEER_SITE_PACKAGES")
if _SITE and _SITE not in sys.path:
    sys.path.insert(0, _SITE)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

STEPS = "STEPS"
TEXT = "TEXT"


def _param(config: dict, key: str, default: str) -> str:
    value = (config.get("parameters") or {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


def _scalar(request: Any, name: str, default: int = 0) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


def _placeholder(spec: dict) -> np.ndarray:
    """Zeros of an answer output's shape (symbolic axes 0) for a piece that completed no step yet."""
    shape = [1] + [axis if isinstance(axis, int) else 0 for axis in spec["shape"][1:]]
    return np.zeros(shape, dtype=np.dtype(spec["dtype"]))


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        import onnxruntime as ort
        from safetensors.numpy import load_file

        config = json.loads(args["model_config"])
        entry = _param(config, "entry", "")
        manifest = json.load(open(os.path.join(entry, "manifest.json")))
        graph = next(g for g in manifest["graphs"] if g["name"] == "step")
        self.state_outputs = dict(graph["state_outputs"])  # state input -> the output carrying it on
        self.piece_inputs = [i["name"] for i in graph["inputs"] if i["name"] not in self.state_outputs]
        carried = set(self.state_outputs.values())
        self.answers = [o for o in graph["outputs"] if o["name"] not in carried]
        self.output_names = [*self.state_outputs.values(), *(o["name"] for o in self.answers)]
        self.initial = load_file(os.path.join(entry, "initial_state.safetensors"))  # every array of a session
        self.capacity = int(_param(config, "cache_capacity", "4096"))
        self.cutter = None
        if _param(config, "text", "0") == "1":
            sys.path.insert(0, _param(config, "source_root", ""))
            from tokenizers import Tokenizer

            from models.text_stream import SegmentCutter

            settings = manifest["settings"]
            tokenizer = Tokenizer.from_file(os.path.join(entry, manifest["assets"]["tokenizer"]))
            self.cutter = SegmentCutter(tokenizer, int(settings["segment_size"]), settings["max_segments"],
                                        int(settings["pending_bytes"]))
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(_param(config, "intra_op_threads", "0"))
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(os.path.join(entry, graph["files"]["onnx"]), sess_options=options,
                                            providers=["CPUExecutionProvider"])
        self.sequences = OrderedDict()  # corrid -> {"state": arrays, "answers": arrays, "steps": int}

    # ---- one sequence's state ----------------------------------------------------------------------------
    def _sequence(self, corrid: int, start: bool) -> dict | None:
        if start:
            sequence = {"state": dict(self.initial), "answers": None, "steps": 0}
            self.sequences[corrid] = sequence
            while len(self.sequences) > self.capacity:
                self.sequences.popitem(last=False)
            return sequence
        sequence = self.sequences.get(corrid)
        if sequence is not None:
            self.sequences.move_to_end(corrid)
        return sequence

    def _piece_steps(self, request: Any, sequence: dict) -> list[dict]:
        """The step inputs this piece gives (batch 1 each): one for tensors, one per completed segment for text."""
        if self.cutter is None:
            return [{name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.piece_inputs}]
        raw = pb_utils.get_input_tensor_by_name(request, TEXT).as_numpy().reshape(-1)[0]
        text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        sequence["state"], segments = self.cutter.feed(sequence["state"], text)
        return [{"input_ids": ids[None], "attention_mask": mask[None]} for ids, mask in segments]

    # ---- a batch of requests ---------------------------------------------------------------------------
    def execute(self, requests: list) -> list:
        responses = [None] * len(requests)
        pending = []  # (index, corrid, end, sequence), in arrival order
        for index, request in enumerate(requests):
            corrid = int(_scalar(request, "CORRID")) or int(request.correlation_id() or 0)
            sequence = self._sequence(corrid, int(_scalar(request, "START")) != 0)
            if sequence is None:
                responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"sequence {corrid}: no state (never started, ended, or evicted): send its first piece with "
                    "sequence_start"))
                continue
            pending.append((index, corrid, int(_scalar(request, "END")) != 0, sequence))
        while pending:  # rounds: at most one piece per sequence in a round
            taken, later, seen = [], [], set()
            for item in pending:
                (later if item[1] in seen else taken).append(item)
                seen.add(item[1])
            self._run_round(requests, taken, responses)
            pending = later
        return responses

    def _run_round(self, requests: list, taken: list, responses: list) -> None:
        work = []  # (sequence, its piece's step inputs), in the order of `taken`
        for index, _, _, sequence in taken:
            try:
                work.append((sequence, self._piece_steps(requests[index], sequence)))
            except Exception as error:  # a piece the cutter or the tensors refuse: this request fails alone
                responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error)))
                work.append((sequence, []))
        depth = max((len(steps) for _, steps in work), default=0)
        for k in range(depth):  # the k-th step of every piece that has one, one ORT call per input shape
            groups = {}
            for sequence, steps in work:
                if k < len(steps):
                    shapes = tuple(steps[k][name].shape for name in self.piece_inputs)
                    groups.setdefault(shapes, []).append((sequence, steps[k]))
            for group in groups.values():
                self._step(group)
        for index, corrid, end, sequence in taken:
            if responses[index] is None:
                responses[index] = self._response(sequence)
            if end:
                self.sequences.pop(corrid, None)

    def _step(self, group: list) -> None:
        feed = {name: np.concatenate([sequence["state"][name] for sequence, _ in group]) for name in self.state_outputs}
        for name in self.piece_inputs:
            feed[name] = np.concatenate([inputs[name] for _, inputs in group])
        out = dict(zip(self.output_names, self.session.run(self.output_names, feed), strict=True))
        for row, (sequence, _) in enumerate(group):
            for state_name, output_name in self.state_outputs.items():
                sequence["state"][state_name] = out[output_name][row : row + 1]
            sequence["answers"] = {spec["name"]: out[spec["name"]][row : row + 1] for spec in self.answers}
            sequence["steps"] += 1

    def _response(self, sequence: dict) -> Any:
        tensors = []
        for spec in self.answers:
            value = sequence["answers"][spec["name"]] if sequence["answers"] else _placeholder(spec)
            tensors.append(pb_utils.Tensor(spec["name"], value.reshape(1, 1) if value.ndim == 1 else value))
        tensors.append(pb_utils.Tensor(STEPS, np.array([[sequence["steps"]]], dtype=np.int64)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def finalize(self) -> None:
        self.sequences.clear()
