"""The pickle machine, run symbolically: `Machine` steps through a pickle's opcodes (read by
`pickle_ops.read_ops` exactly as the C unpickler reads them) by the dispatch table `DISPATCH`, as
pickle.py does, with the same stack, mark stack and memo. Values are literals, containers of values,
imported objects or results nothing static can know (`pickle_symbols`). Nothing is ever called or
imported; each import is recorded with its risk (pickle_policy). `pickle_scan` is its public face.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from precompile.artifact.pickle_model import Risk
from precompile.artifact.pickle_ops import looks_like_pickle, read_ops
from precompile.artifact.pickle_policy import GETATTR, MODULE, MODULE_IMPORTERS, PARTIAL, STORED_CALLABLES, classify, resolve
from precompile.artifact.pickle_shapes import CallShape, off_shape
from precompile.artifact.pickle_symbols import Computed, Global, dict_key, summarize

HIGHEST_PROTOCOL = 5
MAX_OPS = 2_000_000
MAX_NESTED_DEPTH = 3
MAX_NESTED_BYTES = 64 * 1024 * 1024
"""Bytes scanned as candidate nested pickles, over one `Budget` (a top-level scan and all its depths,
or every pickle of one container)."""
MAX_NESTED_SCANS = 10_000
"""Candidate nested pickles scanned, likewise; past either limit the scan ends with a problem."""
MAX_STATE_ITEMS = 1_000_000
"""Items of the states BUILD sets that are copied for a reader (`Shared.states`), over one `Budget`:
a memoized dict built again and again is copied each time, so without it the copies would grow with
the square of the pickle's size."""
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class _Stop(Exception):
    """The unpickler itself would raise here: the run ends with this message as its problem."""


class _Limit(_Stop):
    """The scan's own bound is reached where the unpickler would go on: nothing past it is vouched for."""


_STRING_OPS = frozenset("STRING BINSTRING SHORT_BINSTRING UNICODE BINUNICODE SHORT_BINUNICODE BINUNICODE8".split())
_BYTES_OPS = frozenset("BINBYTES SHORT_BINBYTES BINBYTES8 BYTEARRAY8".split())
_NUMBER_OPS = frozenset("INT BININT BININT1 BININT2 LONG LONG1 LONG4 FLOAT BINFLOAT".split())
_LATIN1 = frozenset({"latin1", "latin-1", "latin_1", "iso-8859-1", "iso8859-1", "l1"})


class BuildState(NamedTuple):
    """The state a BUILD sets on the object below it, as the unpickler takes it: a dict's items (and a
    (dict, slot dict) pair's) copied when BUILD runs, as `load_build` copies them into the object; the
    values themselves are the machine's, so a list filled after BUILD holds what the object would."""

    offset: int
    within: str | None
    """The nested pickle it sits in, as `PickleImport.within` names it; None in the pickle itself."""
    state: object


class Budget:
    """The work a scan may still do beyond reading its opcodes once: nested pickles (MAX_NESTED_BYTES,
    MAX_NESTED_SCANS) and states copied (MAX_STATE_ITEMS). One bounds a pickle and all its depths, or
    every pickle of one container (a Mega-Cache's entries), so that the work is bounded per blob."""

    def __init__(self) -> None:
        self.nested_bytes = MAX_NESTED_BYTES
        self.nested_scans = MAX_NESTED_SCANS
        self.state_items = MAX_STATE_ITEMS


class Shared:
    """What one top-level scan and all its nested scans share: the `Budget`, which names off the
    data-only list are reviewed for where this pickle sits, and how each may be built there (see
    `scan_pickle`); and, where `states` is a list, the state each BUILD sets, collected into it."""

    def __init__(self, reviewed: Callable[[str, str], bool] | None = None,
                 call_shape: Callable[[str, str], CallShape | None] | None = None,
                 states: list[BuildState] | None = None, limits: Budget | None = None) -> None:
        self.limits = limits if limits is not None else Budget()
        self.reviewed = reviewed
        self.call_shape = call_shape
        self.states = states


