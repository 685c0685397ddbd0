"""Realize a traced graph with a backend, as readable source for python_code's graph section."""
from __future__ import annotations

import re

import torch

from precompile.capturing.constants import render_output_constants
from precompile.codegen.models import GraphSection, Realignment
from precompile.codegen.subgraphs import realign_keywords
from precompile.errors import CaptureRefused
from precompile.torch_compat import INDUCTOR_IMPORTS_THE_DRIVER_PROVIDES, fx_custom_builtins, pytree

ENTRY = "captured_graph"


def contiguous_group_norm_inputs(graph_module: torch.fx.GraphModule) -> None:
    """Make each native_group_norm input contiguous in its suggested memory format, as eager
    `group_norm` does before calling it on CPU. The trace drops that call where the traced tensor was
    already contiguous, but strides the trace predicted can differ from what the kernels produce when
    the rendered graph runs (an add of a transposed view and a contiguous tensor), and the CPU kernel
    then refuses the input. A no-op on a contiguous tensor; idempotent."""
    from torch._prims_common import suggest_memory_format

    graph = graph_module.graph
    for node in list(graph.find_nodes(op="call_function", target=torch.ops.aten.native_group_norm.default)):
        source = node.args[0]
        if isinstance(source, torch.fx.Node) and source.op == "call_method" and source.target == "contiguous":
            continue
        with graph.inserting_before(node):
            layout = graph.call_function(suggest_memory_format, (source,))
            contiguous = graph.call_method("contiguous", (source,), {"memory_format": layout})
        node.replace_input_with(source, contiguous)
    graph_module.recompile()


def lower_eager(graph_module: torch.fx.GraphModule, entry: str = ENTRY) -> GraphSection:
    """The captured ATen graph as a plain Python function `entry` over the flat graph inputs."""
    contiguous_group_norm_inputs(graph_module)
    code = graph_module.graph.python_code(root_module="self")
    imports = []
    for name in code.globals:
        if not re.search(rf"\b{re.escape(name)}\b", code.src):
            continue  # FX offers a fixed set of globals; import only those the graph uses
        builtin = fx_custom_builtins.get(name)
        if builtin is None:
            raise CaptureRefused(f"the captured graph refers to {name!r}, which the eager backend cannot render as source")
        imports.append(builtin.import_str)
    restores = graph_module.meta.get(RESTORES_GRAD_MODE, False)
    if restores and "import torch" not in imports:
        imports.append("import torch")
    imports.sort()
    ops = f"_{entry}_ops" if restores else entry
    source, count = re.subn(r"def forward\(self(, )?", f"def {ops}(", code.src.strip("\n"), count=1)
    if count != 1:
        raise CaptureRefused("the captured graph's source has no forward(self, ...) to render")
    body = "\n".join(line.rstrip() for line in source.splitlines())
    if restores:
        body += _RESTORING.format(entry=entry, ops=ops)
    return GraphSection(title="The captured graph as ATen ops, run as they are (eager backend)", source="\n".join(imports) + "\n\n\n" + body, entry=entry)


# GraphModule.meta key: the graph holds fn's grad-mode `with` blocks (no_grad, enable_grad, inference_mode)
# as the calls that switch the mode, and leaves the mode as it found it.
RESTORES_GRAD_MODE = "precompile_restores_grad_mode"

# Around such a graph's ops: a call that raises inside a block leaves the mode as eager's `with` does on
# the way out (as the call found it): the inference-mode guards still live in the ops' frame are exited,
# innermost first, then grad mode is set back.
_RESTORING = """


def {entry}(*args):
    grad_enabled = torch.is_grad_enabled()
    try:
        return {ops}(*args)
    except BaseException as exc:
        frame = exc.__traceback__
        while frame is not None and frame.tb_frame.f_code is not {ops}.__code__:
            frame = frame.tb_next
        if frame is not None:
            live = [value for value in frame.tb_frame.f_locals.values() if isinstance(value, torch._C._InferenceMode)]
            for guard in reversed(live):
                guard.__exit__(None, None, None)
        torch._C._set_grad_enabled(grad_enabled)
        raise"""


# Where the output code's benchmarking tail starts: not part of the artifact.
_TAIL = re.compile(r"^def (get_args|benchmark_compiled_module)\(", re.MULTILINE)


