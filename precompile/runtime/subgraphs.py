"""The graphs Dynamo hands its backend during a DynamoTracer capture, as readable python_code sections.

- backend="eager": `AtenRecorder` is the backend. It traces each Dynamo graph to ATen over Dynamo's
  own fake inputs and serves the rendered source itself, so a capture call runs exactly what the
  artifact will run. Autograd flows through the ATen ops, so a training step needs nothing more.
- backend="inductor": Dynamo's Inductor backend compiles through AOTAutograd, and PrecompileContext
  keeps the bundled result. `split_sources` moves each forward/backward output module out of that
  bundle into python_code; what stays behind is AOTAutograd's wrapper state (how outputs, mutations
  and saved tensors map), which torch only gives as pickled objects.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from precompile.errors import PrecompileError
from precompile.runtime.load import exec_registered
from precompile.runtime.lowering import lower_eager


@dataclass(frozen=True)
class RecordedGraph:
    """One Dynamo graph traced to ATen; `served` is what the capture returned to Dynamo for it."""

    aten: torch.fx.GraphModule
    served: object


class AtenRecorder:
    """A Dynamo backend: trace the graph to ATen, render it, serve the rendered function."""

    def __init__(self) -> None:
        self.graphs: list[RecordedGraph] = []

    def __call__(self, graph_module: torch.fx.GraphModule, example_inputs) -> object:
        from precompile.runtime.torch_compat import TracingContext, enable_python_dispatcher
        from torch.fx.experimental.proxy_tensor import make_fx

        # Dynamo's fake mode maps each real input to the fake it traced with (its symbolic sizes,
        # a Python float's value behind its wrapping tensor), as AOTAutograd does.
        fake_mode = TracingContext.get().fake_mode
        fakes = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]
        with fake_mode, enable_python_dispatcher():
            aten = make_fx(graph_module)(*fakes)
        attributes = [node.target for node in aten.graph.find_nodes(op="get_attr")]
        subgraphs = [name for name in attributes if isinstance(getattr(aten, name, None), torch.fx.GraphModule)]
        constants = [name for name in attributes if name not in subgraphs]
        if subgraphs:
            raise PrecompileError(
                f"a graph of the capture calls a higher-order op with nested graphs {subgraphs} (torch.cond, "
                "activation checkpointing, an autograd.Function ...); the eager backend cannot render those as "
                "source yet: capture with backend='inductor'"
            )
        if constants:
            raise PrecompileError(
                f"a graph of the capture holds tensor constants {constants} (a tensor created from data inside fn); "
                "the eager backend renders no constants: pass the tensor as an argument"
            )
        aten.graph.eliminate_dead_code()
        aten.recompile()
        name = f"graph_{len(self.graphs)}"
        served = exec_section(lower_eager(aten, entry=name).source, name, f"<precompile capture {name}>")
        self.graphs.append(RecordedGraph(aten=aten, served=served))
        return served

    def recorded(self, served: object) -> RecordedGraph | None:
        return next((graph for graph in self.graphs if graph.served is served), None)


def exec_section(source: str, entry: str, filename: str):
    """Run a rendered section and return its `entry` (debuggers step into it: see exec_registered)."""
    namespace: dict = {}
    exec_registered(source, filename, namespace)
    return namespace[entry]


# AOTAutograd's bundled result keeps each lowered graph's output module under these parts.
AOT_PARTS = (("forward", "compiled_fw"), ("backward", "compiled_bw"))


def split_sources(artifact) -> tuple[object, dict[str, str]]:
    """A copy of a bundled AOTAutograd artifact without its output modules' source, and those sources.

    PrecompileContext hands out its live objects, so the parts this strips are copied first.
    """
    content = copy.copy(artifact.content)
    stripped = copy.copy(artifact)
    stripped.content = content
    sources = {}
    for part, attribute in AOT_PARTS:
        loadable = getattr(content, attribute, None)
        result = getattr(loadable, "result", None)
        source = getattr(result, "source_code", None)
        if loadable is None:
            continue
        if not source:
            raise PrecompileError(f"an AOTAutograd artifact holds a {part} graph without output code; cannot render it")
        loadable = copy.copy(loadable)
        loadable.result = copy.copy(result)
        loadable.result.source_code = ""
        setattr(content, attribute, loadable)
        sources[part] = source
    return stripped, sources