class Machine:
    def __init__(self, data: bytes, budget: Shared, depth: int, within: str | None) -> None:
        self.data = data
        self.budget = budget
        self.depth = depth
        self.within = within
        self.stack: list = []
        self.metastack: list[list] = []
        self.memo: dict = {}
        self.encodings: dict[tuple[int, str], tuple[str, bytes | Computed]] = {}
        """`encoded`'s result by the text's identity (the text kept, so that its id stays its own): a
        memoized string encoded again and again is encoded and scanned once."""
        self.protocol = 0
        self.seen_proto = False
        self.imports: dict[tuple, list] = {}
        """(module, name, risk, unresolved, within) -> [count, first offset, opcode]."""
        self.refs: dict[tuple[str, str], list[int]] = {}
        """Offsets of each reference to a callable judged by use (GETATTR, PARTIAL, MODULE_IMPORTERS)."""
        self.safe_uses: dict[tuple[str, str], int] = {}
        self.nested = 0
        self.unscanned: list[int] = []
        """Offsets of values that may hold a pickle but were past the nested-scan limits."""
        self.reached_stop = False
        self.incomplete = False
        """True when the run ended at one of the scan's limits, not where the unpickler would stop."""

    # ---- findings ------------------------------------------------------------------------------

    def record(self, module: str, name: str, risk: Risk, offset: int, opcode: str, unresolved: str | None = None,
               within: str | None = None, count: int = 1) -> None:
        key = (module, name, risk, unresolved, within if within is not None else self.within)
        entry = self.imports.get(key)
        if entry is None:
            self.imports[key] = [count, offset, opcode]
        else:
            entry[0] += count

    def unresolved(self, what: str, offset: int, opcode: str, module: str = "?", name: str = "?") -> None:
        self.record(module, name, "dangerous", offset, opcode, unresolved=what)

    # ---- stack -----------------------------------------------------------------------------------

    def pop(self):
        if not self.stack:
            raise _Stop("stack underflow")
        return self.stack.pop()

    def top(self):
        if not self.stack:
            raise _Stop("stack underflow")
        return self.stack[-1]

    def pop_mark(self) -> list:
        if not self.metastack:
            raise _Stop("MARK missing")
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def push(self, value, offset: int) -> None:
        self.stack.append(value)

    def copy(self, value, offset: int) -> None:
        """Push a second reference (GET, DUP): each reference to a callable judged by use counts."""
        if isinstance(value, Global) and value.judged_by_use:
            self.refs.setdefault((value.module, value.name), []).append(offset)
        self.stack.append(value)

    # ---- the run ---------------------------------------------------------------------------------

    def run(self):
        """The value the pickle evaluates to (None when it never reached STOP) and the problem, if any."""
        result, problem = None, None
        try:
            for count, (name, arg, pos) in enumerate(read_ops(self.data)):
                if count >= MAX_OPS:
                    raise _Limit(f"more than {MAX_OPS} opcodes: not scanned past offset {pos}")
                if name == "STOP":
                    result = self.pop()
                    self.reached_stop = True
                    break
                self.step(name, arg, pos)
        except _Stop as exc:
            problem = f"scan stopped: {exc}"
            self.incomplete = isinstance(exc, _Limit)
        except RecursionError:
            problem = "scan stopped: nesting too deep"
            self.incomplete = True
        except Exception as exc:  # read_ops on malformed bytes: ValueError, EOFError, UnicodeDecodeError, ...
            problem = f"not a well-formed pickle: {type(exc).__name__}: {exc}"
        if self.unscanned and problem is None:
            problem = (f"{len(self.unscanned)} values that may hold a pickle (the first at offset {self.unscanned[0]}) "
                       f"are past the nested-scan limits ({MAX_NESTED_SCANS} pickles, {MAX_NESTED_BYTES} bytes) and were not scanned")
        for (module, name), offsets in sorted(self.refs.items()):
            unsafe = len(offsets) - self.safe_uses.get((module, name), 0)
            if unsafe > 0:
                self.record(module, name, "dangerous", offsets[0], "GLOBAL", count=unsafe,
                            unresolved=f"{name} is used other than on literal operands naming what it reaches")
        return result, problem

    def step(self, name: str, arg, pos: int) -> None:
        """Run one opcode, by the dispatch table (`DISPATCH`: opcode name -> the method running it)."""
        handler = DISPATCH.get(name)
        if handler is None:
            raise _Stop(f"unsupported opcode {name} at offset {pos}")
        handler(self, name, arg, pos)

    # ---- opcodes: each method runs the opcodes `DISPATCH` maps to it, as the unpickler does -------

    def proto(self, name: str, arg, pos: int) -> None:
        if arg > HIGHEST_PROTOCOL:
            raise _Stop(f"unsupported pickle protocol: {arg}")
        self.protocol, self.seen_proto = arg, True

    def frame(self, name: str, arg, pos: int) -> None:
        """FRAME only announces the next bytes' length; the opcodes inside are read one by one."""

    def mark(self, name: str, arg, pos: int) -> None:
        self.metastack.append(self.stack)
        self.stack = []

    def string(self, name: str, arg, pos: int) -> None:
        self.push(arg, pos)
        self.nested_pickle(arg, pos, name)

    def bytes_(self, name: str, arg, pos: int) -> None:
        self.push(bytearray(arg) if name == "BYTEARRAY8" else arg, pos)
        self.nested_pickle(arg, pos, name)

    def literal(self, name: str, arg, pos: int) -> None:
        """A number opcode pushes its argument; NONE, NEWTRUE, NEWFALSE their constant."""
        self.push(_CONSTANTS.get(name, arg), pos)

    def empty(self, name: str, arg, pos: int) -> None:
        self.push(_EMPTY[name](), pos)

    def put(self, name: str, arg, pos: int) -> None:
        if arg < 0:
            raise _Stop("negative PUT argument")
        self.memo[arg] = self.top()

    def memoize(self, name: str, arg, pos: int) -> None:
        self.memo[len(self.memo)] = self.top()

    def get(self, name: str, arg, pos: int) -> None:
        if arg not in self.memo:
            raise _Stop(f"memo value {arg} not found (opcode {name} at offset {pos})")
        self.copy(self.memo[arg], pos)

    def dup(self, name: str, arg, pos: int) -> None:
        self.copy(self.top(), pos)

    def pop_(self, name: str, arg, pos: int) -> None:
        """POP drops the top item, or the topmost mark when the stack above it is empty."""
        if self.stack:
            self.stack.pop()
        else:
            self.pop_mark()

    def pop_mark_(self, name: str, arg, pos: int) -> None:
        self.pop_mark()

    def tuple_(self, name: str, arg, pos: int) -> None:
        self.push(tuple(self.pop_mark()), pos)

    def small_tuple(self, name: str, arg, pos: int) -> None:
        n = int(name[-1])
        if len(self.stack) < n:
            raise _Stop("stack underflow")
        items = tuple(self.stack[-n:])
        del self.stack[-n:]
        self.push(items, pos)

    def list_(self, name: str, arg, pos: int) -> None:
        self.push(self.pop_mark(), pos)

    def dict_(self, name: str, arg, pos: int) -> None:
        items = self.pop_mark()
        if len(items) % 2:
            raise _Stop("DICT with an odd number of items")
        self.push({dict_key(items[i]): items[i + 1] for i in range(0, len(items), 2)}, pos)

    def frozenset_(self, name: str, arg, pos: int) -> None:
        self.push(frozenset(dict_key(item) for item in self.pop_mark()), pos)

    def global_(self, name: str, arg, pos: int) -> None:
        """GLOBAL imports; INST imports and calls the import on the items above the mark."""
        module, _, attr = str(arg).partition(" ")
        value = self.import_(module, attr, pos, name)
        if name == "INST":
            value = self.call(value, tuple(self.pop_mark()), pos, name)
        self.push(value, pos)

    def stack_global(self, name: str, arg, pos: int) -> None:
        attr = self.pop()
        module = self.pop()
        if type(module) is str and type(attr) is str:
            self.push(self.import_(module, attr, pos, name), pos)
            return
        shown_module = module if type(module) is str else f"<{summarize(module)}>"
        shown_name = attr if type(attr) is str else f"<{summarize(attr)}>"
        self.unresolved("STACK_GLOBAL operands are not strings pushed by string opcodes", pos, name, shown_module, shown_name)
        self.push(Global(shown_module, shown_name, resolved=False), pos)

    def ext(self, name: str, arg, pos: int) -> None:
        self.unresolved(f"extension code {arg} names its import in the copyreg registry", pos, name,
                        "<copyreg extension>", str(arg))
        self.push(Global("<copyreg extension>", str(arg), resolved=False), pos)

    def reduce(self, name: str, arg, pos: int) -> None:
        """REDUCE and NEWOBJ call the callable below the arguments; NEWOBJ_EX with keywords above them."""
        kwargs = self.pop() if name == "NEWOBJ_EX" else None
        args = self.pop()
        func = self.pop()
        self.push(self.call(func, args, pos, name, kwargs), pos)

    def obj(self, name: str, arg, pos: int) -> None:
        items = self.pop_mark()
        if not items:
            raise _Stop("OBJ without a class")
        self.push(self.call(items[0], tuple(items[1:]), pos, name), pos)

    def build(self, name: str, arg, pos: int) -> None:
        state = self.pop()
        target = self.top()
        if self.budget.states is not None:
            self.budget.limits.state_items -= sum(len(part) for part in (state if isinstance(state, tuple) else (state,))
                                                  if isinstance(part, dict))
            if self.budget.limits.state_items < 0:
                raise _Limit(f"the states BUILD sets hold more than {MAX_STATE_ITEMS} items: not scanned past offset {pos}")
            copied = tuple(dict(part) if isinstance(part, dict) else part for part in state) if isinstance(state, tuple) else state
            self.budget.states.append(BuildState(pos, self.within, dict(state) if isinstance(state, dict) else copied))
        if isinstance(target, Global) and target.resolved:
            self.unresolved(f"BUILD sets state on the imported object {target.module}.{target.name} itself",
                            pos, name, target.module, target.name)

    def persistent_id(self, name: str, arg, pos: int) -> None:
        what = repr(arg) if name == "PERSID" else summarize(self.pop())
        self.push(Computed(f"persistent id {what}"), pos)

    def next_buffer(self, name: str, arg, pos: int) -> None:
        self.push(Computed("out-of-band buffer"), pos)

    def readonly_buffer(self, name: str, arg, pos: int) -> None:
        self.top()  # makes the buffer on top read-only, in place

    def import_(self, module: str, name: str, pos: int, opcode: str) -> Global:
        module, name = resolve(module, name, self.protocol)
        return self.reach(Global(module, name), pos, opcode)

    def reach(self, value: Global, pos: int, opcode: str) -> Global:
        """Record an import, or a reference to a callable judged by use (see call() and run())."""
        if value.judged_by_use:
            self.refs.setdefault((value.module, value.name), []).append(pos)
        else:
            self.record(value.module, value.name, self.judge(value.module, value.name), pos, opcode)
        return value

    def judge(self, module: str, name: str) -> Risk:
        """classify(), with an "unknown" name the scan's caller reviewed for this pickle counted as allowed."""
        risk = classify(module, name)
        reviewed = self.budget.reviewed
        return "allowed" if risk == "unknown" and reviewed is not None and reviewed(module, name) else risk

    def call(self, func, args, pos: int, opcode: str, kwargs=None):
        if not isinstance(func, (Global, Computed)):
            raise _Stop(f"{opcode} at offset {pos} calls {summarize(func)}, which is not callable")
        if isinstance(func, Computed):
            self.unresolved(f"{opcode} calls a value that is not an import ({summarize(func)})", pos, opcode,
                            "<computed>", summarize(func))
            return Computed(f"{summarize(func)}(...)")
        if not func.resolved:
            return Computed(f"{func.module}.{func.name}(...)")
        if (func.module, func.name) in STORED_CALLABLES:
            self.unresolved(f"{opcode} calls it while unpickling", pos, opcode, func.module, func.name)
        if self.budget.call_shape is not None:
            for cls, why in off_shape(self.budget.call_shape, func, args, kwargs, opcode):
                self.unresolved(why, pos, opcode, cls.module, cls.name)
        if func.judged_by_use and opcode == "REDUCE" and isinstance(args, tuple):
            used = self.safe_use(func, args, pos)
            if used is not None:
                return used
        if (func.module, func.name) == ("_codecs", "encode") and isinstance(args, tuple) and args and type(args[0]) is str:
            return self.encoded(args, pos)
        if (func.module, func.name) == ("builtins", "bytes") and args == ():
            return b""  # protocol 2's spelling of empty bytes
        return Computed(f"{func.module}.{func.name}(...)")

    def safe_use(self, func: Global, args: tuple, pos: int) -> Global | Computed | None:
        """A REDUCE of a callable judged by use in one of its safe shapes (getattr of an import by a
        literal name, importing a module by a literal name, partial of an import), or None."""
        key = (func.module, func.name)
        if key == GETATTR and len(args) == 2:
            owner, attr = args
            if isinstance(owner, Global) and owner.resolved and type(attr) is str and _IDENT.match(attr):
                # getattr(imported object, "literal") is the import of a dotted name: judged as one
                self.safe_uses[key] = self.safe_uses.get(key, 0) + 1
                name = f"{owner.name}.{attr}" if owner.name != MODULE else attr
                return self.reach(Global(owner.module, name), pos, "REDUCE getattr")
        elif key in MODULE_IMPORTERS and len(args) == 1 and type(args[0]) is str and _IDENT.match(args[0]):
            self.safe_uses[key] = self.safe_uses.get(key, 0) + 1
            return self.reach(Global(args[0], MODULE), pos, f"REDUCE {func.name}")
        elif key == PARTIAL and args and isinstance(args[0], Global) and args[0].resolved:
            self.safe_uses[key] = self.safe_uses.get(key, 0) + 1
            self.record(*PARTIAL, "allowed", pos, "REDUCE partial")
            return Computed(f"functools.partial({args[0].module}.{args[0].name}, ...)")
        return None

    def encoded(self, args: tuple, pos: int) -> bytes | Computed:
        """_codecs.encode(text, encoding), protocol 2's spelling of bytes: the bytes (scanned as a
        nested pickle too) where the encoding is one of the few it uses, else a computed value."""
        encoding = args[1] if len(args) > 1 else "utf-8"
        if type(encoding) is not str or encoding.lower() not in _LATIN1 | {"utf-8", "utf8", "ascii"}:
            return Computed("_codecs.encode(...)")
        known = self.encodings.get((id(args[0]), encoding.lower()))
        if known is not None and known[0] is args[0]:
            return known[1]
        try:
            data: bytes | Computed = args[0].encode(encoding)
        except (UnicodeEncodeError, LookupError):
            data = Computed("_codecs.encode(...)")
        if isinstance(data, bytes):
            self.nested_pickle(data, pos, "_codecs.encode")
        self.encodings[(id(args[0]), encoding.lower())] = (args[0], data)
        return data

    def mutate(self, name: str, arg, pos: int) -> None:
        """APPEND(S), SETITEM(S), ADDITEMS: fill the container below; mutating an import itself is a finding."""
        if name == "APPEND":
            items = [self.pop()]
        elif name == "SETITEM":
            value = self.pop()
            items = [self.pop(), value]
        else:
            items = self.pop_mark()
        target = self.top()
        if isinstance(target, Global):
            if target.resolved:
                self.unresolved(f"{name} mutates the imported object {target.module}.{target.name} itself", pos, name,
                                target.module, target.name)
        elif name in ("APPEND", "APPENDS") and isinstance(target, list):
            target.extend(items)
        elif name in ("SETITEM", "SETITEMS") and isinstance(target, dict):
            if len(items) % 2:
                raise _Stop("SETITEMS with an odd number of items")
            for i in range(0, len(items), 2):
                target[dict_key(items[i])] = items[i + 1]
        elif name == "ADDITEMS" and isinstance(target, set):
            target.update(dict_key(item) for item in items)

    def nested_pickle(self, value, pos: int, opcode: str) -> None:
        """Scan a bytes or str literal that holds a pickle, and keep what it would import."""
        if self.depth >= MAX_NESTED_DEPTH or len(value) < 4:
            return
        if isinstance(value, str):
            try:
                value = value.encode("latin-1")
            except UnicodeEncodeError:
                return  # a pickle is bytes; a str outside latin-1 never encodes to one with _codecs.encode's spelling
        if not looks_like_pickle(value):
            return
        limits = self.budget.limits
        if len(value) > limits.nested_bytes or limits.nested_scans <= 0:
            self.unscanned.append(pos)  # cannot vouch for it: run() turns this into the scan's problem
            return
        limits.nested_bytes -= len(value)
        limits.nested_scans -= 1
        where = f"pickle inside the {opcode} at offset {pos}"
        within = f"{self.within} > {where}" if self.within else where
        inner = Machine(bytes(value), self.budget, self.depth + 1, within)
        inner.run()
        if inner.unscanned or inner.incomplete:
            self.unscanned.append(pos)
        found = {key: entry for key, entry in inner.imports.items()}
        framed = value[0] == 0x80
        keep = inner.reached_stop or (framed and found) or any(key[2] == "dangerous" for key in found)
        if not keep:
            return
        self.nested += 1 + inner.nested
        for (module, name, risk, unresolved, inner_within), (count, offset, op) in found.items():
            if not framed and not inner.reached_stop and risk != "dangerous":
                continue
            if not (framed or _IDENT.match(module) or unresolved):
                continue  # a protocol 0 lookalike naming no importable module: the unpickler would fail there
            self.record(module, name, risk, offset, op, unresolved, within=inner_within, count=count)


