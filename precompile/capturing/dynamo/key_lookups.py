"""Dicts Dynamo guards by key position that the traced code only read by key (issue 51).

Dynamo wraps a dict the traced code reads item by item in insertion order, so one lookup of key K
realizes the key at position i: its guards read `list(dict.keys(R))[i]` (== K), the value through
`dict.__getitem__(R, list(dict.keys(R))[i])` and `len(R)`. Where the insertion order is the process's
history, not a setting (transformers' `_CAN_RECORD_REGISTRY`, keyed by the names of the model classes
the process built, in the order it built them), those guards make two captures of one model differ
and refuse a serving process that built another model first: a false alarm and a false refusal.

A standalone artifact checks such a dict by key instead, where nothing the code did depends on the
order or on the other keys:
  - no DICT_KEYS_MATCH guards R (Dynamo adds one for iteration, len(), keys(), items(), mutation),
    and R's type defines no __missing__ (a miss is then checked only by the keys looked past);
  - no transformed code names R (the served bytecode never reads R by position: no value of R is
    rebuilt from its source, no mutation of R replayed);
  - every position of R a guard reads has its key guarded, as a str or int literal, one key each;
  - no lookup of R missed while Dynamo traced (`recorded_misses`: a miss caught as a KeyError, or
    answered by a default, is checked only through the keys looked past and R's length).
Then `list(dict.keys(R))[i]` reads as K's literal in every guard's source (listings and checks),
the key's guard becomes DICT_CONTAINS R (K in R, by dict's own lookup) and R's length guard is
listed as dropped: a lookup by key reads nothing of the other keys. An installed artifact is served
through Dynamo's own guards, rebuilt at load, and keeps Dynamo's positions.
"""
from __future__ import annotations

import contextlib
import dis
import functools
import re
import types
from dataclasses import dataclass, field

from precompile.capturing.dynamo.guard_accounting import SlotLists, seen_key, slot_source, slot_text

_POSITION = re.compile(r"list\(dict\.keys\((?P<dict>.+)\)\)\[(?P<index>\d+)\]")
_LAST_NAME = re.compile(r"(?:\.(\w+)|\['(\w+)'\])$")
_SLOT_LINE = re.compile(r"[A-Z][A-Z_]*(?: |$)")  # a slot's line, not a shape guard's expression
_KEY_GUARDS = frozenset({"CONSTANT_MATCH", "EQUALS_MATCH"})


@dataclass
class KeyLookups:
    """What a standalone artifact reads by key instead of by position."""

    keys: dict[str, str] = field(default_factory=dict)
    """{`list(dict.keys(R))[i]`: K's literal}, for Dynamo's source text and its local-stripped form."""
    dicts: set[str] = field(default_factory=set)
    """R's source text (both forms), whose SEQUENCE_LENGTH is listed as dropped, not checked."""
    looked_past: set[str] = field(default_factory=set)
    """Key positions no guard reads a value through: Dynamo compared the looked-up key with each key
    before it. Their guards are listed with R's length, as dropped."""

    def text(self, text: str) -> str:
        """`text` with each position read as its key, in one pass: a key's literal may spell a position."""
        if not self.keys:
            return text
        positions = sorted(self.keys, key=len, reverse=True)  # an outer position first
        return re.sub("|".join(map(re.escape, positions)), lambda found: self.keys[found.group(0)], text)

    def key_guard(self, kind: str, name: str) -> str | None:
        """R's source where (kind, name) is the guard on one of R's key positions, else None."""
        position = _POSITION.fullmatch(name) if kind in _KEY_GUARDS and name in self.keys else None
        return position.group("dict") if position is not None else None

    def slot(self, slot: tuple[str, str]) -> tuple[str, str]:
        kind, source = slot
        owner = self.key_guard(kind, source)
        if owner is None:
            return (kind, self.text(source))
        return ("SEQUENCE_LENGTH", owner) if source in self.looked_past else ("DICT_CONTAINS", owner)

    def skipped(self, kind: str, name: str) -> bool:
        """Whether the guard (kind, name) reads R's order or other keys: listed as dropped, never checked."""
        return (kind == "SEQUENCE_LENGTH" and name in self.dicts) or (kind in _KEY_GUARDS and name in self.looked_past)

    def listed(self, line: str) -> str:
        kind, _, source = line.partition(" ")
        return slot_text(self.slot((kind, source))) if source else line


