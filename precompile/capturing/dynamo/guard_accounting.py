"""Guard accounting of a DynamoTracer capture: every guard as a (guard_type, source) slot, and per
frame variant which slots were kept, dropped by the filter, or dropped by the invariance policy.

The filter sees each compile's guards as Dynamo builds them (`GuardLedger`); the package holds what
landed. `account_frame` joins the two per variant and applies the policy.
"""
from __future__ import annotations

import copy
import enum
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Callable

import torch

from precompile.artifact.metadata import VariantGuards
from precompile.capturing.dynamo.named_identity import FORWARD_MATCH, code_checks, forward_checks, named_check, valued_check
from precompile.capturing.dynamo.tensor_keys import DispatchState, dispatch_state
from precompile.errors import CaptureRefused

# Guard types Dynamo's guard serializer refuses, alone or as a type a guard's check derives (the
# default filter drops them; torch 2.13's CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES).
UNSERIALIZABLE = frozenset({
    "DICT_VERSION", "NN_MODULE", "ID_MATCH", "FUNCTION_MATCH", "CLASS_MATCH", "MODULE_MATCH", "CLOSURE_MATCH",
    "WEAKREF_ALIVE",
})


def serializable_by_default(entry) -> bool:
    """The default filter: keep what Dynamo's serializer can write. A type check on a type it cannot
    name again (a class defined inside a function) is refused by the serializer too."""
    if UNSERIALIZABLE & {entry.guard_type, *entry.derived_guard_types}:
        return False
    return not getattr(entry.orig_guard, "_unserializable", False)

_LOCAL = re.compile(r"L\['([^']+)'\]")


def slot_source(name: str) -> str:
    """A guard's source with the local scope stripped: L['self'].act -> self.act; G[...] unchanged."""
    return _LOCAL.sub(r"\1", name)


UNKEPT = object()
"""Seen.value where the value is no constant a check could compare with."""
# Values a kept constant guard is rendered for (guard_code checks each reads back as a literal).
_CONSTANT_TYPES = (int, float, str, bytes, complex, tuple, list, frozenset, set, bool, type(None), torch.dtype, torch.device)
# Guard types whose rendering reads what their source held (the rest read the saved guard state).
_SEEN_KINDS = frozenset({"CONSTANT_MATCH", "EQUALS_MATCH", "TYPE_MATCH", "FAKE_SCRIPT_TYPE_MATCH", "DICT_KEYS_MATCH",
                         "SEQUENCE_LENGTH", "HASATTR", "OPAQUE_OBJ_GUARD_FN_MATCH"})


@dataclass(frozen=True)
class Seen:
    """What a kept guard's source held when Dynamo built the guard, read from the live object the
    guard filter is handed, not from the pickled guard state: unpickling rebuilds objects (a dict
    subclass replays its own __setitem__), and it holds no value for sources it could not pickle."""

    type: type
    value: object = UNKEPT
    keys: tuple | None = None
    length: int | None = None
    has_attribute: bool | None = None
    dispatch: DispatchState | None = None
    """A TENSOR_MATCH's: the dispatch key sets its compile ran under (tensor_keys)."""


def seen_key(guard) -> tuple:
    """What tells one guard's Seen from another's: its type, its source and the attribute or key it
    names (one source carries a HASATTR per attribute)."""
    keywords = getattr(guard.create_fn, "keywords", None) or {}
    return (guard.create_fn_name(), guard.name, repr(keywords.get("attr")), repr(keywords.get("key")))


def seen(entry) -> Seen | None:
    """What the renderer needs of one guard filter entry (a GuardFilterEntry) at the moment Dynamo
    offers it, or None for a guard kind that reads nothing of it (tensors, ambient state)."""
    if entry.guard_type not in _SEEN_KINDS or not entry.has_value:
        return None
    value = entry.value
    from precompile.torch_compat import FakeTensor

    if entry.guard_type in ("FAKE_SCRIPT_TYPE_MATCH", "OPAQUE_OBJ_GUARD_FN_MATCH") and type(value).__name__ == "FakeScriptObject":
        value = getattr(value, "real_obj", value)  # torch's check compares the real object's type
    kind = (getattr(value, "pytype", None) if isinstance(value, FakeTensor) else None) or type(value)
    constant = UNKEPT
    if entry.guard_type in ("CONSTANT_MATCH", "EQUALS_MATCH") and type(value) in _CONSTANT_TYPES:
        try:
            constant = copy.deepcopy(value)  # a list or set could change after the compile
        except Exception:  # a value that does not copy is no constant here
            constant = UNKEPT
    try:
        length = len(value) if entry.guard_type == "SEQUENCE_LENGTH" else None
    except Exception:  # no length: the guard is not rendered (Unrenderable says so)
        length = None
    attr = (getattr(entry.orig_guard.create_fn, "keywords", None) or {}).get("attr")
    return Seen(
        type=kind, value=constant, length=length,
        keys=tuple(dict.keys(value)) if entry.guard_type == "DICT_KEYS_MATCH" and isinstance(value, dict) else None,
        has_attribute=hasattr(value, attr) if entry.guard_type == "HASATTR" and isinstance(attr, str) else None,
    )


