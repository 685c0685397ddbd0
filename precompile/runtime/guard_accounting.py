"""Guard accounting of a DynamoTracer capture: every guard as a (guard_type, source) slot, and per
frame variant which slots were kept, dropped by the filter, or dropped by the invariance policy.

The filter sees each compile's guards as Dynamo builds them (`GuardLedger`); the package holds what
landed. `account_frame` joins the two per variant and applies the policy.
"""
from __future__ import annotations

import re
import sys
import types
from dataclasses import dataclass, field
from typing import Callable

import torch

from precompile.errors import PrecompileError
from precompile.schema.metadata import VariantGuards

# Guard types the serializer refuses, alone or as a type a guard's check derives (the default filter).
UNSERIALIZABLE = frozenset({"ID_MATCH", "CLOSURE_MATCH", "WEAKREF_ALIVE", "DICT_VERSION"})

_LOCAL = re.compile(r"L\['([^']+)'\]")


def slot_source(name: str) -> str:
    """A guard's source with the local scope stripped: L['self'].act -> self.act; G[...] unchanged."""
    return _LOCAL.sub(r"\1", name)


@dataclass(frozen=True)
class _Compile:
    """The filter's verdicts for one compile of one code object."""

    code: tuple | None
    """(co_name, co_filename, co_firstlineno) of the compiled code: a live code object and the
    package's serialized copy of it agree on these."""
    kept: frozenset
    dropped: tuple


@dataclass
class GuardLedger:
    """Every guard Dynamo offered the filter, as (type, source) slots with their verdicts, per compile.

    A dropped slot is risky when a custom filter dropped what the default keeps, or when it held
    different values across the compiles that dropped it (it told captured variants apart).
    """

    user_filter: Callable | None
    compiles: list = field(default_factory=list)
    risky: set = field(default_factory=set)
    values: dict = field(default_factory=dict)
    rendered: dict = field(default_factory=dict)

    def __call__(self, entries):
        default = [not (UNSERIALIZABLE & {e.guard_type, *e.derived_guard_types}) for e in entries]
        wanted = list(self.user_filter(entries)) if self.user_filter is not None else default
        if len(wanted) != len(entries):
            raise PrecompileError(f"guard_filter_fn returned {len(wanted)} flags for {len(entries)} guards; return one per guard")
        verdicts, kept, dropped = [], set(), []
        for entry, by_default, by_user in zip(entries, default, wanted):
            keep = bool(by_default and by_user)
            slot = (entry.guard_type, slot_source(entry.name))
            if keep:
                kept.add(slot)
            elif slot not in dropped:
                dropped.append(slot)
            if by_default and not by_user:
                self.risky.add(slot)  # a custom filter dropped what the default keeps
            if not keep:
                value = _value_key(entry)
                if value is not None:
                    seen = self.values.setdefault(slot, set())
                    seen.add(value)
                    if len(seen) > 1:
                        self.risky.add(slot)
                code = getattr(entry.orig_guard, "code_list", None)
                if code and slot not in self.rendered:
                    self.rendered[slot] = render_check(joined_check(code))
            verdicts.append(keep)
        # Dynamo calls the filter from the guard builder of the code it compiles (torch 2.13: a local
        # named f_code); the frame names which code's variant these verdicts belong to.
        compiled_code = sys._getframe(1).f_locals.get("f_code")
        if not isinstance(compiled_code, types.CodeType):
            compiled_code = None
        self.compiles.append(_Compile(code=code_key(compiled_code), kept=frozenset(kept), dropped=tuple(dropped)))
        return verdicts

    def dropped_by(self, code: tuple, kept: set, taken: set) -> tuple | None:
        """The slots the filter dropped in the compile of `code` that kept exactly `kept` (once each).

        A compile whose code the filter could not see (another torch's guard builder) matches any code.
        """
        for index, record in enumerate(self.compiles):
            if index not in taken and record.code in (code, None) and record.kept == kept:
                taken.add(index)
                return record.dropped
        return None


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
    """What a dropped guard pinned, comparable across compiles; None where the value is data (tensors)."""
    if not entry.has_value or isinstance(entry.value, torch.Tensor):
        return None
    if entry.guard_type in _IDENTITY_GUARDS:
        return f"id {id(entry.value)}"
    try:
        return repr(entry.value)
    except Exception:  # noqa: BLE001 - an object whose repr fails still counts as one value
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


def account_frame(code, ledger: GuardLedger, slots: SlotLists, taken: set) -> list[VariantGuards]:
    """Each captured variant of one package frame, readably: its kept checks (shape guards last),
    the slots the filter dropped in its compile, and those the invariance policy takes out."""
    from precompile.runtime.torch_compat import load_guards_state

    name = code.python_code.co_name
    states = [load_guards_state(guarded.guards_state) for guarded in code.guarded_codes]
    kept = [
        {(g.create_fn_name(), slot_source(g.name)): joined_check(g.code_list) for g in state.output_graph.guards}
        for state in states
    ]
    policy = policy_drops(kept)
    for slot in policy:
        slots.policy.add(slot)
        if kept[0][slot]:
            slots.policy_code.setdefault(slot, render_check(kept[0][slot]))
    variants = []
    for index, (state, variant_kept) in enumerate(zip(states, kept)):
        dropped = ledger.dropped_by(code_key(code.python_code), set(variant_kept), taken) or ()
        slots.kept.update(slot for slot in variant_kept if slot not in policy)
        slots.dropped.update(dropped)
        exprs = tuple(slot_source(e) for e in state.shape_code_parts.python_code_parts.exprs)
        variants.append(VariantGuards(
            frame=name, variant=index,
            checks=(*sorted({slot_text(slot) for slot in variant_kept if slot not in policy}), *exprs),
            dropped=tuple(sorted({slot_text(slot) for slot in dropped})),
            policy_dropped=tuple(sorted({slot_text(slot) for slot in policy})),
        ))
    return variants
