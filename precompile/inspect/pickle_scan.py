"""Static scan of a pickle: what it would import and what it would build, without unpickling.

`pickletools.genops` only decodes opcodes and their arguments; on top of it a tiny symbolic stack
machine follows containers and literals so a plain dict's keys and scalar fields can be listed, and
every GLOBAL/STACK_GLOBAL is recorded with a risk: "allowed" (torch, collections, builtins'
safe constructors, the standard library's data types), "dangerous" (process execution, code
evaluation, imports, file access) or "unknown" (anything else). Nothing is ever called.
"""
from __future__ import annotations

import _compat_pickle
import hashlib
import pickletools
from collections import Counter

from precompile.inspect.model import Blob, Field, PickleImport, PickleScan, Risk

MAX_PICKLE_SIZE = 256 * 1024 * 1024
MAX_OPS = 2_000_000
MAX_FIELDS = 200

_SAFE_BUILTINS = frozenset(
    "bool bytearray bytes complex dict float frozenset int list object range set slice str tuple".split()
)
_SAFE_STDLIB = frozenset(
    {
        ("_codecs", "encode"),
        ("copyreg", "_reconstructor"),
        ("datetime", "date"),
        ("datetime", "datetime"),
        ("datetime", "time"),
        ("datetime", "timedelta"),
        ("datetime", "timezone"),
        ("decimal", "Decimal"),
        ("fractions", "Fraction"),
        ("uuid", "UUID"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "PureWindowsPath"),
    }
)
_DANGEROUS_MODULES = ("os", "posix", "nt", "subprocess", "shutil", "sys", "socket", "importlib", "pty", "runpy", "ctypes", "pickle", "marshal", "code", "webbrowser", "multiprocessing")
_DANGEROUS_BUILTINS = frozenset("eval exec compile __import__ getattr setattr delattr open input breakpoint globals locals vars".split())


def resolve(module: str, name: str, protocol: int) -> tuple[str, str]:
    """The name Unpickler.find_class would import: below protocol 3 it maps Python 2 names
    (`commands.check_output` is `subprocess.check_output`, `__builtin__` is `builtins`)."""
    if protocol < 3:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            return _compat_pickle.NAME_MAPPING[(module, name)]
        if module in _compat_pickle.IMPORT_MAPPING:
            return _compat_pickle.IMPORT_MAPPING[module], name
    return module, name


def classify(module: str, name: str) -> Risk:
    if module == "builtins" or module == "__builtin__":
        if name in _SAFE_BUILTINS:
            return "allowed"
        return "dangerous" if name in _DANGEROUS_BUILTINS else "unknown"
    root = module.split(".", 1)[0]
    if root in _DANGEROUS_MODULES:
        return "dangerous"
    if root == "torch" or module == "collections" or (module, name) in _SAFE_STDLIB:
        return "allowed"
    return "unknown"


class _Opaque:
    """A value the scan cannot know without running code: a global, a call, a persistent id."""

    def __init__(self, what: str) -> None:
        self.what = what


_MARK = object()
_SCALARS = (type(None), bool, int, float, str)


def summarize(value) -> str:
    if isinstance(value, _Opaque):
        return value.what
    if isinstance(value, str):
        return repr(value) if len(value) <= 80 else f"str ({len(value)} chars)"
    if isinstance(value, _SCALARS):
        return repr(value)
    if isinstance(value, (bytes, bytearray)):
        return f"bytes ({len(value)} bytes, sha256 {hashlib.sha256(value).hexdigest()[:16]})"
    if isinstance(value, dict):
        return f"dict ({len(value)} keys)"
    if isinstance(value, list):
        return f"list ({len(value)} items)"
    if isinstance(value, tuple):
        return f"tuple ({len(value)} items)"
    return type(value).__name__


def _key(value) -> str:
    return value if isinstance(value, str) else summarize(value)


