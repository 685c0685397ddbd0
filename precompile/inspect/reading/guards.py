"""What an artifact checks before serving a call, and what it does not.

MakeFx artifacts have no guards: the trace is specialized on the calling convention (argument
structure, tensor shapes, dtypes and devices, baked-in constants, the model's parameters and
buffers) and the driver refuses any call that differs. Dynamo artifacts will fill `frames` with
their guard slots (kept, dropped, risky, policy-dropped) keyed by (guard_type, source).
"""
from __future__ import annotations

import ast
import re

from precompile.artifact.metadata import (
    ConstantLeaf,
    DynamoMetadata,
    MakeFxMetadata,
    NamedTensor,
    SpecializedValue,
    specialized_source,
)
from precompile.inspect.model.artifact import (
    Artifact,
    FrameGuards,
    Guards,
    GuardSlot,
    SlotStatus,
    Specialization,
    SpecializationKind,
    UpstreamCodeInfo,
)
from precompile.inspect.parsing.rendered_guards import Rendered, global_state_rows, rendered_checks, shape_text, tensor_rows

_NOT_CHECKED_ALWAYS = (
    "tensor values: control flow that depended on them was fixed at capture",
    "Python state fn reads besides its arguments (globals, closures, module attributes other than parameters and buffers)",
)
_NOT_CHECKED_READS = (
    "tensor values: control flow that depended on them was fixed at capture",
    "Python state read other than by a plain attribute, global or closure load of the code the trace ran (getattr "
    "with a computed name, items of dicts and lists, what a C extension reads)",
    "Python state fn sets: a served call does not set it",
)


def makefx_guards(meta: MakeFxMetadata, records_autograd: bool = False) -> Guards:
    """`records_autograd`: python_code has an autograd-graph section, which runs the calls autograd
    records (artifacts rendered before it returned every result without autograd history)."""
    specs: list[Specialization] = []
    for leaf in meta.inputs:
        if isinstance(leaf, ConstantLeaf):
            specs.append(Specialization(kind="constant", path=leaf.path, value=repr(leaf.value)))
            continue
        specs.append(Specialization(kind="shape", path=leaf.path, value=shape_text(leaf.shape) + _unbacked_text(leaf)))
        specs.append(Specialization(kind="dtype", path=leaf.path, value=leaf.dtype))
        specs.append(Specialization(kind="device", path=leaf.path, value=leaf.device))
        if leaf.stride is not None:
            specs.append(Specialization(kind="stride", path=leaf.path, value=shape_text(leaf.stride)))
    module_tensors: tuple[tuple[SpecializationKind, tuple[NamedTensor, ...]], ...] = (
        ("param", meta.params), ("buffer", meta.buffers))
    for kind, tensors in module_tensors:
        for tensor in tensors:
            layout = f" stride {shape_text(tensor.stride)}" if tensor.stride is not None else ""
            specs.append(Specialization(kind=kind, path=tensor.name, value=f"{shape_text(tensor.shape)} {tensor.dtype} {tensor.device}{layout}"))
    for record in meta.specialized:
        specs.append(Specialization(kind=record.kind, path=_reads_path(record), value=record.value, risky=not record.checked))
    unchecked = tuple(f"{specialized_source(r)} = {r.value}: a served call cannot reach it, so the captured value is used"
                      for r in meta.specialized if not r.checked)
    strides_checked = any(getattr(t, "stride", None) is not None for t in (*meta.inputs, *meta.params, *meta.buffers))
    not_checked = (_NOT_CHECKED_READS + unchecked if meta.specialized else _NOT_CHECKED_ALWAYS) + (
        () if strides_checked else ("strides and memory format of the inputs (the eager backend accepts any layout)",)
    ) + (() if records_autograd else (
        "autograd: no autograd-graph section, so a call autograd records (grad on, a tensor requiring grad) is refused "
        "(a training step's result, and any result of an artifact rendered before the section, carries no autograd history)",))
    return Guards(
        tracer="make_fx",
        has_guards=False,
        headline=(
            "no guards: a MakeFx artifact is specialized on the calling convention (shapes, dtypes, devices, "
            "constants, parameters and buffers)"
            + (", torch's global state and the Python values its trace read (model attributes, module globals)"
               if meta.specialized else "")
            + " and its driver refuses any call that differs"
        ),
        not_checked=not_checked,
        frames=(FrameGuards(frame=meta.fn_name, variant=0, slots=()),),
        specializations=tuple(specs),
    )