@dataclass(frozen=True)
class _Compile:
    """The filter's verdicts for one compile of one code object."""

    code: tuple | None
    """(co_name, co_filename, co_firstlineno) of the compiled code: a live code object and the
    package's serialized copy of it agree on these."""
    kept: frozenset
    dropped: tuple
    values: dict
    """What each dropped slot held in this compile (see `_value_key`), where comparable."""
    named: dict
    """Slots the artifact checks by name or value instead of Dynamo's check: {slot: check lines}
    (named_identity: a dropped identity guard's, a closure's code, a module class's forward)."""
    seen: dict = field(default_factory=dict)
    """What each kept guard's source held as Dynamo built it: {seen_key(guard): Seen}."""


@dataclass
class GuardLedger:
    """Every guard Dynamo offered the filter, as (type, source) slots with their verdicts, per compile.

    A dropped slot is risky (the spec's rule) when it hangs off a configuration-chosen slot (see
    `configuration_chosen`, decided here) or when it told captured variants apart (decided per frame
    by `account_frame`). Any other drop, whoever's filter made it, is listed, not refused.
    """

    user_filter: Callable | None
    compiles: list = field(default_factory=list)
    configured: set = field(default_factory=set)
    rendered: dict = field(default_factory=dict)
    seen: dict = field(default_factory=dict)
    """{(frame qualname, variant): what its kept guards' sources held}, filled by `account_frame`."""

    def __call__(self, entries):
        # Dynamo calls the filter from the guard builder of the code it compiles (torch 2.13: a local
        # named f_code); the frame names which code's variant these verdicts belong to.
        compiled_code = sys._getframe(1).f_locals.get("f_code")
        code = code_key(compiled_code if isinstance(compiled_code, types.CodeType) else None)
        default = [serializable_by_default(e) for e in entries]
        wanted = list(self.user_filter(entries)) if self.user_filter is not None else default
        if len(wanted) != len(entries):
            raise CaptureRefused(f"guard_filter_fn returned {len(wanted)} flags for {len(entries)} guards; return one per guard")
        kept, dropped, values, held = set(), [], {}, {}
        named: dict[tuple[str, str], tuple[str, ...]] = {}
        classes: set = set()
        dispatch = dispatch_state()
        for entry, by_default, by_user in zip(entries, default, wanted):
            slot = (entry.guard_type, slot_source(entry.name))
            if by_default and by_user:
                kept.add(slot)
                forward = forward_checks(entry, classes)
                if forward is not None:
                    named[(FORWARD_MATCH, slot[1])] = forward
                facts = Seen(type=type(entry.value), dispatch=dispatch) if entry.guard_type == "TENSOR_MATCH" else seen(entry)
                if facts is not None:
                    held[seen_key(entry.orig_guard)] = facts
                continue
            if slot not in dropped:
                dropped.append(slot)
            # Only what the serializer refused is checked by name; a drop the caller chose stays one.
            lines = None
            if by_user or self.user_filter is None:
                check = named_check(entry) or valued_check(entry)
                lines = (check,) if check is not None else code_checks(entry)
            if lines is not None:
                named[slot] = lines
                continue
            value = _value_key(entry)
            if value is not None:
                values[slot] = value
            if configuration_chosen(entry):
                self.configured.add(slot)
            rendered = getattr(entry.orig_guard, "code_list", None)
            if rendered and slot not in self.rendered:
                self.rendered[slot] = render_check(joined_check(rendered))
        verdicts = [bool(by_default and by_user) for by_default, by_user in zip(default, wanted)]
        self.compiles.append(
            _Compile(code=code, kept=frozenset(kept), dropped=tuple(dropped), values=values, named=named, seen=held)
        )
        return verdicts

    def compile_of(self, code: tuple | None, kept: set, taken: set) -> _Compile | None:
        """The compile of `code` that kept exactly `kept` (each compile matched once).

        A compile whose code the filter could not see (another torch's guard builder) matches any code.
        """
        for index, record in enumerate(self.compiles):
            if index not in taken and record.code in (code, None) and record.kept == kept:
                taken.add(index)
                return record
        return None


