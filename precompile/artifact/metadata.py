"""The python_code header: top-level literal assignments, typed.

python_code states its own calling convention in `NAME = <literal>` lines at the top of the file.
Tools read them with `ast` (see `pycode`), never by executing the file, and convert them into the
Struct of the artifact's tracer. Field `foo_bar` is the literal `FOO_BAR`.
"""

from typing import Literal, Union

import msgspec

from precompile.artifact.envelope import Backend
from precompile.artifact.summary import PrecompileSummary

# A constant leaf of an input or output: what a Python literal can hold and compare by value.
ConstantValue = Union[None, bool, int, float, str]


class UnbackedDim(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A dim marked with mark_unbacked: any size (within min/max), equal across dims sharing `symbol`."""

    symbol: str
    """The traced size symbol; dims marked with one shape_id share it and must be equal at runtime."""
    shape_id: str | None = None
    min: int | None = None
    max: int | None = None


class TensorLeaf(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="tensor", tag_field="kind"):
    """A tensor leaf of the flattened inputs or outputs, specialized on shape, dtype and device."""

    path: str
    """Where the leaf sits in fn's arguments or result, e.g. "args[1]['mask']" or "result[0]"."""
    shape: tuple[int | None, ...]
    """None marks a dim that may take any size (mark_unbacked)."""
    dtype: str
    device: str
    stride: tuple[int | None, ...] | None = None
    """Set where the backend specializes on memory layout (inductor); None marks a free stride. A served
    call may pass an input in another layout: the driver copies it into this one, unless `layout_kept`."""
    layout_kept: str = ""
    """Why a call must pass this input in the captured layout, where it must (fn writes into it in place,
    or returns a view of it): a copy would change what the call does."""
    unbacked: dict[int, UnbackedDim] | None = None
    """The dims marked with mark_unbacked, by index (their `shape` entry is None)."""


class ConstantLeaf(msgspec.Struct, frozen=True, kw_only=True, tag="constant", tag_field="kind"):
    """A non-tensor leaf, baked into the trace: inputs must pass the same value again."""

    path: str
    value: ConstantValue


Leaf = Union[TensorLeaf, ConstantLeaf]


class NamedTensor(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A parameter or buffer of the nn.Module arguments, lifted to a graph input."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    stride: tuple[int, ...] | None = None
    """Set where the backend specializes on memory layout (inductor)."""


class ProcessGroupRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A process group the captured collectives talk to, by the name the graph calls it."""

    name: str
    ranks: tuple[int, ...]
    """Its global ranks, in group order."""


class CapturedWorld(msgspec.Struct, frozen=True, kw_only=True):
    """The torch.distributed world a capture's collectives ran in; serving needs the same one."""

    size: int
    backend: str
    """The default group's backend as torch.distributed.get_backend() names it, e.g. "gloo"."""
    groups: tuple[ProcessGroupRecord, ...] = ()
    collectives: tuple[str, ...] = ()
    """The collective ops the graphs call (functional names, e.g. "all_reduce")."""


class ArtifactHeader(msgspec.Struct, frozen=True, kw_only=True, rename="upper"):
    """What every python_code states, whatever its tracer."""

    format_version: int
    backend: Backend
    serving_mode: Literal["standalone", "installed"] = "standalone"
    torch_version: str
    python_version: tuple[int, int]
    fn_name: str
    world: CapturedWorld | None = None
    """Set when the graphs call collectives: python_code refuses to run in any other world."""


class SpecializedValue(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A Python value a MakeFx trace read besides its tensors: its graph is specialized on it, and
    the driver refuses a call where it spells otherwise (unless `checked` is False)."""

    kind: Literal["global_state", "attribute", "global", "closure"]
    name: str
    """global_state: grad_mode, default_dtype, ...; otherwise the attribute, global or free variable."""
    value: str
    """Its spelling: repr of None, bool, int, float, str, a dtype or device; an enum member's qualified
    name; tuples and lists of those."""
    module: str = ""
    """attribute: the submodule's name under module argument `arg` ("" for the argument itself);
    global: the Python module; closure: the qualified name of the function that reads the cell."""
    arg: int | None = None
    keyword: str = ""
    """attribute: the keyword a module argument passed by keyword is passed by (then `arg` is None)."""
    chain: tuple[str, ...] = ()
    """attribute: the attributes of plain objects between the submodule and `name` (config, ...)."""
    checked: bool = True
    """False where a served call cannot reach the value (a closure cell, a global of __main__)."""


def argument_spelling(slot: int | str | None) -> str:
    """A module argument as fn's caller spells it: `args[0]` by position, `kwargs['model']` by keyword."""
    return f"kwargs[{slot!r}]" if isinstance(slot, str) else f"args[{slot}]"


def specialized_source(record: SpecializedValue) -> str:
    """Where a specialized value is read, as the user would spell it (the driver has a twin)."""
    if record.kind == "global_state":
        return f"torch global state {record.name}"
    if record.kind == "attribute":
        return ".".join([argument_spelling(record.keyword or record.arg), *([record.module] if record.module else []), *record.chain, record.name])
    if record.kind == "global":
        return f"global {record.module}.{record.name}"
    return f"closure cell {record.name} of {record.module}"


class InlinedSource(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    module: str
    first_line: int
    last_line: int
    sha256: str
    function: str = ""
    """The qualified name of the function these lines are (`Block.forward`), by which load finds it where
    a release moved it; "" for code no name finds (a lambda's line) and in artifacts written before it
    (which named only a def whose name, and each enclosing name, no other def of its module shared)."""
    token_sha256: str = ""
    """The sha256 of the lines' tokens, apart from comments, blank lines and spacing (source_checks.py's
    `code_tokens_sha256`): load passes text that changed only there. "" where the lines do not tokenize
    on their own, where capture found them edited since they ran, and in artifacts written before it."""
    place: int = 0
    """Which of its module's defs of the name `function` these lines are, in source order (a property's
    getter and setter share a name, and so do the defs of an `if`'s branches)."""
    same_named: int = 0
    """How many other defs of its module shared the name `function` at capture: load refuses where the
    count changed (a def added under the same name runs instead of the one captured)."""
    copies: int = 1
    """For lines no def spans (a lambda's): at how many places of its module the same text sat at
    capture, which load counts again where the lines moved (a twin edited leaves one fewer)."""


class InlinedFile(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A sha256 of a module's source file bytes, recorded where every INLINED_SOURCES range of that
    module hashed as recorded against exactly those bytes: at load a file that still has them
    passes all its ranges without reading its lines; any other file has its ranges hashed one by one."""

    module: str
    sha256: str
    """Of the bytes `spans` cover, joined in their order; of the whole file where `spans` is empty."""
    spans: tuple[tuple[int, int], ...] = ()
    """The [start, end) byte offsets of each inlined line range in the file and of its first two lines
    (where an encoding is declared), each beginning a line and ending one (or the file), sorted; empty
    in artifacts written before it and for a file whose lines are not its bytes decoded as UTF-8
    (another encoding, a byte-order mark, carriage returns)."""


class MakeFxMetadata(ArtifactHeader, frozen=True, kw_only=True, tag="make_fx", tag_field="TRACER"):
    """The calling convention of a MakeFxTracer artifact."""

    num_positional_args: int
    module_positions: tuple[int, ...]
    module_keywords: tuple[str, ...] = ()
    """The keyword arguments that pass an nn.Module, in the captured call's order: their state follows
    that of the positional modules, and the driver takes them by name (stated only where there are)."""
    params: tuple[NamedTensor, ...]
    """Parameters of the module arguments (positional, then by keyword), in order; a tied weight appears once, under its first name."""
    buffers: tuple[NamedTensor, ...]
    in_spec: str
    """pytree spec (treespec_dumps) of fn's arguments but the modules: a dict of the positional args by
    position, then the keyword arguments by name, in the captured call's order."""
    inputs: tuple[Leaf, ...]
    out_spec: str
    outputs: tuple[Leaf, ...]
    grad_param_indices: tuple[int, ...]
    """Indices into `params` whose gradients the graph returns after fn's outputs."""
    specialized: tuple[SpecializedValue, ...] = ()
    """What the trace read besides tensors (absent in artifacts written before it was recorded)."""
    inlined_sources: tuple[InlinedSource, ...] = ()
    """The line range and text sha256 of each function the trace ran outside torch, precompile and the
    standard library (the model's forwards, a library's helpers): the graph baked in what that code
    computed, so load refuses where one's text changed. Empty in artifacts written before it, and for
    code of __main__."""
    inlined_files: tuple[InlinedFile, ...] = ()
    """The file proofs of `inlined_sources`, as DynamoMetadata's."""


class DynamoFrame(msgspec.Struct, frozen=True, kw_only=True):
    """A code object Dynamo compiled during the capture: the entry, a graph-break continuation, or
    (installed artifacts) a function the captured code reaches by an ordinary call."""

    name: str
    module: str
    variants: int
    resume_names: tuple[str, ...] = ()
    """The global names Dynamo's transformed bytecode calls this continuation by (empty for the entry)."""
    bypassed: bool = False
    runs_as_python: bool = False
    """A continuation that compiled no graph and starts no further continuation: the artifact runs
    its original bytecode, as the capture did, rather than through guarded variants (it has none)."""
    qualname: str = ""
    """Where the frame's code lives in `module`: the function's qualified name (e.g. `Block.forward`);
    for a continuation, the name Dynamo gave its code. Empty in artifacts written before it was recorded."""
    first_line: int = 0
    """The first source line of the frame's code (0: not recorded)."""
    installed: bool = False
    """Reached by an ordinary call (a graph break inside a child module's forward), not through a
    continuation: loading installs its variants onto the live code object `module.qualname`."""


class VariantGuards(msgspec.Struct, frozen=True, kw_only=True):
    """What one compiled variant of a frame checks before it serves a call, readably."""

    frame: str
    variant: int
    checks: tuple[str, ...]
    """`GUARD_TYPE source` per kept guard, then the shape guards as expressions."""
    dropped: tuple[str, ...] = ()
    """`GUARD_TYPE source` per guard the filter dropped from this variant: not checked."""
    policy_dropped: tuple[str, ...] = ()
    """`GUARD_TYPE source` per kept guard the invariance policy took out: it held identically in
    every captured variant of the frame, so it told none apart; not checked either."""
    by_name: tuple[str, ...] = ()
    """`GUARD_TYPE source is module:qualname[@unwraps]` per identity guard Dynamo cannot serialize
    that the driver checks instead against the object that name resolves to at load (`@N`: follow
    `__wrapped__` N times). Their slots are listed in `checks` too."""
    rendered: str = ""
    """An installed artifact's variant (its guards are rebuilt at load from the pickled state): its kept
    checks as a standalone artifact renders them (tensor rows, global state, guard function), for
    readers only, never executed, so that inspect shows and diff compares what they check alike
    whichever serving mode captured it. Empty where the capture could not render them, and in a
    standalone artifact, whose python_code holds them as code."""
    dispatch_modes: tuple[str, ...] = ()
    """An installed artifact's variant: what its call ran under that changes how torch's tensor guards
    read dispatch keys ("inference_mode", "autocast:<device type>"); load rebuilds the variant's guards
    under them, as Dynamo built them at capture. A standalone artifact renders them on its tensor
    check (`_TensorMatch(..., modes=...)`)."""


class CompiledSubgraph(msgspec.Struct, frozen=True, kw_only=True):
    """A graph Dynamo compiled, and the python_code names its lowered source is bound to."""

    backend_id: str
    """The global name Dynamo's transformed bytecode calls the graph by."""
    frame: str
    forward: str
    """What serves the graph: the ATen def (eager), the callable over the forward output module
    (served_by "inductor_runtime"), or the string holding the forward output module ("aotautograd")."""
    backward: str = ""
    """backend="inductor" with grad: the backward output module's callable ("inductor_runtime") or
    string ("aotautograd")."""
    served_by: str = ""
    """"aten", "inductor_runtime" (the output modules called directly, no AOTAutograd) or
    "aotautograd" (its pickled wrappers load the output modules). "" was written before this field:
    "aten" for backend="eager", "aotautograd" for backend="inductor"."""
    fallback_reason: str = ""
    """Why an inductor subgraph is served by AOTAutograd rather than directly."""


class DynamoMetadata(ArtifactHeader, frozen=True, kw_only=True, tag="dynamo", tag_field="TRACER"):
    """What a DynamoTracer artifact captured: its frames, their guards and the capture's summary."""

    fn_module: str
    frames: tuple[DynamoFrame, ...]
    guards: tuple[VariantGuards, ...]
    summary: PrecompileSummary
    inlined_sources: tuple[InlinedSource, ...] = ()
    inlined_files: tuple[InlinedFile, ...] = ()
    """Empty in artifacts written before it: every range is hashed at load."""
    subgraphs: tuple[CompiledSubgraph, ...] = ()
    """Empty in artifacts that carried their compiled graphs inside the opaque state."""


# Every metadata layout a reader understands, told apart by the TRACER literal.
ArtifactMetadata = Union[MakeFxMetadata, DynamoMetadata]


class MetadataHeader(msgspec.Struct, frozen=True, kw_only=True, rename="upper"):
    """What load acts on before python_code runs, decoded alone from a cache's typed metadata: the
    whole (a Dynamo artifact's guards and summary, most of its bytes) is decoded when first read."""

    format_version: int
    tracer: Literal["make_fx", "dynamo"]
    backend: Backend
    serving_mode: Literal["standalone", "installed"] = "standalone"
    fn_name: str
    subgraphs: tuple[CompiledSubgraph, ...] = ()


def header_of(metadata: ArtifactMetadata) -> MetadataHeader:
    """The MetadataHeader of metadata at hand."""
    return MetadataHeader(format_version=metadata.format_version, tracer="dynamo" if isinstance(metadata, DynamoMetadata) else "make_fx",
                          backend=metadata.backend, serving_mode=metadata.serving_mode, fn_name=metadata.fn_name,
                          subgraphs=metadata.subgraphs if isinstance(metadata, DynamoMetadata) else ())
