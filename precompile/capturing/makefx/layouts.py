"""Which tensor inputs of a layout-specialized (Inductor) MakeFx graph a served call may pass in another
memory layout: the driver copies such an input into the captured strides before the compiled graph
runs, which gives eager's values unless the copy is visible. It is where fn writes into the input in
place (the write would land in the copy), returns a view of it (the result would view the copy), or
the captured input overlaps itself (an expand: no copy holds another tensor's values in that layout).
"""
from __future__ import annotations

import msgspec
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from precompile.artifact.metadata import ConstantLeaf, TensorLeaf
from precompile.torch_compat import pytree


def _storage(value) -> StorageWeakRef | None:
    return StorageWeakRef(value.untyped_storage()) if isinstance(value, torch.Tensor) else None


def _written_storages(graph: torch.fx.Graph) -> set:
    """The storages ops of `graph` write into in place (or through out=)."""
    written = set()
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        given = {**dict(zip((a.name for a in schema.arguments), node.args)), **node.kwargs}
        for argument in schema.arguments:
            value = given.get(argument.name)
            if argument.alias_info is not None and argument.alias_info.is_write and isinstance(value, torch.fx.Node):
                written.add(_storage(value.meta.get("val")))
    return written


def _returned_storages(graph: torch.fx.Graph) -> set:
    output = next(iter(graph.find_nodes(op="output")))
    return {_storage(node.meta.get("val")) for node in pytree.tree_leaves(output.args) if isinstance(node, torch.fx.Node)}


def keep_layouts(graph_module: torch.fx.GraphModule, inputs: list, tensor_inputs: list, n_state: int) -> list:
    """`inputs` (the leaf specs, strides recorded) with `layout_kept` set on each tensor input a served call
    must pass in the captured layout, saying why; `tensor_inputs` are the captured call's real inputs."""
    placeholders = list(graph_module.graph.find_nodes(op="placeholder"))[n_state:]
    written, returned = _written_storages(graph_module.graph), _returned_storages(graph_module.graph)
    kept = []
    for placeholder, tensor in zip(placeholders, tensor_inputs):
        storage = _storage(placeholder.meta.get("val"))
        if storage in written:
            kept.append("fn writes into it in place")
        elif storage in returned:
            kept.append("fn returns a view of it")
        elif torch._debug_has_internal_overlap(tensor) != 0:
            kept.append("its captured layout repeats elements (an expand)")
        else:
            kept.append("")
    reasons = iter(kept)
    return [leaf if isinstance(leaf, ConstantLeaf) else _kept(leaf, next(reasons)) for leaf in inputs]


def _kept(leaf: TensorLeaf, reason: str) -> TensorLeaf:
    return msgspec.structs.replace(leaf, layout_kept=reason) if reason and leaf.stride is not None else leaf