_CONFIG_WORDS = re.compile(r"(?i)(?:^|[^a-z])(?:config|configuration|cfg|conf|settings|options|flags?)(?:[^a-z]|$)")
_MODULE_FLAG = re.compile(r"G\['[^'\]]+'\]")
_PLAIN_VALUES = (bool, int, float, str, bytes, type(None))


def configuration_chosen(entry) -> bool:
    """The risky-drop lint: a guard on a plain value chosen by configuration, either a module-level
    flag (G['USE_FAST']) or a field reached through something named as configuration
    (self.config.use_cache, G['CFG']['width'], cfg.depth). Dropping it means a process configured
    otherwise is served code compiled for this configuration."""
    value = entry.value if entry.has_value else None
    if not entry.has_value or isinstance(value, enum.Enum) or not isinstance(value, _PLAIN_VALUES):
        return False
    return bool(_MODULE_FLAG.fullmatch(entry.name) or _CONFIG_WORDS.search(entry.name))


def code_key(code) -> tuple | None:
    if code is None:
        return None
    return (code.co_name, code.co_filename, code.co_firstlineno)


@dataclass
class SlotLists:
    """The summary's slot lists, from the compiles that landed in the package."""

    kept: set = field(default_factory=set)
    dropped: set = field(default_factory=set)
    policy: set = field(default_factory=set)
    policy_code: dict = field(default_factory=dict)
    told_apart: set = field(default_factory=set)
    """Dropped slots whose values differed between variants of one frame (see `told_apart`)."""


def slot_text(slot: tuple[str, str]) -> str:
    return f"{slot[0]} {slot[1]}".strip()


def joined_check(code_parts) -> str:
    """A guard's check as one line, exactly as rendered (ids included: comparable within a capture)."""
    return " ; ".join(dict.fromkeys(code_parts or ()))


def render_check(check: str) -> str:
    """A joined check as the artifact shows it: process-local ids masked."""
    return _PROCESS_ID.sub("<id>", check)


_PROCESS_ID = re.compile(r"\b\d{9,}\b")
_IDENTITY_GUARDS = frozenset({"ID_MATCH", "CLOSURE_MATCH", "MODULE_MATCH", "BUILTIN_MATCH", "FUNCTION_MATCH", "NN_MODULE"})

# Kept guard types the invariance policy may take out of the serialized copy, and only when the slot
# held identically (same rendered check) in every captured variant of its frame: ambient state checks
# and identity pins that no captured variant was told apart by. Every other type is never policy-dropped.
POLICY_ELIGIBLE = _IDENTITY_GUARDS | UNSERIALIZABLE | {"AUTOGRAD_SAVED_TENSORS_HOOKS", "DUAL_LEVEL", "FUNCTORCH_STACK_MATCH"}


def policy_drops(variants: list[dict]) -> set:
    """The slots of a frame the invariance policy drops: eligible, and identical in every variant.

    `variants` holds, per variant, its kept slots mapped to their rendered check.
    """
    if not variants:
        return set()
    first = variants[0]
    return {
        slot for slot, check in first.items()
        if slot[0] in POLICY_ELIGIBLE and all(other.get(slot, None) == check for other in variants[1:])
    }


def _value_key(entry) -> str | None:
    """What a guard saw in its slot, comparable across the compiles of one frame; None where the value
    is data (tensors) or an object with no cheap identity of its value (a module, say)."""
    if not entry.has_value or isinstance(entry.value, torch.Tensor):
        return None
    if entry.guard_type in _IDENTITY_GUARDS:
        return f"id {id(entry.value)}"
    if entry.guard_type == "TYPE_MATCH":
        return f"type {type(entry.value).__module__}.{type(entry.value).__qualname__}"
    if isinstance(entry.value, torch.nn.Module):
        return None
    try:
        return repr(entry.value)
    except Exception:  # an object whose repr fails still counts as one value
        return f"<{type(entry.value).__name__} {id(entry.value)}>"


