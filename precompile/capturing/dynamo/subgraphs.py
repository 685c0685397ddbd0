"""The graphs Dynamo hands its backend during a DynamoTracer capture, as readable python_code sections.

- backend="eager": `AtenRecorder` is the backend. It traces each Dynamo graph to ATen over Dynamo's
  own fake inputs and serves the rendered source itself, so a capture call runs exactly what the
  artifact will run. Autograd flows through the ATen ops, so a training step needs nothing more.
- backend="inductor": `InductorLowerer` is the backend. It compiles each graph as Dynamo's Inductor
  backend does (AOTAutograd partitions a training graph into forward and backward), takes the output
  modules from the result PrecompileContext keeps, and, when AOTAutograd's wrappers around them do
  nothing but call them (see `unlowerable`), serves them itself through the kernel runtime, as the
  rendered python_code will: a training graph's pair through an autograd.Function. A graph whose
  wrappers do more falls back to AOTAutograd: `split_sources` moves its output modules out of the
  bundle into python_code, and its wrapper state stays behind as pickled objects.
"""
from __future__ import annotations

import ast
import copy
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from precompile.capturing import kernels
from precompile.capturing.constants import (
    inline_small_constants,
    refuse_large_dynamo_constants,
    render_output_constants,
)
from precompile.capturing.lowering import RESTORES_GRAD_MODE, adapt_output_code, lower_eager, realignment, views_as_reshapes
from precompile.codegen import subgraphs as sections
from precompile.codegen.drivers import source_of
from precompile.codegen.models import AutogradPlan, Realignment, SubgraphSection
from precompile.errors import CaptureRefused
from precompile.serve.load import exec_registered


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
        from torch.fx.experimental.proxy_tensor import make_fx

        from precompile.torch_compat import TracingContext, enable_python_dispatcher

        # Dynamo's fake mode maps each real input to the fake it traced with (its symbolic sizes,
        # a Python float's value behind its wrapping tensor), as AOTAutograd does.
        fake_mode = TracingContext.get().fake_mode
        fakes = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]
        traced: Callable = graph_module
        modes: dict[str, bool] = {}
        if any(node.target in _GRAD_MODE_SWITCHES for node in graph_module.graph.nodes):
            traced = functools.partial(_run_keeping_grad_mode, graph_module, modes)
        with fake_mode, enable_python_dispatcher():
            aten = make_fx(traced)(*fakes)
        # fn's switches are `with` blocks, each restoring the mode it found (the graph leaves the mode
        # as it was): served, a call that raises restores it too, as eager's `with` does on the way out.
        aten.meta[RESTORES_GRAD_MODE] = modes.get("balanced", False)
        attributes = [node.target for node in aten.graph.find_nodes(op="get_attr")]
        subgraphs = [name for name in attributes if isinstance(getattr(aten, name, None), torch.fx.GraphModule)]
        if subgraphs:
            raise CaptureRefused(
                f"a graph of the capture calls a higher-order op with nested graphs {subgraphs} (torch.cond, "
                "activation checkpointing, an autograd.Function ...); the eager backend cannot render those as "
                "source yet: capture with backend='inductor'"
            )
        inline_small_constants(aten)  # small ones become literals in python_code; real data is refused
        aten.graph.eliminate_dead_code(is_impure_node=lambda node: node.target in _GRAD_MODE_SWITCHES or node.is_impure())
        aten.recompile()
        views_as_reshapes(aten, keep_mutated=True)  # where the kernels' strides differ from the fakes
        name = f"graph_{len(self.graphs)}"
        served = exec_section(lower_eager(aten, entry=name).source, name, f"<precompile capture {name}>")
        self.graphs.append(RecordedGraph(aten=aten, served=served))
        return served

    def recorded(self, served: object) -> RecordedGraph | None:
        return next((graph for graph in self.graphs if graph.served is served), None)


