"""torch's own classes that Mega-Cache entries legitimately pickle, reviewed kind by kind (torch 2.11-2.14).

Each name is on the list with the one shape in which torch's pickle builds it (`pickle_shapes.CallShape`)
and why unpickling it in that shape only builds data: read in each torch's source, every one is a
dataclass, enum or named container whose reconstruction (copyreg's `_reconstructor`/`__newobj__` with
no arguments and a BUILD of its `__dict__`) stores fields, with no `__setstate__`, `__reduce__` or
`__post_init__` that does more (the exceptions are named, with the call their `__reduce__` writes).
The review holds for that shape only: any other call of a reviewed class (`CompiledFxGraph(...)`,
whose `__init__` reads the files its graph names) is a finding naming the class and the call
(`scan_pickle` with `call_shape`). Only an entry of the kind that list is for allows a name; anything
else off the data-only list stays a finding there (`scan_pickle` with `reviewed`), and every name the
policy calls dangerous stays dangerous, except the stored callables below in the one shape torch
writes them.

What the review does not cover, and cannot: loading an entry runs the code it carries (Inductor's
output module and the kernels it compiles, AOTAutograd's FX graph code). That code is shown and
extracted (`mega_cache_code`), to be read; the scan says only that unpickling builds torch's data.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import msgspec

from precompile.artifact.pickle_shapes import CallShape
from precompile.inspect.model.artifact import PickleScan


class Review(NamedTuple):
    """One reviewed name: the only shape in which torch's pickle builds it (any other call of it is a
    finding), and why unpickling it in that shape only builds data."""

    shape: CallShape
    why: str


_DATA = "dataclass: fields stored by BUILD, no __setstate__"
_ENUM = Review("enum", "enum member: looked up by value, nothing run")
_SOURCE = "frozen dataclass Source (a path such as L['x'].weight), pickled by its __reduce__ as (class, fields)"
_INDUCTOR = {
    ("torch._inductor.output_code", "CompiledFxGraph"): Review("built", (
        "dataclass holding the output module's source and files as text/bytes; __getstate__ drops the callable, "
        "no __setstate__ (load later writes and imports the source: shown as code; its __init__, which reads "
        "the files its graph names, is never called by torch's pickle)")),
    ("torch._inductor.cudagraph_utils", "BoxedDeviceIndex"): Review("built", _DATA),
    ("torch._inductor.metrics", "CachedMetricsDeltas"): Review("built", _DATA),
    ("torch._inductor.triton_bundler", "TritonBundle"): Review("built", _DATA + " (frozen; lists of kernel files as bytes)"),
    ("torch._inductor.utils", "BoxedBool"): Review("built", _DATA),
    ("torch._inductor.decomposition", "select_decomp_table"): Review("value", (
        "function stored in fx_kwargs, not called while unpickling; called later, it returns torch's decomposition "
        "table by config (no I/O, no import)")),
    ("torch.utils._ordered_set", "OrderedSet"): Review("list", "__reduce__ is (OrderedSet, (list,)): builds a set from a list"),
    ("torch._utils", "torch.contiguous_format"): Review("value", (
        "a memory_format constant, reached by attribute (torch.memory_format pickles by name)")),
}
_AOT = {
    **{("torch._functorch._aot_autograd.aot_autograd_result", name): Review("built", _DATA) for name in (
        "AOTAutogradResult", "CompiledForward", "CompiledBackward",  # 2.11, 2.12: graphs by FX-graph cache key
        "BundledAOTAutogradResult", "BundledCompiledForward", "BundledCompiledBackward")},  # 2.13+: graphs inline
    ("torch._functorch._aot_autograd.aot_autograd_result", "SerializedGraphModule"): Review("built", (
        "dataclass (fn, args) of GraphModule.__reduce__; fn is reduce_graph_module, called only at load on the "
        "graph code in args: shown as code")),
    **{("torch._functorch._aot_autograd.schemas", name): Review("built", _DATA) for name in (
        "AOTConfig", "CacheableAOTConfig", "InputAliasInfo", "OutputAliasInfo", "PlainTensorMeta", "ViewAndMutationMeta",
        "SubclassCreationMeta", "MemoryFormatMeta", "TensorAlias")},
    **{("torch._functorch._aot_autograd.schemas", name): _ENUM for name in ("MutationType", "OutputType")},
    **{("torch._functorch._aot_autograd.descriptors", name): Review("built", _DATA + " (frozen)") for name in (
        "PlainAOTInput", "PlainAOTOutput", "TangentAOTInput", "ParamAOTInput", "BufferAOTInput", "GradAOTOutput")},
    **{("torch._functorch._aot_autograd.runtime_wrappers", name): Review("built", _DATA + " (a wrapper's recorded arguments)")
       for name in ("AOTDedupeWrapper", "AOTSyntheticBaseWrapper")},
    **{("torch._dynamo.source", name): Review("fields", _SOURCE + "; its __post_init__ only checks them") for name in (
        "AttrSource", "DictGetItemSource", "TensorPropertySource")},
    **{("torch._dynamo.source", name): Review("fields", _SOURCE) for name in (
        "LocalSource", "GlobalSource", "UnspecializedBuiltinNNModuleSource", "UnspecializedNNModuleSource",
        "UnspecializedParamBufferSource")},
    ("torch._dynamo.source", "TensorProperty"): _ENUM,
    ("torch", "Tensor"): Review("value", "the class as a type (OutputAliasInfo.raw_type), not called"),
    ("torch._subclasses.functional_tensor", "FunctionalTensor"): Review("value", "the class as a type (raw_type of an output), not called"),
}
_PGO = {
    ("torch._dynamo.pgo", "CodeState"): Review("built", _DATA + " (automatic-dynamic sizes per frame)"),
    ("torch._dynamo.pgo", "CodeId"): Review("built", _DATA + " (frozen: file name, line, function name)"),
    ("torch._dynamo.pgo", "FrameStateSizeEntry"): Review("built", _DATA),
    ("torch._dynamo.pgo", "InferStride"): Review("built", _DATA + " (frozen)"),
    ("torch._dynamo.pgo", "AutoDynamic"): _ENUM,
    ("torch._dynamo.pgo", "AutoUnset"): _ENUM,
}
REVIEWED: dict[str, dict[tuple[str, str], Review]] = {
    "inductor": _INDUCTOR,
    "aot_autograd": {**_INDUCTOR, **_AOT},  # an AOTAutograd entry holds its compiled graphs' CompiledFxGraph
    "pgo": _PGO,
}
"""{cache kind: {(module, name): how torch's pickle builds it, and why unpickling it that way is benign}}."""
STORED: dict[str, frozenset[tuple[str, str]]] = {
    "aot_autograd": frozenset({("torch.fx.graph_module", "reduce_graph_module")}),
}
"""Dangerous callables an entry of a kind holds as a value, never calls while unpickling (a call is its
own finding, see `pickle_policy.STORED_CALLABLES`): SerializedGraphModule.fn, which load calls on the
graph code beside it (exec of its forward, shown as code)."""


def reviewed_for(kind: str) -> Callable[[str, str], bool]:
    """Whether a name off the data-only list is reviewed for an entry of this cache kind."""
    names = REVIEWED.get(kind, {})
    return lambda module, name: (module, name) in names


def call_shape_for(kind: str) -> Callable[[str, str], CallShape | None]:
    """How a name reviewed for an entry of this cache kind may be built there (`pickle_shapes`)."""
    names = REVIEWED.get(kind, {})
    return lambda module, name: review.shape if (review := names.get((module, name))) is not None else None


def review_reason(kind: str, module: str, name: str) -> str:
    """Why a name allowed in an entry of this kind is benign there, for show."""
    if (module, name) in STORED.get(kind, ()):
        return f"stored as a value in {kind} entries, called by load on the graph code shown"
    review = REVIEWED.get(kind, {}).get((module, name))
    return f"{kind} entries: {review.why if review is not None else 'reviewed'}"


def with_stored_callables(scan: PickleScan, kind: str) -> PickleScan:
    """The scan with each stored callable of this kind imported by the entry itself (not a nested
    pickle, not an unresolved operand) counted as allowed; its call while unpickling stays a finding."""
    stored = STORED.get(kind, frozenset())
    if not any((imp.module, imp.name) in stored for imp in scan.imports):
        return scan
    imports = tuple(
        msgspec.structs.replace(imp, risk="allowed")
        if (imp.module, imp.name) in stored and imp.unresolved is None and imp.within is None else imp
        for imp in scan.imports)
    return msgspec.structs.replace(scan, imports=imports)
