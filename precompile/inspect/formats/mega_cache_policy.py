"""torch's own classes that Mega-Cache entries legitimately pickle, reviewed kind by kind (torch 2.11-2.14).

Each name is on the list with why unpickling it only builds data: read in each torch's source, every
one is a dataclass, enum or named container whose reconstruction (copyreg's `_reconstructor`/
`__newobj__` and a BUILD of its `__dict__`) stores fields, with no `__setstate__`, `__reduce__` or
`__post_init__` that does more (the exceptions are named). Only an entry of the kind that list is for
allows a name; anything else off the data-only list stays a finding there (`scan_pickle` with
`reviewed`), and every name the policy calls dangerous stays dangerous, except the stored callables
below in the one shape torch writes them.

What the review does not cover, and cannot: loading an entry runs the code it carries (Inductor's
output module and the kernels it compiles, AOTAutograd's FX graph code). That code is shown and
extracted (`mega_cache_code`), to be read; the scan says only that unpickling builds torch's data.
"""
from __future__ import annotations

from collections.abc import Callable

import msgspec

from precompile.inspect.model import PickleScan

_DATA = "dataclass: fields stored by BUILD, no __setstate__"
_ENUM = "enum member: looked up by value, nothing run"
_INDUCTOR = {
    ("torch._inductor.output_code", "CompiledFxGraph"): (
        "dataclass holding the output module's source and files as text/bytes; __getstate__ drops the callable, "
        "no __setstate__ (load later writes and imports the source: shown as code)"),
    ("torch._inductor.cudagraph_utils", "BoxedDeviceIndex"): _DATA,
    ("torch._inductor.metrics", "CachedMetricsDeltas"): _DATA,
    ("torch._inductor.triton_bundler", "TritonBundle"): _DATA + " (frozen; lists of kernel files as bytes)",
    ("torch._inductor.utils", "BoxedBool"): _DATA,
    ("torch._inductor.decomposition", "select_decomp_table"): (
        "function stored in fx_kwargs; called, it returns torch's decomposition table by config (no I/O, no import)"),
    ("torch.utils._ordered_set", "OrderedSet"): "__reduce__ is (OrderedSet, (list,)): builds a set from a list",
    ("torch._utils", "torch.contiguous_format"): "a memory_format constant, reached by attribute (torch.memory_format pickles by name)",
}
_AOT = {
    **{("torch._functorch._aot_autograd.aot_autograd_result", name): _DATA for name in (
        "AOTAutogradResult", "CompiledForward", "CompiledBackward",  # 2.11, 2.12: graphs by FX-graph cache key
        "BundledAOTAutogradResult", "BundledCompiledForward", "BundledCompiledBackward")},  # 2.13+: graphs inline
    ("torch._functorch._aot_autograd.aot_autograd_result", "SerializedGraphModule"): (
        "dataclass (fn, args) of GraphModule.__reduce__; fn is reduce_graph_module, called only at load on the "
        "graph code in args: shown as code"),
    **{("torch._functorch._aot_autograd.schemas", name): _DATA for name in (
        "AOTConfig", "CacheableAOTConfig", "InputAliasInfo", "OutputAliasInfo", "PlainTensorMeta", "ViewAndMutationMeta",
        "SubclassCreationMeta", "MemoryFormatMeta", "TensorAlias")},
    **{("torch._functorch._aot_autograd.schemas", name): _ENUM for name in ("MutationType", "OutputType")},
    **{("torch._functorch._aot_autograd.descriptors", name): _DATA + " (frozen)" for name in (
        "PlainAOTInput", "PlainAOTOutput", "TangentAOTInput", "ParamAOTInput", "BufferAOTInput", "GradAOTOutput")},
    **{("torch._functorch._aot_autograd.runtime_wrappers", name): _DATA + " (a wrapper's recorded arguments)" for name in (
        "AOTDedupeWrapper", "AOTSyntheticBaseWrapper")},
    **{("torch._dynamo.source", name): _DATA + " (frozen Source: a path such as L['x'].weight)" for name in (
        "AttrSource", "DictGetItemSource", "LocalSource", "GlobalSource", "TensorPropertySource",
        "UnspecializedBuiltinNNModuleSource", "UnspecializedNNModuleSource", "UnspecializedParamBufferSource")},
    ("torch._dynamo.source", "TensorProperty"): _ENUM,
    ("torch", "Tensor"): "the class as a type (OutputAliasInfo.raw_type); called, it builds an empty tensor",
    ("torch._subclasses.functional_tensor", "FunctionalTensor"): "the class as a type (raw_type of an output), not called",
}
_PGO = {
    ("torch._dynamo.pgo", "CodeState"): _DATA + " (automatic-dynamic sizes per frame)",
    ("torch._dynamo.pgo", "CodeId"): _DATA + " (frozen: file name, line, function name)",
    ("torch._dynamo.pgo", "FrameStateSizeEntry"): _DATA,
    ("torch._dynamo.pgo", "InferStride"): _DATA + " (frozen)",
    ("torch._dynamo.pgo", "AutoDynamic"): _ENUM,
    ("torch._dynamo.pgo", "AutoUnset"): _ENUM,
}
REVIEWED: dict[str, dict[tuple[str, str], str]] = {
    "inductor": _INDUCTOR,
    "aot_autograd": {**_INDUCTOR, **_AOT},  # an AOTAutograd entry holds its compiled graphs' CompiledFxGraph
    "pgo": _PGO,
}
"""{cache kind: {(module, name): why unpickling it is benign}}."""
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


def review_reason(kind: str, module: str, name: str) -> str:
    """Why a name allowed in an entry of this kind is benign there, for show."""
    if (module, name) in STORED.get(kind, ()):
        return f"stored as a value in {kind} entries, called by load on the graph code shown"
    return f"{kind} entries: {REVIEWED.get(kind, {}).get((module, name), 'reviewed')}"


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