# The grad-mode switches a Dynamo graph holds as nodes: fn's `with torch.no_grad():`, `enable_grad()`,
# `inference_mode()` (an enter whose result its exit takes).
_GRAD_MODE_SWITCHES = frozenset({torch._C._set_grad_enabled, torch.autograd.grad_mode._enter_inference_mode,
                                 torch.autograd.grad_mode._exit_inference_mode})


class _GradModeKept(torch.fx.Interpreter):
    """Runs a Dynamo graph under make_fx, which traces below autograd: a grad-mode switch of the graph
    would run at trace time and leave no node, so the served ATen graph would record autograd through
    ops eager runs without it. Each switch is recorded where it runs, an exit taking its enter's node."""

    def __init__(self, graph_module: torch.fx.GraphModule) -> None:
        super().__init__(graph_module)
        self._nodes: dict[int, tuple[object, object]] = {}  # id of a switch's result -> (result, its proxy)

    def call_function(self, target, args, kwargs):
        from precompile.torch_compat import get_proxy_mode

        result = super().call_function(target, args, kwargs)
        if target in _GRAD_MODE_SWITCHES:
            traced = tuple(self._nodes[id(arg)][1] if id(arg) in self._nodes else arg for arg in args)
            proxy = get_proxy_mode().tracer.create_proxy("call_function", target, traced, kwargs)
            self._nodes[id(result)] = (result, proxy)
        return result


