"""An ONNX graph lowered to float16: what ``rtserve export --fp16`` writes and what the service does at load
when a model's precision is fp16 (both here, so the two lower a graph the same way). Torch-free."""

from __future__ import annotations

from typing import Any

# ops kept in float32, cast around, beyond the converter's own list: ONNX Runtime's CPU provider has no
# float16 ScatterElements with reduction="add" (SRformer's copy distribution)
FP16_BLOCKED_OPS = ("ScatterElements",)


def to_float16(model: Any, keep_io_types: bool) -> Any:
    """``model`` (an onnx ModelProto) with float16 weights and arithmetic; ``keep_io_types``: its inputs and
    outputs stay float32 (a conversion at load), else they become float16 too (an fp16 export). Constants
    beyond float16's range are clamped (SRformer's -1e30 mask value becomes -65504)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    model = convert_float_to_float16(model, keep_io_types=keep_io_types,
                                     op_block_list=[*DEFAULT_OP_BLOCK_LIST, *FP16_BLOCKED_OPS])
    sort_topologically(model.graph)  # the converter appends the casts around blocked ops at the end
    return model


def sort_topologically(graph: Any) -> None:
    """Reorder ``graph.node`` (an onnx GraphProto's) so that every node comes after the nodes whose outputs
    it reads, keeping the given order where it already holds."""
    available = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        ready = [node for node in pending if all(name in available for name in node.input)]
        if not ready:
            raise ValueError(f"the graph has a cycle or an undefined input near node {pending[0].name!r}")
        for node in ready:
            available.update(node.output)
        ordered += ready
        chosen = {id(node) for node in ready}
        pending = [node for node in pending if id(node) not in chosen]
    del graph.node[:]
    graph.node.extend(ordered)
