"""MakeFxTracer: one non-strict make_fx trace of fn(*args, **kwargs) on fake tensors.

Every nn.Module argument has its parameters and buffers lifted to graph inputs (tied weights once),
so the graph holds no weights. The trace runs on fakes: nothing real is computed or mutated here;
the caller serves the rendered artifact to run the call for real. What the contract forbids is
refused with a PrecompileError that names the cause.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import msgspec
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.multiprocessing.reductions import StorageWeakRef
from torch.nn.utils import stateless

from precompile.artifact.metadata import ConstantLeaf, InlinedSource, NamedTensor, SpecializedValue, TensorLeaf
from precompile.capturing import constants
from precompile.capturing.inlined_files import ran_sources
from precompile.capturing.makefx import autograd_watch, layouts, reads, specialized, unbacked
from precompile.codegen.drivers.makefx import collect_params_and_buffers
from precompile.codegen.drivers.makefx_reads import REQUIRES_GRAD, spelled
from precompile.errors import CaptureRefused, PrecompileError
from precompile.serve.ranks import traceable_collectives
from precompile.torch_compat import pytree

log = logging.getLogger("precompile")
# Where torch dispatches ops under make_fx: a failure there is the op's, not fn's own code's.
_TORCH_DISPATCH = (str(Path(torch.__file__).parent / "_subclasses"), str(Path(torch.__file__).parent / "fx" / "experimental"))

_CONSTANT_TYPES = (type(None), bool, int, float, str)


@dataclass
class MakeFxTrace:
    """A traced graph and the calling convention it was traced under (no backend decided yet)."""

    graph_module: torch.fx.GraphModule
    example_inputs: list[torch.Tensor]
    """The real flat graph inputs of the captured call: params, buffers, tensor inputs."""
    num_positional_args: int
    module_positions: tuple[int, ...]
    module_keywords: tuple[str, ...]
    params: tuple[NamedTensor, ...]
    buffers: tuple[NamedTensor, ...]
    in_spec: str
    inputs: tuple[TensorLeaf | ConstantLeaf, ...]
    out_spec: str
    outputs: tuple[TensorLeaf | ConstantLeaf, ...]
    grad_param_indices: tuple[int, ...]
    specialized: tuple[SpecializedValue, ...]
    """The Python values the trace read besides tensors (torch's global state first)."""
    fake_mode: Any = None
    """The FakeTensorMode `example_inputs` live in when dims were marked unbacked (they are fakes then)."""
    autograd: autograd_watch.AutogradSeen = field(default_factory=autograd_watch.AutogradSeen)
    """What fn's code did to autograd that the graph does not keep, and whether it read requires_grad."""
    inlined_sources: tuple[InlinedSource, ...] = ()
    """The line ranges of the functions the trace ran, hashed (load refuses where one's text changed)."""


def _named(name: str, tensor: torch.Tensor, layout: bool) -> NamedTensor:
    return NamedTensor(
        name=name, shape=tuple(tensor.shape), dtype=str(tensor.dtype), device=str(tensor.device),
        stride=tuple(tensor.stride()) if layout else None,
    )


def _tensor_leaf(path: str, tensor: torch.Tensor, layout: bool = False) -> TensorLeaf:
    """A leaf spec; a symbolic (unbacked) size or stride is recorded as None: any value."""
    return TensorLeaf(
        path=path, shape=_concrete(tensor.shape), dtype=str(tensor.dtype), device=str(tensor.device),
        stride=_concrete(tensor.stride()) if layout else None,
    )


def _input_leaf(path: str, tensor: torch.Tensor, traced: torch.Tensor, layout: bool) -> TensorLeaf:
    leaf = _tensor_leaf(path, traced, layout)
    dims = unbacked.described_dims(tensor, traced)
    return msgspec.structs.replace(leaf, unbacked=dims) if dims else leaf


def _concrete(values) -> tuple[int | None, ...]:
    return tuple(v if isinstance(v, int) else None for v in values)


def _refuse_unsupported_input(path: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            raise CaptureRefused(f"input {path} is a nested tensor, which MakeFxTracer cannot capture; pass dense tensors")
        if value.layout != torch.strided:
            raise CaptureRefused(f"input {path} is a {value.layout} tensor, which MakeFxTracer cannot capture; pass a dense (strided) tensor")
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            raise CaptureRefused(f"input {path} is a tensor subclass ({type(value).__name__}), which MakeFxTracer cannot capture; pass a plain tensor")
    elif not isinstance(value, _CONSTANT_TYPES):
        raise CaptureRefused(
            f"input {path} is a {type(value).__name__}; a MakeFx artifact bakes non-tensor inputs into its graph "
            "and can only record None, bool, int, float or str: pass tensors, or close over the value in fn"
        )


def _spec_text(spec, what: str) -> str:
    try:
        return pytree.treespec_dumps(spec)
    except Exception as exc:  # treespec_dumps raises TypeError/NotImplementedError/... for foreign nodes
        raise CaptureRefused(
            f"the {what} structure of fn cannot be serialized ({exc}); use tuples, lists, dicts and registered pytree nodes"
        ) from None


def _path(prefix: str, key_path) -> str:
    return prefix + pytree.keystr(key_path)


@dataclass
class _FlatCall:
    """The call flattened for make_fx: parameters, buffers and tensor inputs as one flat list, and
    what rebuilds fn's arguments from it."""

    args: tuple
    kwargs: dict[str, Any]
    module_positions: tuple[int, ...]
    module_keywords: tuple[str, ...]
    modules: list[torch.nn.Module]
    """The module arguments: positional, then by keyword."""
    params: list[tuple[str, torch.Tensor]]
    buffers: list[tuple[str, torch.Tensor]]
    keyed_leaves: list
    in_spec: Any
    inputs: list[str | ConstantLeaf]
    """Each input leaf: a tensor input's path (described once traced) or a constant's leaf."""
    tensor_inputs: list[torch.Tensor]

    @property
    def module_slots(self) -> tuple[int | str, ...]:
        """Where each of `modules` is passed: its position, or its keyword."""
        return (*self.module_positions, *self.module_keywords)

    @property
    def state(self) -> list[tuple[str, torch.Tensor]]:
        return self.params + self.buffers


def _flatten_call(args: tuple, kwargs: dict[str, Any], layout: bool) -> _FlatCall:
    """Split a call into the models' state and the runtime inputs, refusing what cannot be captured."""
    module_positions = tuple(i for i, a in enumerate(args) if isinstance(a, torch.nn.Module))
    module_keywords = tuple(name for name, value in kwargs.items() if isinstance(value, torch.nn.Module))
    modules = [args[i] for i in module_positions] + [kwargs[name] for name in module_keywords]
    params, buffers = collect_params_and_buffers(modules)
    for name, tensor in params + buffers:
        if unbacked.marked_dims(tensor):
            raise CaptureRefused(f"model tensor {name!r} has dims marked with mark_unbacked; only runtime inputs can be")
    keyed_leaves, in_spec = pytree.tree_flatten_with_path(_user_args(args, kwargs, (*module_positions, *module_keywords)))
    inputs: list[str | ConstantLeaf] = []
    tensor_inputs = []
    for key_path, value in keyed_leaves:
        path = _path("kwargs" if isinstance(key_path[0].key, str) else "args", key_path)
        _refuse_unsupported_input(path, value)
        if isinstance(value, torch.Tensor):
            unbacked.refuse_unsupported_marks(path, value, allow_unbacked=layout)
            tensor_inputs.append(value)
            inputs.append(path)
        else:
            inputs.append(ConstantLeaf(path=path, value=value))
    return _FlatCall(args, kwargs, module_positions, module_keywords, modules, params, buffers, keyed_leaves, in_spec, inputs, tensor_inputs)


class _TracedFn:
    """fn over the flat inputs, as make_fx traces it: each module reparametrized with its state from
    the flat list. Tracing records fn's result structure, its outputs and the parameters it
    computed gradients for, refusing what a MakeFx artifact cannot serve."""

    def __init__(self, fn: Callable[..., Any], call: _FlatCall, inputs: list, allowed_symbols: set) -> None:
        self.fn = fn
        self.call = call
        self.tensor_leaves = [leaf for leaf in inputs if isinstance(leaf, TensorLeaf)]
        self.allowed_symbols = allowed_symbols
        # Every name a module knows a tensor by (tied weights included) -> its slot in the flat inputs.
        slot_of = {id(t): i for i, (_, t) in enumerate(call.state)}
        self.module_names = [
            [(name, slot_of[id(t)]) for name, t in (*m.named_parameters(remove_duplicate=False), *m.named_buffers(remove_duplicate=False))]
            for m in call.modules
        ]
        # Gradients flow where they would in eager: into params that require them and, to be refused,
        # into buffers and inputs that require them.
        self.requires_grad = [t.requires_grad for _, t in call.state] + [t.requires_grad for t in call.tensor_inputs]
        self.out_spec: Any = None
        self.outputs: list[TensorLeaf | ConstantLeaf] = []
        self.grad_param_indices: tuple[int, ...] = ()
        self.read = reads.ReadLog()
        self.autograd = autograd_watch.AutogradSeen()

    def __call__(self, *flat_inputs):
        call = self.call
        flat = [t.detach().requires_grad_(rg) if rg else t for t, rg in zip(flat_inputs, self.requires_grad)]
        n_state = len(call.state)
        state = flat[:n_state]
        runtime_inputs = iter(flat[n_state:])
        leaves = [next(runtime_inputs) if isinstance(v, torch.Tensor) else v for _, v in call.keyed_leaves]
        by_position = {**dict(zip(call.module_slots, call.modules)), **pytree.tree_unflatten(leaves, call.in_spec)}
        with contextlib.ExitStack() as stack:
            for module, names in zip(call.modules, self.module_names):
                stack.enter_context(
                    stateless._reparametrize_module(module, {name: state[slot] for name, slot in names}, tie_weights=True)
                )
            with reads.recording(dict(zip(call.module_slots, call.modules))) as self.read, \
                    autograd_watch.watching() as self.autograd:
                result = self.fn(*[by_position[i] for i in range(len(call.args))], **{k: by_position[k] for k in call.kwargs})
        self._refuse_stray_gradients(state, flat[n_state:])
        graph_outputs = self._record_outputs(result)
        grads = [(i, state[i].grad) for i in range(len(call.params)) if state[i].grad is not None]
        self.grad_param_indices = tuple(i for i, _ in grads)
        return [*graph_outputs, *[g for _, g in grads]]

    def _refuse_stray_gradients(self, state: list, runtime_inputs: list) -> None:
        for (name, _), tensor in zip(self.call.buffers, state[len(self.call.params):]):
            if tensor.grad is not None:
                raise CaptureRefused(f"registered buffer {name!r} received a gradient; a MakeFx artifact scatters gradients onto parameters only")
        for leaf, tensor in zip(self.tensor_leaves, runtime_inputs):
            if tensor.grad is not None:
                raise CaptureRefused(
                    f"user input {leaf.path} received a gradient; a MakeFx artifact scatters gradients onto "
                    "the model's parameters only: make it a parameter, or detach it"
                )

    def _record_outputs(self, result) -> list[torch.Tensor]:
        out_leaves, self.out_spec = pytree.tree_flatten_with_path(result)
        self.outputs, graph_outputs = [], []
        for key_path, value in out_leaves:
            path = _path("result", key_path)
            if isinstance(value, torch.Tensor):
                if free_unbacked_symbols(value) - self.allowed_symbols:
                    raise CaptureRefused(_data_dependent(f"returns {path}, whose shape"))
                self.outputs.append(_tensor_leaf(path, value))
                graph_outputs.append(value)
            elif isinstance(value, _CONSTANT_TYPES):
                self.outputs.append(ConstantLeaf(path=path, value=value))
            else:
                raise CaptureRefused(
                    f"fn's result {path} is a {type(value).__name__}, which an artifact cannot serialize; "
                    "return tensors, None, bool, int, float or str in tuples, lists and dicts"
                )
        return graph_outputs


def trace(fn: Callable[..., Any], args: tuple, decompositions=None, *, kwargs: dict[str, Any] | None = None,
          layout: bool = False) -> MakeFxTrace:
    """Trace fn(*args, **kwargs); `layout` records strides too, for backends that specialize on memory layout
    (inductor), which are also the backends that serve dims marked with mark_unbacked."""
    started = time.perf_counter()
    call = _flatten_call(args, dict(kwargs or {}), layout)
    in_spec_text = _spec_text(call.in_spec, "input")
    example_inputs = [t for _, t in call.state] + call.tensor_inputs
    fake_mode = None
    trace_inputs = [t.detach() for t in example_inputs]
    if any(unbacked.marked_dims(t) for t in call.tensor_inputs):
        fake_mode, trace_inputs = unbacked.fake_inputs(example_inputs)
    # A tensor input's spec comes from what is traced: a marked dim (and strides built on it) is None.
    described = iter(zip(call.tensor_inputs, trace_inputs[len(call.state):]))
    inputs = [_input_leaf(leaf, *next(described), layout) if isinstance(leaf, str) else leaf for leaf in call.inputs]
    allowed_symbols = set().union(*(free_unbacked_symbols(t) for t in trace_inputs)) if fake_mode else set()
    state_before = specialized.global_state_now(call.modules, call.module_slots)
    traced = _TracedFn(fn, call, inputs, allowed_symbols)
    log.info("tracing %s with make_fx (%d params, %d buffers, %d tensor inputs)",
             _name(fn), len(call.params), len(call.buffers), len(call.tensor_inputs))
    graph_module = _make_fx(traced, decompositions, trace_inputs, marked=fake_mode is not None)
    _refuse_forbidden_nodes(graph_module, [name for name, _ in call.params], allowed_symbols)
    if not traced.grad_param_indices:
        _drop_the_traces_detaches(graph_module, traced.requires_grad)
    if layout:
        inputs = layouts.keep_layouts(graph_module, inputs, call.tensor_inputs, len(call.state))
    # Grad mode changes what a training step's graph computes; a forward's values are the same in
    # either mode (a call autograd records runs an ATen graph that records it, see the driver's run).
    state = specialized.global_state(state_before, bool(traced.grad_param_indices), traced.read.state)
    read = specialized.records(traced.read, getattr(fn, "__module__", None) or "__main__")
    rendered = constants.inline_fresh_constants(graph_module, constants.Namer(fn, call.modules, traced.read))
    # small ones fn created become literals in python_code
    if rendered:
        log.info("rendered %d small tensor constants as literals", rendered)
    log.info("traced %d graph nodes in %.2f s", len(graph_module.graph.nodes), time.perf_counter() - started)
    return MakeFxTrace(
        graph_module=graph_module,
        example_inputs=trace_inputs if fake_mode is not None else example_inputs,
        num_positional_args=len(args),
        module_positions=call.module_positions,
        module_keywords=call.module_keywords,
        params=tuple(_named(n, t, layout) for n, t in call.params),
        buffers=tuple(_named(n, t, layout) for n, t in call.buffers),
        in_spec=in_spec_text,
        inputs=tuple(inputs),
        out_spec=_spec_text(traced.out_spec, "output"),
        outputs=tuple(traced.outputs),
        grad_param_indices=traced.grad_param_indices,
        specialized=(*state, *_requires_grad_read(traced, example_inputs), *read),
        fake_mode=fake_mode,
        autograd=traced.autograd,
        inlined_sources=ran_sources(traced.read.codes),
    )


def _requires_grad_read(traced: _TracedFn, example_inputs: list) -> list[SpecializedValue]:
    """Where fn's code read a tensor's requires_grad (a branch on it is fixed by the trace), the flags
    of every tensor the graph takes, checked on every call."""
    if not traced.autograd.reads_requires_grad:
        return []
    return [SpecializedValue(kind="global_state", name=REQUIRES_GRAD, value=str(spelled(tuple(t.requires_grad for t in example_inputs))))]


def _drop_the_traces_detaches(graph_module: torch.fx.GraphModule, requires_grad: list[bool]) -> None:
    """A forward's graph without the detach _TracedFn put on each input that required grad (to see
    which gradients a backward in fn computes): served where autograd records the call, the graph
    would otherwise cut every parameter off from the gradients eager gives it. fn only ever saw the
    detached tensors, so each such input's detaches are the trace's own."""
    placeholders = list(graph_module.graph.find_nodes(op="placeholder"))
    dropped = False
    for placeholder, detached in zip(placeholders, requires_grad):
        if not detached:
            continue
        for user in list(placeholder.users):
            if user.op == "call_function" and user.target is torch.ops.aten.detach.default:
                user.replace_all_uses_with(placeholder)
                graph_module.graph.erase_node(user)
                dropped = True
    if dropped:
        graph_module.recompile()


def _make_fx(traced: _TracedFn, decompositions, trace_inputs: list, *, marked: bool) -> torch.fx.GraphModule:
    """make_fx's non-strict fake trace, with a data-dependent guard translated into a refusal. The
    lift of a tensor fn creates from data stays in the graph (it tells that constant from one that
    existed before the call), whatever the decompositions say."""
    if decompositions:
        decompositions = {op: rule for op, rule in decompositions.items() if op not in constants.FRESH_LIFTS}
    try:
        with traceable_collectives():  # dist.all_reduce and friends trace as functional collectives
            return make_fx(traced, decomposition_table=decompositions, tracing_mode="fake", _allow_non_fake_inputs=True)(*trace_inputs)
    except PrecompileError:
        raise
    except torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode as exc:
        if marked:
            raise CaptureRefused(
                f"fn needs to guard on a dim marked with mark_unbacked, or on a tensor's value "
                f"({str(exc).splitlines()[0]}); an artifact serves every size of a marked dim, so fn may not branch "
                "on it: remove the mark, or keep that size out of Python control flow"
            ) from None
        raise CaptureRefused(
            f"fn needs a tensor's value to decide a branch, a shape or a Python number ({str(exc).splitlines()[0]}); "
            "a MakeFx capture specializes control flow to one call and cannot record that: keep it in tensor ops "
            "(e.g. torch.where)"
        ) from None
    except Exception as exc:
        op = _failing_op(exc.__traceback__)
        first = (str(exc).strip().splitlines() or [""])[0]
        if op is None and "FakeTensor" in str(exc):
            raise CaptureRefused(
                f"fn uses a tensor's data as a Python value at {_traced_line(exc.__traceback__)} ({type(exc).__name__}: "
                f"{first}): a MakeFx trace runs on fake tensors, which hold shapes but no data (torch's GRU and LSTM "
                "read a packed sequence's batch sizes so). Keep that computation out of fn and pass its result in "
                "(e.g. pad instead of packing), or capture with DynamoTracer"
            ) from exc
        if op is None:
            raise  # what fn's own code raised, as it raised it
        raise CaptureRefused(
            f"tracing fn failed inside torch at the op {op} ({type(exc).__name__}: {first}): torch's fake-tensor "
            "implementation of that op refuses a call eager may run (transformers' grouped_mm experts on float32 "
            "weights on the CPU, say). Capture with DynamoTracer (code that checks torch.compiler.is_compiling() "
            "then takes its compile path), or call that op with what its fake implementation takes (e.g. bfloat16)"
        ) from exc


def _traced_line(tb) -> str:
    """Where the traced code was when it failed: the innermost frame of fn's code or of a torch layer
    (torch.nn), not of the tracing machinery, as `file:line in function`."""
    layers = str(Path(torch.__file__).parent / "nn") + "/"
    machinery = (str(Path(torch.__file__).parent) + "/", str(Path(__file__).parent.parent.parent) + "/")
    where = "an unknown line"
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename.startswith(layers) or not code.co_filename.startswith(machinery):
            where = f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"
        tb = tb.tb_next
    return where


def _failing_op(tb) -> str | None:
    """The ATen op being dispatched (fake or proxy mode) where an exception was raised, if any."""
    from precompile.torch_compat import OpOverload

    found = None
    while tb is not None:
        func = tb.tb_frame.f_locals.get("func") if tb.tb_frame.f_code.co_filename.startswith(_TORCH_DISPATCH) else None
        if isinstance(func, OpOverload):
            found = str(func)
        tb = tb.tb_next
    return found


def _data_dependent(what: str) -> str:
    return (
        f"fn {what} depends on tensor data (e.g. .item(), .tolist(), nonzero(), masked indexing); a MakeFx "
        "artifact is specialized to shapes and cannot serve data-dependent results"
    )


def _user_args(args: tuple, kwargs: dict[str, Any], module_slots: tuple[int | str, ...]) -> dict[int | str, Any]:
    """The runtime inputs: fn's positional args but the modules, keyed by position (paths read args[i]),
    then its keyword arguments but the modules, keyed by name in the call's order (paths read kwargs['name'])."""
    inputs: dict[int | str, Any] = {i: a for i, a in enumerate(args) if i not in module_slots}
    inputs.update((name, value) for name, value in kwargs.items() if name not in module_slots)
    return inputs


def _name(fn) -> str:
    return getattr(fn, "__qualname__", type(fn).__name__)


def _refuse_forbidden_nodes(graph_module: torch.fx.GraphModule, param_names: list[str], allowed_symbols: set) -> None:
    """Refuse what the graph must not hold: constants, control flow, effects, data-dependence, param updates."""
    from precompile.torch_compat import OpOverload, get_effect

    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    param_storages = {
        StorageWeakRef(n.meta["val"].untyped_storage()): i
        for i, n in enumerate(placeholders[: len(param_names)])
        if isinstance(n.meta.get("val"), torch.Tensor)
    }
    for node in graph_module.graph.nodes:
        if node.op == "get_attr":
            _refuse_attribute(graph_module, node)
        if node.op != "call_function":
            continue
        if isinstance(node.target, OpOverload) and get_effect(node.target) is not None:
            raise CaptureRefused(f"fn calls the effectful op {node.target}, which a MakeFx artifact does not support yet")
        value = node.meta.get("val")
        if value is not None and free_unbacked_symbols(value) - allowed_symbols:
            raise CaptureRefused(_data_dependent(f"calls {node.target}, whose result"))
        _refuse_parameter_write(node, param_storages, param_names)


def _refuse_attribute(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    """A subgraph (control flow) read with get_attr (tensor constants: constants.inline_fresh_constants)."""
    value = getattr(graph_module, str(node.target))
    if isinstance(value, torch.fx.GraphModule):
        raise CaptureRefused(
            f"fn uses a control-flow operator (subgraph {node.target!r}, e.g. torch.cond or while_loop), "
            "which a MakeFx artifact cannot hold; capture without it"
        )


def _refuse_parameter_write(node: torch.fx.Node, param_storages: dict, param_names: list[str]) -> None:
    """An op that writes, in place, into the storage of a parameter."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return
    for argument, value in zip(schema.arguments, node.args):
        if argument.alias_info is None or not argument.alias_info.is_write or not isinstance(value, torch.fx.Node):
            continue
        fake = value.meta.get("val")
        slot = param_storages.get(StorageWeakRef(fake.untyped_storage())) if isinstance(fake, torch.Tensor) else None
        if slot is not None:
            raise CaptureRefused(
                f"fn updates parameter {param_names[slot]!r} in place ({node.target}); a MakeFx artifact never writes the "
                "model's parameters: return the new value instead, or update it outside fn"
            )