def _unbacked_text(leaf) -> str:
    """The bounds a served call checks of each dim marked with mark_unbacked (`; dim 0 unbacked u0 in [2, 8]`)."""
    marked = getattr(leaf, "unbacked", None) or {}
    return "".join(f"; dim {dim} unbacked {info.symbol} in [{info.min or 0}, {'inf' if info.max is None else info.max}]"
                   for dim, info in sorted(marked.items()))


def _reads_path(record: SpecializedValue) -> str:
    """A specialized value's path in the guard table (its kind says what it is)."""
    if record.kind == "global_state":
        return record.name
    if record.kind == "global":
        return f"{record.module}.{record.name}"
    if record.kind == "closure":
        return f"{record.module}: {record.name}"
    return specialized_source(record)


DROPPED_FRAME = "(every frame)"


TYPE_ALIASES = {
    "shape": {"SHAPE_ENV", "TENSOR_MATCH", "shape"},
    "dtype": {"TENSOR_MATCH", "dtype"},
    "device": {"TENSOR_MATCH", "device"},
    "stride": {"TENSOR_MATCH", "stride"},
    "tensor": {"TENSOR_MATCH"},
}


# What follows a slot's label in the label of a check that stands in for it: `(key)`, `is <name>`,
# `== <literal>`, and the parts of a function a by-name check compares (CLOSURE_MATCH `model.act.__code__.
# co_code == ...`, FORWARD_MATCH `model.forward.__func__.__qualname__ == ...`, or its `__call__`'s).
_LABEL_ENDS = (" (", ": ", " is ", " == ", ".__code__.", ".__module__ ", ".forward.", ".__call__.")


def _check_index(checks: dict[str, str]) -> dict[str, list[str]]:
    """{slot label: the rendered conditions whose label is it, or it followed by one of _LABEL_ENDS},
    in the order rendered: built once per variant, so matching a slot is a lookup, not a scan."""
    index: dict[str, list[str]] = {}
    for label, check in checks.items():
        prefixes = {label} | {label[:at] for end in _LABEL_ENDS for at in _occurrences(label, end)}
        for prefix in prefixes:
            index.setdefault(prefix, []).append(check)
    return index


def _occurrences(text: str, part: str) -> list[int]:
    found, at = [], text.find(part)
    while at >= 0:
        found.append(at)
        at = text.find(part, at + 1)
    return found


# Dynamo's spelling of a read from a class's own dict, `dict(type(X).__dict__)[...]`, and the walk a
# by-name check labels it with, `type(X).__dict__[...]` (capturing/dynamo/named_identity.py `walkable`).
_ROOT, _STEP = r"(?:[LG]\['[^'\]]+'\]|[A-Za-z_]\w*)", r"(?:\.\w+|\[\d+\]|\['[^'\]]+'\])"
_CLASS_DICT = re.compile(rf"dict\((type\({_ROOT}{_STEP}*\){_STEP}*\.__dict__)\)")


def _labelled(label: str, index: dict[str, list[str]]) -> list[str]:
    """The entries of `index` under a slot's label, or under its by-name check's spelling of it."""
    return index.get(label) or index.get(_CLASS_DICT.sub(r"\1", label), [])


def _kept_check(slot_label: str, checks: dict[str, str], index: dict[str, list[str]]) -> str:
    """The rendered condition(s) of a kept slot, matched by its label."""
    if slot_label.startswith("TENSOR_MATCH") and "TENSOR_MATCH" in checks:
        return checks["TENSOR_MATCH"] + "  (one TensorGuards call for every tensor)"
    return " and ".join(dict.fromkeys(_labelled(slot_label, index)))


def readable_source(meta: DynamoMetadata, source: str | bytes | None,
                    lines: Rendered | None) -> tuple[str | bytes | None, Rendered | None]:
    """Where a Dynamo artifact's checks are rendered as code, and where python_code renders them: its
    python_code (`source`, `lines`), or, for an installed artifact, the text each variant carries in its
    metadata (`VariantGuards.rendered`), read by the same readers, so that both serving modes read alike."""
    rendered = [variant.rendered for variant in meta.guards if variant.rendered]
    if meta.serving_mode == "installed" and rendered:
        return "\n\n\n".join(rendered) + "\n", None
    return source, lines