class DictMisses:
    """The sources of the dicts a lookup missed in while Dynamo traced; None where this torch's dict
    tracker has not the methods `recorded_misses` watches (then no dict is read by key)."""

    def __init__(self) -> None:
        self.sources: set[str] | None = set()

    def record(self, tracker) -> None:
        source = getattr(tracker, "source", None)
        if source is not None and self.sources is not None:
            name = source.name
            self.sources.add(name() if callable(name) else name)


# ConstDictVariable's lookups that may miss, and how each tells it: by raising, by None, by False.
_LOOKUPS = {"getitem_const_raise_exception_if_absent": "raises", "getitem_const": "raises",
            "maybe_getitem_const": "none", "__contains__": "false"}


@contextlib.contextmanager
def recorded_misses():
    """While it is open, every lookup Dynamo's dict tracker makes that finds no key records the dict's
    source in the DictMisses it yields."""
    from torch._dynamo.variables.dicts import ConstDictVariable

    misses = DictMisses()
    originals = {name: ConstDictVariable.__dict__.get(name) for name in _LOOKUPS}
    if any(original is None for original in originals.values()):
        misses.sources = None
        yield misses
        return
    for name, original in originals.items():
        setattr(ConstDictVariable, name, _watched(original, _LOOKUPS[name], misses))
    try:
        yield misses
    finally:
        for name, original in originals.items():
            setattr(ConstDictVariable, name, original)


def _watched(lookup, tells: str, misses: DictMisses):
    @functools.wraps(lookup)
    def watched(self, *args, **kwargs):
        try:
            found = lookup(self, *args, **kwargs)
        except BaseException:
            if tells == "raises":
                misses.record(self)
            raise
        if (tells == "none" and found is None) or (tells == "false" and not found):
            misses.record(self)
        return found
    return watched


def key_lookups(entry, states: dict, seen: dict, dropped: set, missed: DictMisses) -> KeyLookups:
    """The dicts of a capture read by key (see the module's doc): `states` {(frame qualname, variant):
    its guards state}, `seen` the ledger's {(qualname, variant): {seen_key: Seen}}, `dropped` the
    dropped slots, `entry` the package entry whose transformed code is served, `missed` the dicts a
    lookup missed in."""
    from precompile.torch_compat import SerializedCode

    if missed.sources is None:
        return KeyLookups()
    served_names = set()
    for code in entry.codes:
        for guarded in code.guarded_codes:
            served_names |= _names(SerializedCode.to_code_object(guarded.dynamo_code))
    keys, ordered = _guarded_keys(states, seen)
    lookups = KeyLookups()
    ordered |= {source for kind, source in dropped if kind == "DICT_KEYS_MATCH"} | missed.sources
    for owner, positions in keys.items():
        name = _named(owner)
        if positions is None or {owner, slot_source(owner)} & ordered or name is None or name in served_names:
            continue  # its keys' order or absence counts, or the served code reads it
        read = {int(found.group("index")) for found in _positions_read(states, owner)}
        if not read <= set(positions) or len(set(positions.values())) != len(positions):
            continue
        for index, value in positions.items():
            position = f"list(dict.keys({owner}))[{index}]"
            lookups.keys[position] = lookups.keys[slot_source(position)] = repr(value)
            if index not in read:
                lookups.looked_past |= {position, slot_source(position)}
        lookups.dicts |= {owner, slot_source(owner)}
    return lookups