# Kept guards that pin a value rather than a type or a shape.
_PINNING = frozenset({"CONSTANT_MATCH", "EQUALS_MATCH", "CONSTANT_SUBCLASS_MATCH", "COUNT_ITERATOR_MATCH", "RANGE_ITERATOR_MATCH"})


def wont_generalize(guards: list[VariantGuards]) -> tuple[str, ...]:
    """Bare argument names some variant pins to a value while no variant of that frame guards them
    without pinning: as captured, no variant serves another value of them."""
    by_frame: dict[str, list[tuple[set, set]]] = {}
    for variant in guards:
        slots = [check.partition(" ")[::2] for check in variant.checks]
        pinned = {src for kind, src in slots if kind in _PINNING and src and "." not in src and "[" not in src}
        by_frame.setdefault(variant.frame, []).append((pinned, {src for _, src in slots}))
    found = set()
    for variants in by_frame.values():
        for pinned, _ in variants:
            for source in pinned:
                if all(source in other_pinned for other_pinned, other_guarded in variants if source in other_guarded):
                    found.add(source)
    return tuple(sorted(found))


def _guards_state(saved: bytes, name: str):
    """The guard state Dynamo saved for a variant of frame `name`, read back (the driver's `read_guards_state`);
    a CaptureRefused where this torch cannot (torch 2.11 saves a guard on a function's __defaults__,
    such as transformers' masking helpers carry, in a form its loader rejects)."""
    from precompile.codegen.drivers.dynamo_checks import read_guards_state

    try:
        return read_guards_state(saved)
    except Exception as exc:  # whatever unpickling torch's own state raises
        raise CaptureRefused(
            f"torch {torch.__version__} cannot read back the guard state it saved for {name} "
            f"({type(exc).__name__}: {exc}), so neither precompile nor torch's own package loader could check "
            "those guards. Capture with MakeFxTracer, or with another torch release"
        ) from exc


def account_frame(code, name: str, ledger: GuardLedger, slots: SlotLists, taken: set, read: dict) -> list[VariantGuards]:
    """Each captured variant of one package frame (`name`: its qualified name), readably: its kept
    checks (shape guards last), the slots the filter dropped in its compile, and those the
    invariance policy takes out. `read` gets each variant's guard state: {(name, variant): state}."""
    states = [_guards_state(guarded.guards_state, name) for guarded in code.guarded_codes]
    read.update({(name, index): state for index, state in enumerate(states)})
    kept = [
        {(g.create_fn_name(), slot_source(g.name)): joined_check(g.code_list) for g in state.output_graph.guards}
        for state in states
    ]
    policy = policy_drops(kept)
    for slot in policy:
        slots.policy.add(slot)
        if kept[0][slot]:
            slots.policy_code.setdefault(slot, render_check(kept[0][slot]))
    variants, compiles = [], []
    for index, (state, variant_kept) in enumerate(zip(states, kept)):
        record = ledger.compile_of(code_key(code.python_code), set(variant_kept), taken)
        compiles.append(record)
        ledger.seen[(name, index)] = record.seen if record else {}
        named = record.named if record else {}
        dropped = tuple(slot for slot in record.dropped if slot not in named) if record else ()
        checked = {slot for slot in variant_kept if slot not in policy} | set(named)
        slots.kept.update(checked)
        slots.dropped.update(dropped)
        exprs = tuple(slot_source(e) for e in state.shape_code_parts.python_code_parts.exprs)
        variants.append(VariantGuards(
            frame=name, variant=index,
            checks=(*sorted({slot_text(slot) for slot in checked}), *exprs),
            dropped=tuple(sorted({slot_text(slot) for slot in dropped})),
            policy_dropped=tuple(sorted({slot_text(slot) for slot in policy})),
            by_name=tuple(sorted(line for lines in named.values() for line in lines)),
        ))
    slots.told_apart |= told_apart(compiles)
    return variants


def told_apart(compiles: list) -> set:
    """The dropped slots that told a frame's captured variants apart: their compiles saw different
    values in the slot. Dispatch cannot notice the difference (the slot is not checked), so a call
    bringing one variant's value may be served by another's code."""
    seen: dict = {}
    for record in compiles:
        for slot, value in (record.values.items() if record else ()):
            seen.setdefault(slot, set()).add(value)
    return {slot for slot, values in seen.items() if len(values) > 1}