def _run_keeping_grad_mode(graph_module: torch.fx.GraphModule, modes: dict[str, bool], *args):
    before = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
    result = _GradModeKept(graph_module).run(*args)
    modes["balanced"] = before == (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
    return result


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
            raise CaptureRefused(f"an AOTAutograd artifact holds a {part} graph without output code; cannot render it")
        loadable = copy.copy(loadable)
        loadable.result = copy.copy(result)
        loadable.result.source_code = ""
        setattr(content, attribute, loadable)
        sources[part] = source
    return stripped, sources


@dataclass(frozen=True)
class LoweredGraph:
    """One Dynamo graph compiled with Inductor; `served` is what the capture returned to Dynamo for it.

    Lowered: `texts` holds its output modules ({"forward": ..., "backward": ...}), `plan` how a training
    pair passes values, `realignments` the inputs each module's GPU kernels take aligned. Fallback: `aot`
    is AOTAutograd's bundled result that serves it, `reason` why.
    """

    served: object
    texts: dict[str, str]
    plan: AutogradPlan | None = None
    detached: tuple[int, ...] = ()
    realignments: dict[str, Realignment] | None = None
    grad_mode: bool | None = None
    aot: object = None
    reason: str = ""

    def section(self, name: str, where: str) -> SubgraphSection:
        forward, backward = f"{name}_forward", f"{name}_backward"
        if self.plan is None:
            return sections.lowered_section(where, forward, self.texts["forward"], detached=self.detached,
                                            realignments=self.realignments, grad_mode=self.grad_mode)
        return sections.lowered_section(where, forward, self.texts["forward"], backward, self.texts["backward"], self.plan,
                                        realignments=self.realignments)


class InductorLowerer:
    """A Dynamo backend: compile as Dynamo's Inductor backend does, then serve the output modules
    without AOTAutograd where its wrappers add nothing (the rendered section, run here as python_code
    runs it), and AOTAutograd's own result elsewhere."""

    def __init__(self, kernel_dir: Path) -> None:
        self.graphs: list[LoweredGraph] = []
        self._runtime: dict | None = None
        self._kernel_dir = kernel_dir
        self._kernels: dict[str, str] = {}
        """The kernels built so far, as load primes them: the rendered sections run on these."""
        self._read: dict[str, str] = {}  # each library's C++ file, read once over the capture's graphs

    def __call__(self, graph_module: torch.fx.GraphModule, example_inputs) -> object:
        from precompile.torch_compat import PrecompileContext, compile_fx

        refuse_large_dynamo_constants(graph_module)  # before the compile, not after it
        compiled = compile_fx.compile_fx(graph_module, example_inputs)
        backend_id = getattr(graph_module, "_backend_id", None)
        aot = PrecompileContext.serialize_artifact_by_key(backend_id) if backend_id else None
        if aot is None:
            return compiled  # nothing bundled to render: the frame is listed as bypassed
        content = aot.content
        reason = unlowerable(content, len(example_inputs))
        if reason:
            self.graphs.append(LoweredGraph(served=compiled, texts={}, aot=aot, reason=reason))
            return compiled
        results = {part: result for part, attribute in AOT_PARTS
                   if (result := getattr(getattr(content, attribute, None), "result", None))}
        texts = {part: adapt_output_code(render_output_constants(result.source_code, getattr(result, "constants", None)))
                 for part, result in results.items()}
        realignments = {part: realignment(result) for part, result in results.items()}
        self._kernels.update(kernels.built_so_far(self._kernel_dir, texts.values(), self._read))
        plan = autograd_plan(content) if "backward" in texts else None
        detached = () if plan else detached_outputs(content)
        name = f"graph_{len(self.graphs)}"
        # An inference graph that leaves grad mode changed: served, it sets the mode after, as AOTAutograd does.
        grad_mode = None if plan else getattr(content.runtime_metadata, "grad_enabled_mutation", None)
        section = LoweredGraph(None, texts, plan, detached, realignments, grad_mode).section(name, f"{name}, compiled in this capture")
        served = self._serve(section)
        self.graphs.append(LoweredGraph(served, texts, plan, detached, realignments, grad_mode))
        return served

    def _serve(self, section: SubgraphSection):
        """Run the section as python_code will, on the runtime drivers python_code includes and the
        kernels this capture built (see kernels.built_so_far)."""
        if self._runtime is None:
            self._runtime = {"__precompile_kernels__": self._kernels}
            for name in sections.RUNTIME:
                exec_registered(source_of(name), f"<precompile capture {name}>", self._runtime)
        namespace = dict(self._runtime)
        exec_registered(section.source, f"<precompile capture {section.name}>", namespace)
        return namespace[section.name]

    def recorded(self, served: object) -> LoweredGraph | None:
        return next((graph for graph in self.graphs if graph.served is served), None)


def unlowerable(content, num_inputs: int) -> str:
    """Why AOTAutograd's wrappers around a bundled result do more than call its output modules
    (so the subgraph stays served by AOTAutograd); "" when they only call them."""
    from precompile.torch_compat import any_autocast_enabled

    meta = content.runtime_metadata
    reasons = [
        (content.maybe_subclass_meta is not None, "tensor subclass inputs or outputs (AOTAutograd unwraps them)"),
        (any(getattr(wrapper, "needs_post_compile", True) for wrapper in content.dispatch_wrappers),
         "duplicated or aliased inputs (AOTAutograd dedupes them)"),
        (meta.num_mutated_inp_runtime_indices > 0, "it mutates an input outside the graph (AOTAutograd copies it back)"),
        (any(info.output_type.name not in _PLAIN_OUTPUTS for info in meta.output_info),
         "an output aliases an intermediate or another output (AOTAutograd regenerates the view)"),
        (content.compiled_bw is not None and any(info.output_type.name != "non_alias" for info in meta.output_info),
         "a training graph's output aliases an input (AOTAutograd regenerates the view)"),
        (meta.num_intermediate_bases > 0, "outputs are views of one intermediate (AOTAutograd regenerates them)"),
        (bool(meta.tokens), "effectful ops (AOTAutograd threads effect tokens)"),
        (meta.is_rng_op_functionalized or meta.num_outputs_rng_offset > 0, "functionalized random ops"),
        (bool(content.indices_of_inps_to_detach), "inputs AOTAutograd detaches"),
        ((meta.num_opaque_objects_saved_for_bw or 0) > 0, "opaque objects saved for backward"),
        (any_autocast_enabled(), "autocast is on (AOTAutograd runs the graph with it off)"),
        (content.compiled_bw is not None and getattr(meta, "grad_enabled_mutation", None) is not None,
         "a training graph that changes grad mode and leaves it changed (AOTAutograd sets it after the call)"),
    ]
    if content.compiled_bw is not None:
        reasons.append((bool(content.compiled_bw.backward_state_indices), "backward state (compiled autograd)"))
        reasons.append((not all(map(_contiguous_tangent, meta.subclass_tangent_meta)),
                        "a gradient the backward module takes in a non-contiguous memory format"))
    for part, attribute in AOT_PARTS:
        loadable = getattr(content, attribute, None)
        source = getattr(getattr(loadable, "result", None), "source_code", None) if loadable is not None else ""
        if loadable is not None and not source:
            reasons.append((True, f"its {part} graph has no output code"))
        elif source and "torch.ops.prims.inductor_" in source:
            reasons.append((True, "Inductor's random-number prims (only torch._inductor registers them)"))
    forward = content.compiled_fw.result.source_code or ""
    reasons.append((_arity(forward) != num_inputs, "its forward module takes other inputs than the graph"))
    if content.compiled_bw is not None and not any(failed for failed, _ in reasons):
        plan = autograd_plan(content)
        expected = meta.num_symints_saved_for_bw + plan.saved_tensors + len(plan.grad_outputs)
        reasons.append((_arity(content.compiled_bw.result.source_code or "") != expected,
                        "its backward module takes other inputs than the saved values and gradients"))
    return "; ".join(dict.fromkeys(reason for failed, reason in reasons if failed))


# Output kinds served as the output module returns them: a new tensor, an input returned as it is,
# or (inference only) a view of an input, served detached over the same storage.
_PLAIN_OUTPUTS = ("non_alias", "is_input", "alias_of_input")


def detached_outputs(content) -> tuple[int, ...]:
    """The outputs of an inference result that alias an input: served as .detach() of what the module
    returns, a fresh tensor over the same storage, as AOTAutograd's regenerated view would be."""
    return tuple(i for i, info in enumerate(content.runtime_metadata.output_info) if info.output_type.name == "alias_of_input")


def _contiguous_tangent(tangent) -> bool:
    """Whether AOTAutograd traced this gradient contiguous (what autograd_subgraph makes it)."""
    layout = getattr(tangent, "memory_format", None)
    if layout is None:
        return False
    if layout.memory_format is not None:
        return layout.memory_format == torch.contiguous_format
    size, stride = list(layout.size or ()), list(layout.stride or ())
    if not all(isinstance(value, int) for value in (*size, *stride)):
        return True  # symbolic: AOTAutograd traces tangents contiguous unless told otherwise
    expected: list[int] = []
    running = 1
    for extent in reversed(size):
        expected.insert(0, running)
        running *= max(extent, 1)
    return all(e == s for e, s, n in zip(expected, stride, size) if n > 1)


def autograd_plan(content) -> AutogradPlan:
    """How a training result's forward outputs split into returns, saved tensors and saved sizes."""
    meta = content.runtime_metadata
    tensor_outputs = [(i, info) for i, info in enumerate(meta.output_info) if issubclass(info.raw_type, torch.Tensor)]
    return AutogradPlan(
        returns=meta.num_forward_returns,
        saved_tensors=content.num_fw_outs_saved_for_bw - meta.num_symints_saved_for_bw,
        non_differentiable=tuple(i for i, info in tensor_outputs if not info.requires_grad),
        # torch 2.11 gives a tangent to every output that requires grad (no _for_backward there)
        grad_outputs=tuple(i for i, info in tensor_outputs
                           if getattr(info, "requires_grad_for_backward", info.requires_grad)),
    )


def _arity(source: str) -> int | None:
    """How many inputs an output module's call(args) unpacks; None when it does not say."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "call":
            for statement in node.body:
                if (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Name)
                        and statement.value.id == "args" and isinstance(statement.targets[0], ast.Tuple)):
                    return len(statement.targets[0].elts)
                if isinstance(statement, ast.Expr) and "args.clear()" in ast.unparse(statement):
                    return 0
            return None
    return None
