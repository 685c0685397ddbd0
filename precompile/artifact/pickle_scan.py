"""Static scan of a pickle: what it would import and call, without unpickling it.

`pickle_ops.read_ops` decodes opcodes and their arguments exactly as the C unpickler reads them; on
top of it `Machine` runs the pickle machine symbolically, opcode by opcode (by the dispatch table
`DISPATCH`, as pickle.py does): the same stack, the same mark stack, the same memo. Values are
literals (exactly as the string, bytes and number opcodes push them), containers of values, imported
objects (`Global`) or results nothing static can know (`Computed`: a call, a persistent id, an
out-of-band buffer). Nothing is ever called or imported. `is_pickle` tells a pickle of any protocol
by content; `evaluate` gives the value a pickle of plain data holds (formats/pickle_values).

Sound by construction: an import is *resolved* only when its module and name are `str` values that
a string opcode pushed (directly or through the memo); any other operand of STACK_GLOBAL, an EXT
registry code, a call of something that is not an import, and a BUILD or APPEND/SETITEM that
mutates an imported object itself are *unresolved* findings, risk "dangerous", as is a call of a
reviewed class in a shape its review does not allow (`pickle_shapes`). Bytes and strings
that hold a pickle (and the bytes `_codecs.encode` builds from a string) are scanned too, to a
bounded depth. Malformed input ends the run where the unpickler itself would stop, with `problem`
set; every import seen up to there is kept, since the unpickler would have performed them. A run
that stops, for that reason or at one of the scan's limits, is a finding wherever the pickle sits.
"""
from __future__ import annotations

import hashlib
import pickletools
import warnings
from collections.abc import Callable

from precompile.artifact.pickle_machine import HIGHEST_PROTOCOL, MAX_NESTED_DEPTH, Budget, BuildState, Machine, Shared
from precompile.artifact.pickle_model import Blob, Field, PickleImport, PickleScan
from precompile.artifact.pickle_ops import OPCODE_BYTES
from precompile.artifact.pickle_shapes import CallShape
from precompile.artifact.pickle_symbols import key_text, summarize

MAX_PICKLE_SIZE = 256 * 1024 * 1024
MAX_FIELDS = 200
STOPS_AT_ONCE = frozenset(op.code.encode("latin-1")[0] for op in pickletools.opcodes if op.name in (
    "STOP", "POP", "POP_MARK", "DUP", "MEMOIZE", "GET", "BINGET", "LONG_BINGET", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "LIST", "DICT", "FROZENSET", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "STACK_GLOBAL", "REDUCE",
    "NEWOBJ", "NEWOBJ_EX", "OBJ", "BUILD", "BINPERSID", "READONLY_BUFFER"))
"""Opcodes that, first in a stream, stop the unpickler before it imports or calls anything: each
takes from the stack, the mark stack or the memo, all empty there (INST is not one: pickle.py
imports its class before it looks for the mark). Text often starts with one (`e`, `a`, `s`, `t`)."""


def is_pickle(data: bytes) -> bool:
    """Whether an unpickler given `data` would act on it, by content alone: a protocol 2-5 header, or a
    protocol 0/1 opcode stream (read as the C unpickler reads it) that imports or calls something
    before it ends or breaks (what the unpickler did up to a break stays done), or that is past the
    scan's limits. A protocol 0/1 stream of plain data is not one: it can do nothing, and text often
    reads as one (`G['torch']._dynamo` is a float). Every container (Mega-Cache entries, bundle files,
    bare files, python_code literals) sniffs its content with this."""
    if len(data) >= 2 and data[0] == 0x80:
        return data[1] <= HIGHEST_PROTOCOL
    if not data or data[0] not in OPCODE_BYTES or data[0] in STOPS_AT_ONCE or len(data) > MAX_PICKLE_SIZE:
        return False
    machine = Machine(bytes(data), Shared(), MAX_NESTED_DEPTH, None)  # at the depth limit: nothing nested is scanned
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        machine.run()
    return machine.incomplete or any(unresolved or _importable(module) for module, _, _, unresolved, _ in machine.imports)