def dynamo_guards(meta: DynamoMetadata, source: str | bytes | None = None,
                  lines: Rendered | None = None) -> Guards:
    """Per variant, the guards it keeps (with the condition that checks each, where python_code
    renders them); first, under DROPPED_FRAME, the slots no variant checks. `lines`: where python_code
    renders them (`reader.rendered_guards_found`), so that python_code is not parsed again."""
    source, lines = readable_source(meta, source, lines)
    origins: dict[tuple[str, int], dict[str, str]] = {}
    rendered_by_variant = rendered_checks(source, meta, lines, origins)
    tensors = tensor_rows(source, lines)
    global_state = global_state_rows(source, lines)
    frame_index = {frame.qualname or frame.name: index for index, frame in enumerate(meta.frames)}
    summary = meta.summary
    risky = set(map(tuple, summary.risky_dropped_guards))
    rendered = {(t, s): check for t, s, check in summary.dropped_guard_code}

    def unchecked(slot, by_policy: bool) -> GuardSlot:
        slot = tuple(slot)
        is_risky = not by_policy and slot in risky
        status: SlotStatus = "policy_dropped" if by_policy else "risky_dropped" if is_risky else "dropped"
        return GuardSlot(guard_type=slot[0], source=slot[1], status=status, check=rendered.get(slot, ""), risky=is_risky)

    dropped = tuple(unchecked(slot, False) for slot in summary.dropped_guards) + tuple(
        unchecked(slot, True) for slot in summary.policy_dropped_guards
    )
    frames = [FrameGuards(frame=DROPPED_FRAME, variant=0, slots=dropped)]
    indexes: dict[tuple[str, int], dict[str, list[str]]] = {}  # each variant's checks by label
    origin_indexes: dict[tuple[str, int], dict[str, list[str]]] = {}  # and the user lines behind them
    for variant in meta.guards:
        slots = []
        for check in variant.checks:
            guard_type, _, source = check.partition(" ")
            if not guard_type.isupper():  # a shape guard: an expression over the inputs' sizes
                guard_type, source = "SHAPE_ENV", check
            checks = rendered_by_variant.get((variant.frame, variant.variant), {})
            if (variant.frame, variant.variant) not in indexes:
                indexes[variant.frame, variant.variant] = _check_index(checks)
            runs = _kept_check(f"{guard_type} {source}".strip(), checks, indexes[variant.frame, variant.variant])
            at = (frame_index.get(variant.frame, -1), variant.variant)
            tensor = tensors.get(at, {}).get(source)
            if guard_type == "TENSOR_MATCH" and tensor is not None:
                runs = tensor
            if guard_type == "GLOBAL_STATE" and at in global_state:
                runs = ", ".join(f"{field} {value}" for field, value in global_state[at].items())
            made_at = origins.get((variant.frame, variant.variant), {})
            if (variant.frame, variant.variant) not in origin_indexes:
                origin_indexes[variant.frame, variant.variant] = _check_index(made_at)
            label = f"{guard_type} {source}".strip()  # its own label first, as the checks are matched
            origin = made_at.get(label) or next(iter(_labelled(label, origin_indexes[variant.frame, variant.variant])), "")
            slots.append(GuardSlot(guard_type=guard_type, source=source, status="kept", check=runs, origin=origin))
        # Artifacts since per-variant accounting also say which slots each variant does not check.
        slots += [unchecked(check.partition(" ")[::2], False) for check in variant.dropped]
        slots += [unchecked(check.partition(" ")[::2], True) for check in variant.policy_dropped]
        unique = tuple(dict.fromkeys(slots))  # a shape guard Dynamo lists twice is one check
        frames.append(FrameGuards(frame=variant.frame, variant=variant.variant, slots=unique))
    return Guards(
        tracer="dynamo",
        has_guards=True,
        headline=str(summary),
        not_checked=tuple(f"{slot.guard_type} {slot.source}".strip() + (" (RISKY)" if slot.risky else "") for slot in dropped)
        or ("nothing: every guard Dynamo produced is checked",),
        frames=tuple(frames),
    )