def _guarded_keys(states: dict, seen: dict) -> tuple[dict, set]:
    """({R: {position: the key guarded there}, or None where a key is no str or int literal or two
    variants saw two keys at one position}, the sources of dicts whose keys Dynamo matched in order or
    whose type answers a missing key)."""
    keys: dict[str, dict[int, object] | None] = {}
    ordered: set = set()
    for where, state in states.items():
        held = seen.get(where, {})
        for guard in state.output_graph.guards:
            kind, name = guard.create_fn_name(), guard.name
            # A dict whose type answers a missing key (__missing__): Dynamo checks the miss only by the
            # keys it looked past and the length, so the dict keeps them.
            if kind == "DICT_KEYS_MATCH" or hasattr(getattr(held.get(seen_key(guard)), "type", None), "__missing__"):
                ordered |= {name, slot_source(name)}
            position = _POSITION.fullmatch(name)
            if kind not in _KEY_GUARDS or position is None:
                continue
            value = getattr(held.get(seen_key(guard)), "value", None)
            index, owner = int(position.group("index")), position.group("dict")
            positions = keys.setdefault(owner, {})
            if positions is not None and (type(value) not in (str, int) or positions.setdefault(index, value) != value):
                keys[owner] = None
    return keys, ordered


def apply(lookups: KeyLookups, guards: list, slots: SlotLists, rendered: dict) -> list:
    """The capture's listings with `lookups` applied: each variant's guards (returned), the summary's
    slot lists and the dropped slots' rendered checks (`rendered`, the ledger's; both in place)."""
    import msgspec

    if not lookups.keys:
        return guards
    out = []
    for variant in guards:  # checks: the slots sorted, then the shape guards' expressions in order
        slots_listed = [lookups.listed(line) for line in variant.checks if _SLOT_LINE.match(line)]
        lengths = {line for line in slots_listed if lookups.skipped(*line.partition(" ")[::2])}
        exprs = [lookups.text(line) for line in variant.checks if not _SLOT_LINE.match(line)]
        out.append(msgspec.structs.replace(
            variant,
            checks=(*sorted(set(slots_listed) - lengths), *exprs),
            dropped=tuple(sorted({*(lookups.listed(line) for line in variant.dropped), *lengths})),
            policy_dropped=tuple(sorted({lookups.listed(line) for line in variant.policy_dropped})),
            by_name=tuple(sorted(lookups.text(line) for line in variant.by_name)),
        ))
    unchecked = {slot for slot in slots.kept if lookups.skipped(*slot)}
    slots.kept = {lookups.slot(slot) for slot in slots.kept - unchecked}
    slots.dropped = {lookups.slot(slot) for slot in slots.dropped | unchecked}
    slots.policy = {lookups.slot(slot) for slot in slots.policy}
    slots.told_apart = {lookups.slot(slot) for slot in slots.told_apart}
    slots.policy_code = {lookups.slot(slot): lookups.text(check) for slot, check in slots.policy_code.items()}
    renamed = {lookups.slot(slot): lookups.text(check) for slot, check in rendered.items()}
    rendered.clear()
    rendered.update(renamed)
    return out


def _positions_read(states: dict, owner: str):
    """R's key positions some guard reads a value through (a source it is part of, not the key's own)."""
    position = re.compile(re.escape(f"list(dict.keys({owner}))[") + r"(?P<index>\d+)\]")
    for state in states.values():
        for guard in state.output_graph.guards:
            if position.fullmatch(guard.name) is None:
                yield from position.finditer(guard.name)


def _named(source: str) -> str | None:
    """The name R is read by at its end (G['REG'] -> REG, G['m']._REG -> _REG); None for a source ending
    in no name (a subscript by position, a call), which is left as Dynamo guards it."""
    found = _LAST_NAME.search(source)
    return (found.group(1) or found.group(2)) if found else None


def _names(code: types.CodeType) -> set:
    """The names the code's instructions load, store or call, and the strings they load (a dict nested
    in another is reached by a constant key: CFG['table']), through nested code (Dynamo's transformed
    code keeps the original's co_names, read or not: the instructions say what runs)."""
    names = {i.argval for i in dis.get_instructions(code) if isinstance(i.argval, str)}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names