_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_EMPTY = {"EMPTY_DICT": dict, "EMPTY_LIST": list, "EMPTY_TUPLE": tuple, "EMPTY_SET": set}
DISPATCH: dict[str, Callable[[Machine, str, object, int], None]] = {
    "PROTO": Machine.proto, "FRAME": Machine.frame, "MARK": Machine.mark,
    **dict.fromkeys(_STRING_OPS, Machine.string), **dict.fromkeys(_BYTES_OPS, Machine.bytes_),
    **dict.fromkeys(_NUMBER_OPS | _CONSTANTS.keys(), Machine.literal), **dict.fromkeys(_EMPTY, Machine.empty),
    **dict.fromkeys(("PUT", "BINPUT", "LONG_BINPUT"), Machine.put), "MEMOIZE": Machine.memoize,
    **dict.fromkeys(("GET", "BINGET", "LONG_BINGET"), Machine.get), "DUP": Machine.dup,
    "POP": Machine.pop_, "POP_MARK": Machine.pop_mark_,
    "TUPLE": Machine.tuple_, **dict.fromkeys(("TUPLE1", "TUPLE2", "TUPLE3"), Machine.small_tuple),
    "LIST": Machine.list_, "DICT": Machine.dict_, "FROZENSET": Machine.frozenset_,
    **dict.fromkeys(("APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS"), Machine.mutate),
    **dict.fromkeys(("GLOBAL", "INST"), Machine.global_), "STACK_GLOBAL": Machine.stack_global,
    **dict.fromkeys(("EXT1", "EXT2", "EXT4"), Machine.ext),
    **dict.fromkeys(("REDUCE", "NEWOBJ", "NEWOBJ_EX"), Machine.reduce), "OBJ": Machine.obj, "BUILD": Machine.build,
    **dict.fromkeys(("PERSID", "BINPERSID"), Machine.persistent_id),
    "NEXT_BUFFER": Machine.next_buffer, "READONLY_BUFFER": Machine.readonly_buffer,
}
"""Every opcode of protocols 0-5 but STOP (which `run` handles), as pickle.py's `dispatch` table maps them."""