def _importable(module: str) -> bool:
    return all(part.isidentifier() for part in module.split("."))


def evaluate(data: bytes) -> tuple[object, str | None]:
    """What a pickle evaluates to, by the same machine (literals and containers as they are; imports,
    calls and persistent ids as placeholders that `summarize` names), and the problem that stopped
    it, if any. For reading values only: nested pickles are not scanned, nothing is judged."""
    machine = Machine(bytes(data), Shared(), MAX_NESTED_DEPTH, None)  # at the depth limit: nothing nested is scanned
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return machine.run()


def scan_pickle(data: bytes, *, member: str, reviewed: Callable[[str, str], bool] | None = None,
                call_shape: Callable[[str, str], CallShape | None] | None = None,
                states: list[BuildState] | None = None, limits: Budget | None = None) -> PickleScan:
    """Scan one pickle; malformed input gives a scan with `problem` set, never an exception.

    `reviewed(module, name)` marks names off the data-only list that are allowed in this pickle, and
    makes every other name off it a finding (`PickleScan.findings`): for a pickle `load` itself
    unpickles, where "unknown" is not good enough (the opaque state, see `dynamo_state_reviewed`).
    `call_shape(module, name)` is how a reviewed name may be built there (`pickle_shapes`): any
    other call of it is an unresolved finding naming the class and the call. `states`, a list, receives
    the state each BUILD sets (nested pickles' too), for a reader of the fields torch uses. `limits`, a
    `Budget` shared by the pickles of one container, bounds the work over all of them (a fresh one
    bounds this pickle's)."""
    blob = Blob(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    strict = reviewed is not None
    if len(data) > MAX_PICKLE_SIZE:
        return PickleScan(member=member, blob=blob, unpickled_by_load=strict,
                          problem=f"{len(data)} bytes, over the {MAX_PICKLE_SIZE}-byte scan limit")
    machine = Machine(bytes(data), Shared(reviewed, call_shape, states, limits), 0, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # escape_decode on odd STRING escapes: not our reader's noise
        result, problem = machine.run()
    fields: tuple[Field, ...] = ()
    top = None
    if machine.reached_stop:
        top = summarize(result)
        if isinstance(result, dict):
            items = sorted(result.items(), key=lambda kv: key_text(kv[0]))
            fields = tuple(Field(key=key_text(k), summary=summarize(v)) for k, v in items[:MAX_FIELDS])
    found = tuple(
        PickleImport(module=module, name=name, risk=risk, count=count, offset=offset, opcode=opcode,
                     unresolved=unresolved, within=within)
        for (module, name, risk, unresolved, within), (count, offset, opcode) in sorted(
            machine.imports.items(), key=lambda kv: (kv[0][4] or "", kv[1][1], kv[0][0], kv[0][1]))
    )
    return PickleScan(member=member, blob=blob, protocol=machine.protocol if machine.seen_proto else None, imports=found,
                      top_level=top, fields=fields, problem=problem, nested=machine.nested, unpickled_by_load=strict)


def finding_text(scan: PickleScan, imp: PickleImport | None) -> str:
    """One finding of a scan (`imp`; None: the scan could not finish): where, the import and the opcode
    offset, worded alike by verify and by load, which refuses an opaque state with one."""
    if imp is None:
        return f"{scan.member}: the pickle could not be scanned to its end ({scan.problem}), so what it would do is unknown"
    where = f", in the {imp.within}" if imp.within else ""
    why = imp.unresolved or (
        "able to execute code, import, open files or unpickle" if imp.risk == "dangerous" else
        "neither on the data-only list nor reviewed as part of Dynamo's state, and load unpickles this state")
    return (f"{scan.member} would import {imp.module}.{imp.name} at opcode offset {imp.offset} "
            f"({imp.opcode}{where}) if unpickled: {why}")