def upstream_guards(code: UpstreamCodeInfo) -> Guards:
    """Upstream precompile's python_code is a MakeFx capture too: its driver checks the literals."""
    values = {}
    for literal in code.literals:
        try:
            values[literal.name] = ast.literal_eval(literal.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            values[literal.name] = None

    def column(name: str) -> list:
        value = values.get(name)
        return list(value) if isinstance(value, (list, tuple)) else []

    specs: list[Specialization] = []
    shapes, dtypes, devices = column("USER_INPUT_SHAPES"), column("USER_INPUT_DTYPES"), column("USER_INPUT_DEVICES")
    for index in range(max(len(shapes), len(dtypes), len(devices))):
        path = f"input leaf {index}"
        input_columns: tuple[tuple[SpecializationKind, list], ...] = (("shape", shapes), ("dtype", dtypes), ("device", devices))
        for kind, items in input_columns:
            if index < len(items) and items[index] is not None:
                specs.append(Specialization(kind=kind, path=path, value=shape_text(items[index]) if kind == "shape" else str(items[index])))
    module_prefixes: tuple[tuple[SpecializationKind, str], ...] = (("param", "PARAM"), ("buffer", "BUFFER"))
    for kind, prefix in module_prefixes:
        names, shapes, dtypes, devices = (column(f"{prefix}_{part}") for part in ("NAMES", "SHAPES", "DTYPES", "DEVICES"))
        for index, name in enumerate(names):
            parts = [shape_text(shapes[index]) if index < len(shapes) else "?", *(str(col[index]) for col in (dtypes, devices) if index < len(col))]
            specs.append(Specialization(kind=kind, path=str(name), value=" ".join(parts)))
    return Guards(
        tracer="make_fx",
        has_guards=False,
        headline=(
            "no guards: an upstream torch.compiler.precompile artifact (make_fx) is specialized on its calling-convention "
            "literals, and its driver refuses a call whose input shapes, dtypes, devices or parameters differ"
        ),
        not_checked=_NOT_CHECKED_ALWAYS + (
            ("strides of the inputs and weights (only the inductor backend's kernels assert them)",)
            if code.backend == "inductor" else ("strides and memory format of the inputs (the eager backend accepts any layout)",)
        ),
        frames=(FrameGuards(frame="(upstream precompile fn)", variant=0, slots=()),),
        specializations=tuple(specs),
    )


def guards_of(artifact: Artifact, source: str | bytes | None = None) -> Guards | None:
    """`source`: python_code's text, where a Dynamo artifact's rendered checks should be shown."""
    if artifact.python_code.upstream is not None:
        return upstream_guards(artifact.python_code.upstream)
    meta = artifact.python_code.metadata
    if isinstance(meta, MakeFxMetadata):
        return makefx_guards(meta, any(section.slug == "autograd-graph" for section in artifact.python_code.sections))
    if isinstance(meta, DynamoMetadata):
        return dynamo_guards(meta, source, rendered_lines(artifact, source))
    return None


def rendered_lines(artifact: Artifact, source: str | bytes | None) -> Rendered | None:
    """Where python_code (`source`, as read for the artifact) renders its guards, from the parse that
    read it (None: parse it again a part at a time)."""
    from precompile.inspect.reading.reader import rendered_guards_found

    if not isinstance(source, bytes) or not artifact.python_code.path:
        return None
    return rendered_guards_found(source, artifact.python_code.path)


def filter_values(guards: Guards) -> tuple[list[str], list[str]]:
    """The --type values and the --frame values that select something of `guards`."""
    types = sorted({s.guard_type for f in guards.frames for s in f.slots} | {s.kind for s in guards.specializations}
                   | (set(TYPE_ALIASES) if guards.has_guards else set()))
    frames = sorted({f.frame for f in guards.frames} | {str(f.variant) for f in guards.frames})
    return types, frames


def filtered(guards: Guards, *, frame: str | None, kind: str | None, risky_only: bool) -> Guards:
    """The slots of `frame` (a name or variant number) of type `kind` (a guard type, a specialization
    kind or an alias such as `shape`); an unknown value of either is a PrecompileError listing the known."""
    import msgspec

    from precompile.errors import PrecompileError

    types, frame_names = filter_values(guards)
    if kind is not None and kind not in types:
        raise PrecompileError(f"--type {kind!r} selects nothing in this artifact; it has: {', '.join(types) or 'no guards'}")
    if frame is not None and frame not in frame_names:
        raise PrecompileError(f"--frame {frame!r} names no frame or variant of this artifact; it has: {', '.join(frame_names)}")
    wanted = TYPE_ALIASES.get(kind or "", {kind})
    frames = tuple(
        msgspec.structs.replace(
            f,
            slots=tuple(s for s in f.slots if (kind is None or s.guard_type in wanted) and (not risky_only or s.risky)),
        )
        for f in guards.frames
        if frame is None or f.frame == frame or str(f.variant) == frame
    )
    specs = tuple(
        s for s in guards.specializations if (kind is None or s.kind in wanted) and (not risky_only or s.risky)
    )
    if frame is not None and not frames:
        specs = ()
    return msgspec.structs.replace(guards, frames=frames, specializations=specs)