def scan_pickle(data: bytes, *, member: str) -> PickleScan:
    """Scan one pickle; malformed input gives a scan with `problem` set, never an exception."""
    blob = Blob(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    if len(data) > MAX_PICKLE_SIZE:
        return PickleScan(member=member, blob=blob, problem=f"{len(data)} bytes, over the {MAX_PICKLE_SIZE}-byte scan limit")
    imports: Counter[tuple[str, str]] = Counter()
    stack: list = []
    memo: dict = {}
    protocol = None
    result = None
    problem = None
    strings: list[str] = []  # last string pushes, for STACK_GLOBAL when the stack machine gave up
    structural = True
    try:
        for count, (op, arg, _pos) in enumerate(pickletools.genops(data)):
            if count >= MAX_OPS:
                raise ValueError(f"more than {MAX_OPS} opcodes")
            name = op.name
            if name == "PROTO":
                protocol = arg
            if name in ("GLOBAL", "INST"):
                module, _, attr = str(arg).partition(" ")
                imports[resolve(module, attr, protocol or 0)] += 1
            elif name == "STACK_GLOBAL":
                if structural and len(stack) >= 2 and isinstance(stack[-1], str) and isinstance(stack[-2], str):
                    module, attr = stack[-2], stack[-1]
                elif len(strings) >= 2:
                    module, attr = strings[-2], strings[-1]
                else:
                    module, attr = "?", "?"
                imports[resolve(module, attr, protocol or 0)] += 1
            if isinstance(arg, str):
                strings = (strings + [arg])[-2:]
            if not structural:
                if name in ("BINGET", "LONG_BINGET", "GET") and isinstance(memo.get(arg), str):
                    strings = (strings + [memo[arg]])[-2:]
                continue
            try:
                result = _step(name, arg, stack, memo, protocol or 0)
            except _GiveUp as exc:
                structural = False
                problem = f"structure not followed past opcode {name}: {exc}"
    except Exception as exc:  # genops on malformed bytes: ValueError, EOFError, UnicodeDecodeError, ...
        problem = f"not a well-formed pickle: {type(exc).__name__}: {exc}"
        result = None
    fields: tuple[Field, ...] = ()
    top = None
    if structural and result is not None:
        top = summarize(result)
        if isinstance(result, dict):
            items = sorted(result.items(), key=lambda kv: _key(kv[0]))
            fields = tuple(Field(key=_key(k), summary=summarize(v)) for k, v in items[:MAX_FIELDS])
    found = tuple(
        PickleImport(module=module, name=attr, risk=classify(module, attr), count=n)
        for (module, attr), n in sorted(imports.items())
    )
    return PickleScan(member=member, blob=blob, protocol=protocol, imports=found, top_level=top, fields=fields, problem=problem)


class _GiveUp(Exception):
    pass


def _pop_mark(stack: list) -> list:
    for index in range(len(stack) - 1, -1, -1):
        if stack[index] is _MARK:
            items = stack[index + 1 :]
            del stack[index:]
            return items
    raise _GiveUp("MARK missing")


def _pop(stack: list):
    if not stack or stack[-1] is _MARK:
        raise _GiveUp("stack underflow")
    return stack.pop()


def _hashable(value):
    try:
        hash(value)
        return value
    except TypeError:
        return _Opaque(summarize(value))


def _step(name: str, arg, stack: list, memo: dict, protocol: int):  # noqa: C901 - one branch per opcode family
    if name in ("PROTO", "FRAME"):
        return None
    if name == "STOP":
        return _pop(stack)
    if name == "MARK":
        stack.append(_MARK)
    elif name in ("EMPTY_DICT",):
        stack.append({})
    elif name in ("EMPTY_LIST",):
        stack.append([])
    elif name == "EMPTY_TUPLE":
        stack.append(())
    elif name == "EMPTY_SET":
        stack.append(set())
    elif name in ("NONE", "NEWTRUE", "NEWFALSE", "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4",
                  "FLOAT", "BINFLOAT", "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE",
                  "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"):
        value = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}.get(name, arg)
        stack.append(value)
    elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
        if not stack:
            raise _GiveUp("stack underflow")
        memo[arg] = stack[-1]
    elif name == "MEMOIZE":
        if not stack:
            raise _GiveUp("stack underflow")
        memo[len(memo)] = stack[-1]
    elif name in ("BINGET", "LONG_BINGET", "GET"):
        if arg not in memo:
            raise _GiveUp(f"memo {arg} missing")
        stack.append(memo[arg])
    elif name == "TUPLE":
        stack.append(tuple(_pop_mark(stack)))
    elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
        n = int(name[-1])
        items = [_pop(stack) for _ in range(n)][::-1]
        stack.append(tuple(items))
    elif name in ("LIST",):
        stack.append(list(_pop_mark(stack)))
    elif name == "DICT":
        items = _pop_mark(stack)
        stack.append({_hashable(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)})
    elif name == "APPEND":
        value = _pop(stack)
        target = _pop(stack)
        if isinstance(target, list):
            target.append(value)
        stack.append(target)
    elif name == "APPENDS":
        items = _pop_mark(stack)
        target = _pop(stack)
        if isinstance(target, list):
            target.extend(items)
        stack.append(target)
    elif name == "SETITEM":
        value = _pop(stack)
        key = _pop(stack)
        target = _pop(stack)
        if isinstance(target, dict):
            target[_hashable(key)] = value
        stack.append(target)
    elif name == "SETITEMS":
        items = _pop_mark(stack)
        target = _pop(stack)
        if isinstance(target, dict):
            for i in range(0, len(items) - 1, 2):
                target[_hashable(items[i])] = items[i + 1]
        stack.append(target)
    elif name == "ADDITEMS":
        items = _pop_mark(stack)
        target = _pop(stack)
        if isinstance(target, set):
            target.update(_hashable(item) for item in items)
        stack.append(target)
    elif name == "FROZENSET":
        stack.append(frozenset(_hashable(item) for item in _pop_mark(stack)))
    elif name in ("GLOBAL", "INST"):
        module, attr = resolve(*str(arg).partition(" ")[::2], protocol)
        if name == "INST":
            _pop_mark(stack)
            stack.append(_Opaque(f"{module}.{attr}(...)"))
        else:
            stack.append(_Opaque(f"{module}.{attr}"))
    elif name == "STACK_GLOBAL":
        attr = _pop(stack)
        module = _pop(stack)
        stack.append(_Opaque(".".join(resolve(str(module), str(attr), protocol))))
    elif name in ("REDUCE", "NEWOBJ"):
        _pop(stack)
        callee = _pop(stack)
        stack.append(_Opaque(f"{summarize(callee)}(...)"))
    elif name == "NEWOBJ_EX":
        _pop(stack)
        _pop(stack)
        callee = _pop(stack)
        stack.append(_Opaque(f"{summarize(callee)}(...)"))
    elif name == "OBJ":
        items = _pop_mark(stack)
        callee = items[0] if items else _Opaque("?")
        stack.append(_Opaque(f"{summarize(callee)}(...)"))
    elif name == "BUILD":
        _pop(stack)
        target = _pop(stack)
        stack.append(target if isinstance(target, _Opaque) else _Opaque(f"{summarize(target)} (built)"))
    elif name in ("PERSID", "BINPERSID"):
        if name == "BINPERSID":
            _pop(stack)
        stack.append(_Opaque("persistent id (storage)"))
    elif name == "POP":
        _pop(stack)
    elif name == "POP_MARK":
        _pop_mark(stack)
    elif name == "DUP":
        stack.append(stack[-1] if stack else None)
    elif name in ("EXT1", "EXT2", "EXT4"):
        stack.append(_Opaque(f"extension code {arg}"))
    elif name == "NEXT_BUFFER" or name == "READONLY_BUFFER":
        stack.append(_Opaque("out-of-band buffer"))
    else:
        raise _GiveUp(f"unsupported opcode {name}")
    return None
