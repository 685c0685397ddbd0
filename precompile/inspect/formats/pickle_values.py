"""The plain values a pickle holds, read statically: strings, numbers, bytes, tuples, lists, dicts.

A torch.save'd dict such as upstream precompile's `data.pkl` holds its fields as plain literals, and
pickle protocol 2 spells a bytes value as the call `_codecs.encode(<latin-1 str>, "latin1")`. This
reader follows only literal opcodes, the memo and container building, and recognises that one call
by its shape, computing its result itself (`str.encode("latin-1")`); every other global, call or
persistent id becomes `Opaque`. Nothing from the pickle is imported or called. What the pickle would
import is `pickle_scan.scan_pickle`'s job; this module only reads values out of it.
"""
from __future__ import annotations

from precompile.inspect.pickle_ops import read_ops

MAX_OPS = 2_000_000


class Opaque:
    """A value only running the pickle could produce (a global, a call, a persistent id)."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<{self.what}>"


class PickleValueError(ValueError):
    """The pickle is malformed, or its structure cannot be followed statically."""


_MARK = object()
_LATIN1_ENCODE = ("_codecs", "encode")
_EMPTY_BYTES = {("__builtin__", "bytes"), ("builtins", "bytes")}
_LITERALS = frozenset(
    "INT BININT BININT1 BININT2 LONG LONG1 LONG4 FLOAT BINFLOAT STRING BINSTRING SHORT_BINSTRING UNICODE "
    "BINUNICODE SHORT_BINUNICODE BINUNICODE8 BINBYTES SHORT_BINBYTES BINBYTES8 BYTEARRAY8".split()
)


class _Global:
    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


def _pop(stack: list):
    if not stack or stack[-1] is _MARK:
        raise PickleValueError("stack underflow")
    return stack.pop()


def _pop_mark(stack: list) -> list:
    for index in range(len(stack) - 1, -1, -1):
        if stack[index] is _MARK:
            items = stack[index + 1 :]
            del stack[index:]
            return items
    raise PickleValueError("MARK missing")


def _key(value):
    try:
        hash(value)
    except TypeError:
        return Opaque("unhashable key")
    return value


def _call(callee, args):
    """The result of REDUCE, when it is one of the two calls whose result is plain data."""
    if isinstance(callee, _Global) and isinstance(args, tuple):
        if (callee.module, callee.name) == _LATIN1_ENCODE and len(args) == 2 and isinstance(args[0], str) and args[1] in ("latin1", "latin-1"):
            try:
                return args[0].encode("latin-1")
            except UnicodeEncodeError:
                return Opaque("_codecs.encode of a non-latin-1 string")
        if (callee.module, callee.name) in _EMPTY_BYTES and args == ():
            return b""
        return Opaque(f"{callee.module}.{callee.name}(...)")
    return Opaque("call")


def pickle_value(data: bytes):
    """The value `data` would unpickle to, as far as it is plain data; raises PickleValueError."""
    stack: list = []
    memo: dict = {}
    try:
        for count, (name, arg, _pos) in enumerate(read_ops(data)):
            if count >= MAX_OPS:
                raise PickleValueError(f"more than {MAX_OPS} opcodes")
            if name in ("PROTO", "FRAME"):
                continue
            if name == "STOP":
                return _pop(stack)
            if name in _LITERALS:
                stack.append(arg)
            elif name in ("NONE", "NEWTRUE", "NEWFALSE"):
                stack.append({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}[name])
            elif name == "MARK":
                stack.append(_MARK)
            elif name == "EMPTY_DICT":
                stack.append({})
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
                if not stack:
                    raise PickleValueError("memo store from an empty stack")
                memo[arg] = stack[-1]
            elif name == "MEMOIZE":
                if not stack:
                    raise PickleValueError("memo store from an empty stack")
                memo[len(memo)] = stack[-1]
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                if arg not in memo:
                    raise PickleValueError(f"memo {arg} missing")
                stack.append(memo[arg])
            elif name == "TUPLE":
                stack.append(tuple(_pop_mark(stack)))
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                stack.append(tuple([_pop(stack) for _ in range(int(name[-1]))][::-1]))
            elif name == "LIST":
                stack.append(_pop_mark(stack))
            elif name == "DICT":
                items = _pop_mark(stack)
                stack.append({_key(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)})
            elif name in ("APPEND", "APPENDS"):
                items = [_pop(stack)] if name == "APPEND" else _pop_mark(stack)
                target = _pop(stack)
                if isinstance(target, list):
                    target.extend(items)
                stack.append(target)
            elif name in ("SETITEM", "SETITEMS"):
                items = _pop_mark(stack) if name == "SETITEMS" else [_pop(stack), _pop(stack)][::-1]
                target = _pop(stack)
                if isinstance(target, dict):
                    for i in range(0, len(items) - 1, 2):
                        target[_key(items[i])] = items[i + 1]
                stack.append(target)
            elif name == "GLOBAL":
                module, _, attr = str(arg).partition(" ")
                stack.append(_Global(module, attr))
            elif name == "STACK_GLOBAL":
                attr, module = _pop(stack), _pop(stack)
                stack.append(_Global(module, attr) if isinstance(module, str) and isinstance(attr, str) else Opaque("computed global"))
            elif name == "REDUCE":
                args = _pop(stack)
                stack.append(_call(_pop(stack), args))
            elif name in ("BINPERSID", "PERSID"):
                if name == "BINPERSID":
                    _pop(stack)
                stack.append(Opaque("persistent id"))
            elif name == "POP":
                _pop(stack)
            elif name == "POP_MARK":
                _pop_mark(stack)
            elif name == "DUP":
                stack.append(stack[-1] if stack else Opaque("empty"))
            else:
                raise PickleValueError(f"opcode {name} is not plain data")
    except PickleValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - read_ops on malformed bytes raises ValueError, EOFError, ...
        raise PickleValueError(f"not a well-formed pickle: {type(exc).__name__}: {exc}") from None
    raise PickleValueError("no STOP opcode")
