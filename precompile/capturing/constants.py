"""Tensor constants a traced graph holds: rendered into python_code as literals, or refused.

A tensor fn creates from data during the call (`torch.tensor([1., 2.])`, transformers'
`torch.tensor([])`) traces as a get_attr constant; a small one is code, not a weight:
`inline_small_constants` replaces each such node with a `torch.tensor(<nested list literal>,
dtype=..., device=...)` call (a zero-size one with `torch.empty(shape, ...)`), which the eager
backend renders as source and Inductor traces as a factory call. A make_fx graph tells such a
constant from a tensor that existed before the call (a global, a closed-over tensor, a plain
attribute), which `inline_fresh_constants` refuses whatever its size: the artifact would serve its
captured value after it changes. What would bake real data into the artifact is refused before any
lowering: a parameter, a tensor over `MAX_CONSTANT_NUMEL` elements, a tensor subclass, a
non-contiguous or complex constant.
"""
from __future__ import annotations

import re

import torch

from precompile.errors import CaptureRefused

MAX_CONSTANT_NUMEL = 64
"""The most elements a constant rendered as a literal may have (zero-size ones always are)."""

_LITERAL_DTYPES = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
}


def constant_refusal(name: str, value: torch.Tensor) -> str:
    """Why `value` (a graph's tensor constant) cannot be rendered as a literal; "" when it can."""
    described = f"(shape {tuple(value.shape)}, dtype {value.dtype})"
    remedy = "Pass it as an argument or register it as a buffer of a module argument"
    if isinstance(value, torch.nn.Parameter):
        return f"fn reads parameter {name} {described} that is not a parameter of a module argument: its data would be baked into the artifact. {remedy}"
    if type(value) is not torch.Tensor or value.is_nested or value.layout != torch.strided:
        return f"fn reads a tensor constant {name} {described} of a kind precompile cannot render as a literal ({type(value).__name__}, {value.layout}). {remedy}"
    if value.numel() == 0:
        return ""
    if value.numel() > MAX_CONSTANT_NUMEL:
        return (
            f"fn reads a tensor that is neither an argument nor a parameter/buffer of a module argument {described}, "
            f"{value.numel()} elements: a global, a closed-over tensor or a tensor created from data over "
            f"{MAX_CONSTANT_NUMEL} elements would be baked into the artifact as a constant. {remedy}"
        )
    if value.dtype not in _LITERAL_DTYPES:
        return f"fn creates a tensor constant {name} {described} whose dtype has no literal rendering. {remedy}"
    if not value.is_contiguous():
        return f"fn reads a non-contiguous tensor constant {name} {described}, which renders as no literal. {remedy}"
    return ""


FRESH_LIFTS = (torch.ops.aten.lift_fresh_copy.default, torch.ops.aten.lift_fresh.default)


def created_in_call(node: torch.fx.Node) -> bool:
    """Whether a get_attr tensor constant of a make_fx graph is one fn created from data during the
    call (`torch.tensor([...])` traces as the constant lifted fresh, and only used so), rather than
    a tensor that existed before it (a global, a closed-over tensor, an attribute of an object)."""
    return bool(node.users) and all(user.target in FRESH_LIFTS for user in node.users)


class Namer:
    """Names a tensor that existed before the call, as the user would find it: an attribute of a
    module argument, a global of the code the trace ran, a cell of fn's closure."""

    def __init__(self, fn, modules: list[torch.nn.Module], read) -> None:
        self.fn = fn
        self.modules = modules
        self.read = read

    def __call__(self, value: torch.Tensor) -> str | None:
        for position, module in enumerate(self.modules):
            for path, submodule in module.named_modules():
                for name, attribute in vars(submodule).items():
                    if attribute is value:
                        return f"attribute {'.'.join(filter(None, (f'model {position}', path, name)))} (not a registered buffer)"
        spaces = dict(self.read.globals_of)
        spaces.setdefault(getattr(self.fn, "__module__", "?") or "?", getattr(self.fn, "__globals__", {}))
        for module, space in sorted(spaces.items()):
            for name, attribute in space.items():
                if attribute is value:
                    return f"global {module}.{name}"
        for name, cell in zip(getattr(getattr(self.fn, "__code__", None), "co_freevars", ()), getattr(self.fn, "__closure__", None) or ()):
            if getattr(cell, "cell_contents", None) is value:  # an empty cell has no contents at all
                return f"closure cell {name} of {getattr(self.fn, '__qualname__', 'fn')}"
        return self.in_collection(value)

    def in_collection(self, value: torch.Tensor) -> str | None:
        """A tensor kept in a dict or list attribute of a submodule (a cache a forward fills)."""
        for position, module in enumerate(self.modules):
            for path, submodule in module.named_modules():
                for name, attribute in vars(submodule).items():
                    items = attribute.items() if isinstance(attribute, dict) else enumerate(attribute) if isinstance(attribute, list) else ()
                    for key, item in items:
                        if item is value:
                            where = ".".join(filter(None, (f"model {position}", path, name)))
                            return f"{where}[{key!r}] (a tensor kept in a {type(attribute).__name__} attribute, e.g. a cache)"
        return None