def lower_inductor(graph_module: torch.fx.GraphModule, example_inputs: list[torch.Tensor], fake_mode=None) -> GraphSection:
    """The graph lowered by AOTAutograd + Inductor, as its output code, adapted to a flat call.

    `fake_mode` is the FakeTensorMode of fake `example_inputs` (dims marked unbacked).
    """
    import contextlib

    from precompile.torch_compat import TracingContext, compile_fx, tracing

    if fake_mode is None:  # static shapes only: with unbacked dims a reshape may need to guard on them
        views_as_reshapes(graph_module)
    compiled = []
    wrapped = []

    def keep_source(gm, inputs, **kwargs):
        wrapped.append(_aot_wraps(graph_module, gm))
        result = compile_fx.compile_fx_inner(gm, inputs, **kwargs)
        compiled.append(result)
        return result

    context = tracing(TracingContext(fake_mode)) if fake_mode is not None else contextlib.nullcontext()
    try:
        with torch.no_grad(), context:
            compile_fx.compile_fx(graph_module, [t.detach() for t in example_inputs], inner_compile=keep_source)
    except torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode as exc:
        if fake_mode is None:
            raise
        raise CaptureRefused(
            f"lowering the graph with Inductor needs to guard on a dim marked with mark_unbacked "
            f"({str(exc).splitlines()[0]}): an artifact serves every size of a marked dim, so nothing may depend on "
            "it. Remove the mark (the artifact serves the captured size), or capture with DynamoTracer, whose "
            "dynamic shapes guard on sizes (torch._dynamo.mark_dynamic, or two calls of other sizes: docs/usage.md)"
        ) from None
    if len(compiled) == 1 and not getattr(compiled[0], "source_code", None):
        raise CaptureRefused(
            "the inductor backend has nothing to compile in this graph (fn returns its inputs, views of them or "
            "constants); capture it with backend='eager'"
        )
    if len(compiled) != 1:
        raise CaptureRefused(
            f"Inductor lowered the captured graph into {len(compiled)} modules; precompile needs exactly one"
        )
    if wrapped[0]:
        raise CaptureRefused(
            f"AOTAutograd compiles this graph into a module that {wrapped[0]}, which its runtime wrapper "
            "handles and python_code, which calls the module itself, does not; capture it with backend='eager' "
            "(its ATen graph runs as traced), or keep fn from changing an input's shape or strides in place "
            "and from writing into an input another input aliases"
        )
    return GraphSection(
        title="The compiled graph: AOTAutograd + Inductor output code",
        source=adapt_output_code(render_output_constants(compiled[0].source_code, getattr(compiled[0], "constants", None))) + f"\n\n\ndef {ENTRY}(*flat):\n    return run_inductor_call(call, flat{realign_keywords(realignment(compiled[0]))})",
        entry=ENTRY,
        runtime="inductor_runtime",
    )


def _aot_wraps(traced: torch.fx.GraphModule, compiled: torch.fx.GraphModule) -> str:
    """What AOTAutograd's runtime wrapper must do around the module it compiles from `traced` (its
    forward graph `compiled`), or "": the module takes other inputs than the graph (aliased inputs one
    of which is written become one synthetic base), or returns more than its outputs (an input's new
    shape or strides, which the wrapper applies with as_strided_, or the base of aliased outputs)."""
    def outputs(graph_module):
        return len(pytree.tree_leaves(next(iter(graph_module.graph.find_nodes(op="output"))).args))

    def inputs(graph_module):
        return len(graph_module.graph.find_nodes(op="placeholder"))

    if inputs(compiled) != inputs(traced):
        return f"takes {inputs(compiled)} inputs for the graph's {inputs(traced)} (aliased inputs, one written)"
    if outputs(compiled) != outputs(traced):
        return (f"returns {outputs(compiled)} values for the graph's {outputs(traced)} (an input whose shape or "
                "strides fn changes in place, or a base of aliased outputs)")
    return ""


def realignment(result) -> Realignment:
    """The inputs the GPU kernels of `result` (Inductor's CompiledFxGraph) take aligned and whose check
    its output code leaves to the wrapper Inductor puts around it (which python_code does not run):
    every one on torch 2.11, only those the module writes into from 2.12 on, where the output code
    copies a misaligned input it only reads itself (`copy_if_misaligned`). Empty for CPU inputs. Its
    `written` are all the inputs the module writes into, whose version counters the call bumps."""
    checked = tuple(getattr(result, "inputs_to_check", None) or ())
    written = set(getattr(result, "mutated_input_idxs", None) or ())
    if getattr(result, "_defers_input_alignment", False):
        checked = tuple(index for index in checked if index in written)
    return Realignment(inputs=checked, write_back=tuple(index for index in checked if index in written),
                       written=tuple(sorted(written)))


def views_as_reshapes(graph_module: torch.fx.GraphModule, *, keep_mutated: bool = False) -> None:
    """Reshape where the traced graph viewed.

    The trace records `aten.view` wherever the strides it predicted allowed a view, but the strides
    the graph's ops produce when it runs can differ: AOTAutograd retraces the graph with Inductor's
    decompositions (its `cat` of a zero-size tensor and one other returns a clone keeping that one's
    layout, eager's cat a contiguous tensor: transformers' KV cache starts as `torch.tensor([])`), and
    an eager CPU kernel can return another layout than its fake twin predicted (transformers' PatchTST),
    and the view then fails. `reshape` is a view wherever the view was valid, so nothing else changes;
    where it copies instead, a write through the view would miss its base: with `keep_mutated` (a graph
    run as it is, not functionalized), a view something writes through stays a view.
    """
    views = list(graph_module.graph.find_nodes(op="call_function", target=torch.ops.aten.view.default))
    changed = False
    for node in views:
        if keep_mutated and _written_through(node):
            continue
        node.target = torch.ops.aten.reshape.default
        changed = True
    if changed:
        graph_module.recompile()


def _written_through(node: torch.fx.Node) -> bool:
    """Whether an op writes into `node`'s value, directly or through views of it."""
    seen, pending = set(), [node]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for user in current.users:
            schema = getattr(user.target, "_schema", None)
            if schema is None:
                if user.op == "call_function":
                    return True  # not an ATen op: assume it may write
                continue
            for argument, value in zip(schema.arguments, user.args):
                if value is current and argument.alias_info is not None and argument.alias_info.is_write:
                    return True
            if schema.returns and schema.returns[0].alias_info is not None:
                pending.append(user)  # a view of it (or an op returning its input): follow the alias
    return False


def adapt_output_code(source: str) -> str:
    """Drop the process-local AOT id line, the benchmarking tail, and the imports the runtime provides."""
    tail = _TAIL.search(source)
    if tail is not None:
        source = source[: tail.start()]
    lines = [
        line.rstrip()
        for line in source.splitlines()
        if not line.startswith("# AOT ID:") and line.strip() not in INDUCTOR_IMPORTS_THE_DRIVER_PROVIDES
    ]
    return "\n".join(lines).strip("\n")