def inline_fresh_constants(graph_module: torch.fx.GraphModule, namer: Namer) -> int:
    """A make_fx graph's tensor constants: each one fn created from data during the call becomes a
    literal (as `inline_small_constants` renders it); one that existed before the call is refused,
    whatever its size, since the artifact would serve its captured value after it changes."""
    for node in graph_module.graph.find_nodes(op="get_attr"):
        value = getattr(graph_module, str(node.target), None)
        if isinstance(value, torch.nn.Parameter):
            raise CaptureRefused(constant_refusal(repr(node.target), value))
        if isinstance(value, torch.Tensor) and not created_in_call(node):
            described = f"shape {tuple(value.shape)}, dtype {value.dtype}"
            raise CaptureRefused(
                f"fn reads the tensor {namer(value) or repr(node.target)} ({described}), which existed before the call "
                "and is neither an argument nor a parameter or buffer of a module argument (a global, a closed-over "
                "tensor, a plain attribute): the artifact would keep its value at capture and serve that after it "
                "changes. Pass it as an argument, or register it as a buffer of a module argument (register_buffer)"
            )
    return inline_small_constants(graph_module)


def refuse_large_constants(graph_module: torch.fx.GraphModule) -> None:
    """Refuse every tensor constant the graph holds that `inline_small_constants` would not render."""
    for node in graph_module.graph.find_nodes(op="get_attr"):
        value = getattr(graph_module, node.target, None)
        if isinstance(value, torch.Tensor):
            reason = constant_refusal(repr(node.target), value)
            if reason:
                raise CaptureRefused(reason)


def inline_small_constants(graph_module: torch.fx.GraphModule) -> int:
    """Replace each small tensor constant with a call that builds it from a literal; refuse the rest.

    Returns how many constants were rendered (the graph is recompiled when any was).
    """
    refuse_large_constants(graph_module)
    graph = graph_module.graph
    rendered: list[str] = []  # the target each rendered get_attr node read
    for node in graph.find_nodes(op="get_attr"):
        value = getattr(graph_module, str(node.target), None)
        if not isinstance(value, torch.Tensor):
            continue
        rendered.append(str(node.target))
        with graph.inserting_before(node):
            if value.numel() == 0:
                built = graph.call_function(
                    torch.empty, (list(value.shape),), {"dtype": value.dtype, "device": value.device}
                )
            else:
                built = graph.call_function(
                    torch.tensor, (value.tolist(),), {"dtype": value.dtype, "device": value.device}
                )
        built.meta.update(node.meta)
        node.replace_all_uses_with(built)
        graph.erase_node(node)
    for target in set(rendered):
        if hasattr(graph_module, target):
            delattr(graph_module, target)
    if rendered:
        graph.lint()
        graph_module.recompile()
    return len(rendered)


def literal_source(value: torch.Tensor) -> str:
    """`value` as one Python expression that builds it (for a graph module's output code)."""
    dtype, device = f"torch.{str(value.dtype).removeprefix('torch.')}", repr(str(value.device))
    if value.numel() == 0:
        return f"torch.empty({list(value.shape)!r}, dtype={dtype}, device={device})"
    return f"torch.tensor({_nested(value.tolist())}, dtype={dtype}, device={device})"


def _nested(values) -> str:
    if isinstance(values, list):
        return "[" + ", ".join(_nested(v) for v in values) + "]"
    if isinstance(values, float) and values != values:
        return "float('nan')"
    if isinstance(values, float) and values in (float("inf"), float("-inf")):
        return "float('inf')" if values > 0 else "float('-inf')"
    return repr(values)


# How Inductor's output code declares a constant it expects set on the module after loading.
_CONSTANT_SLOT = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*) = None  # (?P<what>.*)$", re.MULTILINE)


def render_output_constants(source: str, constants: dict | None) -> str:
    """Fill the constant slots of an Inductor output module with literals of their values.

    Inductor declares each tensor constant as `name = None  # device dtype shape stride ...` and sets
    it on the module when it loads the code; python_code runs the module itself, so the value is
    rendered in place. Every constant reaching here was checked small by the trace.
    """
    constants = constants or {}

    def fill(match: re.Match) -> str:
        name = match.group("name")
        value = constants.get(name)
        if not isinstance(value, torch.Tensor):
            if name in constants or "device(type=" in match.group("what"):
                raise CaptureRefused(
                    f"Inductor's output code expects a constant {name} ({match.group('what')}) that precompile "
                    "cannot render; pass the tensor as an argument"
                )
            return match.group(0)
        reason = constant_refusal(name, value)
        if reason:
            raise CaptureRefused(reason)
        return f"{name} = {literal_source(value.detach())}"

    return _CONSTANT_SLOT.sub(fill, source)


_FROM_DATA = (torch.tensor, torch.as_tensor)


def refuse_large_dynamo_constants(graph_module: torch.fx.GraphModule) -> None:
    """Before lowering a Dynamo graph: refuse the constants it holds (get_attr tensors, tensors built
    from data in it) that python_code could not render, so no compile is spent on a refused capture."""
    refuse_large_constants(graph_module)
    for node in (node for target in _FROM_DATA for node in graph_module.graph.find_nodes(op="call_function", target=target)):
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor) and value.numel() > MAX_CONSTANT_NUMEL:
            raise CaptureRefused(
                f"fn creates a tensor from data (torch.{node.target.__name__}), shape {tuple(value.shape)}, "
                f"{value.numel()} elements: over {MAX_CONSTANT_NUMEL} elements it would be baked into the artifact as a "
                "constant. Pass it as an argument or register it as a buffer of a module argument"
            )
