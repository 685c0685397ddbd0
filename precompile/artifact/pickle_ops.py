"""A pickle's opcode stream, read the way CPython's C unpickler (`_pickle.c`) reads it.

`pickletools.genops` parses the text arguments of protocol 0 by its own rules, which differ from
the unpickler's: it reads INT and GET with `int(text)` where the unpickler uses `strtol(s, 0)` (so
`I0x10` is 16 to the unpickler and an error to genops), escape-decodes GLOBAL names, and so on. A
scan that stops where the unpickler goes on is blind to everything after. `read_ops` therefore
decodes every opcode with pickletools' table, but reads each text argument exactly as `_pickle.c`
does (INT, LONG, FLOAT, STRING, GET, PUT, GLOBAL, INST, PERSID); binary arguments are read by
pickletools, whose readers agree with the unpickler byte for byte. Nothing is ever unpickled.
"""
from __future__ import annotations

import codecs
import io
import pickletools
import re
from collections.abc import Callable, Iterator

_BY_CODE = {op.code.encode("latin-1"): op for op in pickletools.opcodes}
OPCODE_BYTES = frozenset(code[0] for code in _BY_CODE)
"""The first byte of every opcode: a protocol 0/1 pickle starts with one of them."""
_C_SPACE = b" \t\n\v\f\r"
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_FLOAT = re.compile(rb"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)", re.IGNORECASE)


class PickleStreamError(ValueError):
    """The C unpickler would stop here too: the opcode stream is malformed at this point."""


def _readline(stream: io.BytesIO, minimum: int = 2) -> bytes:
    """A line with its newline, as `_Unpickler_Readline` returns it; shorter than `minimum` is an error."""
    line = stream.readline()
    if not line.endswith(b"\n"):
        raise PickleStreamError("pickle data was truncated: a text argument has no newline")
    if len(line) < minimum:
        raise PickleStreamError("pickle data was truncated: a text argument is empty")
    return line


def _c_string(line: bytes) -> bytes:
    """The C string the unpickler hands to strtol and PyLong_FromString: the line up to its first NUL."""
    return line.split(b"\0", 1)[0]


def _digit(byte: int, base: int) -> bool:
    value = byte - 48 if 48 <= byte <= 57 else (byte | 0x20) - 87 if 97 <= (byte | 0x20) <= 122 else 99
    return value < base


def _strtol(text: bytes) -> tuple[int, int, bool]:
    """C's `strtol(text, &end, 0)`: (value, end offset, overflowed). No digits: (0, 0, False)."""
    at, size = 0, len(text)
    while at < size and text[at] in _C_SPACE:
        at += 1
    negative = at < size and text[at] == 0x2D
    at += at < size and text[at] in b"+-"
    base = 10
    if at < size and text[at] == 0x30:
        hex_prefix = at + 2 < size and text[at + 1] in b"xX" and _digit(text[at + 2], 16)
        base, at = (16, at + 2) if hex_prefix else (8, at)
    start = at
    while at < size and _digit(text[at], base):
        at += 1
    if at == start:
        return 0, 0, False
    value = int(text[start:at], base) * (-1 if negative else 1)
    return value, at, not _LONG_MIN <= value <= _LONG_MAX


def _int_from_string(text: bytes, base: int) -> int:
    """`PyLong_FromString(text, NULL, base)`: surrounding whitespace, underscores and (base 0) prefixes."""
    try:
        return int(_c_string(text), base)
    except ValueError:
        raise PickleStreamError(f"could not convert {text[:40]!r} to int") from None


def read_int(stream: io.BytesIO) -> int | bool:
    """INT (`load_int`): strtol base 0, falling back to PyLong_FromString base 0; a 3-byte line holding 0 or 1 is a bool."""
    line = _readline(stream)
    value, end, overflowed = _strtol(line)
    if overflowed or line[end : end + 1] not in (b"\n", b"\0"):
        return _int_from_string(line, 0)
    return bool(value) if len(line) == 3 and value in (0, 1) else value


def read_long(stream: io.BytesIO) -> int:
    """LONG (`load_long`): a trailing L is cut off (not required), then PyLong_FromString base 0."""
    line = _readline(stream)
    if line[-2:-1] == b"L":
        line = line[:-2]
    return _int_from_string(line, 0)


def read_memo_index(stream: io.BytesIO) -> int:
    """GET and PUT (`load_get`, `load_put`): PyLong_FromString base 10."""
    return _int_from_string(_readline(stream), 10)


def read_float(stream: io.BytesIO) -> float:
    """FLOAT (`load_float`): PyOS_string_to_double, which must stop at the newline (or a NUL); overflow is an error."""
    line = _readline(stream)
    match = _FLOAT.match(line)
    if match is None or line[match.end() : match.end() + 1] not in (b"\n", b"\0"):
        raise PickleStreamError(f"could not convert {line[:40]!r} to float")
    value = float(match.group())
    if value in (float("inf"), float("-inf")) and b"inf" not in match.group().lower():
        raise PickleStreamError(f"float {line[:40]!r} overflows")
    return value


def read_string(stream: io.BytesIO) -> str:
    """STRING (`load_string`): quoted with matching quotes, escapes decoded; kept as latin-1 text."""
    body = _readline(stream)[:-1]
    if len(body) < 2 or body[0] != body[-1] or body[0] not in b"'\"":
        raise PickleStreamError("the STRING opcode argument must be quoted")
    return codecs.escape_decode(body[1:-1])[0].decode("latin-1")


def _utf8_line(stream: io.BytesIO) -> str:
    line = _readline(stream)
    try:
        return line[:-1].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PickleStreamError(f"a GLOBAL/INST name is not UTF-8: {exc}") from None


def read_names(stream: io.BytesIO) -> str:
    """GLOBAL and INST (`load_global`, `load_inst`): two UTF-8 lines taken as they are (no escapes),
    returned as pickletools does, "module name"."""
    module = _utf8_line(stream)
    return f"{module} {_utf8_line(stream)}"


def read_persistent_id(stream: io.BytesIO) -> str:
    """PERSID (`load_persid`): one ASCII line."""
    line = _readline(stream, minimum=1)
    try:
        return line[:-1].decode("ascii")
    except UnicodeDecodeError:
        raise PickleStreamError("persistent IDs in protocol 0 must be ASCII strings") from None


_C_READERS: dict[str, Callable[[io.BytesIO], object]] = {
    "INT": read_int, "LONG": read_long, "GET": read_memo_index, "PUT": read_memo_index, "FLOAT": read_float,
    "STRING": read_string, "GLOBAL": read_names, "INST": read_names, "PERSID": read_persistent_id,
}


def read_ops(data: bytes) -> Iterator[tuple[str, object, int]]:
    """(opcode name, argument, offset) of each opcode up to and including STOP; raises
    PickleStreamError (or pickletools' ValueError) where the unpickler would stop reading."""
    stream = io.BytesIO(data)
    while True:
        pos = stream.tell()
        code = stream.read(1)
        op = _BY_CODE.get(code)
        if op is None:
            raise PickleStreamError(f"invalid load key {code!r} at offset {pos}" if code else
                                    f"pickle data was truncated: no STOP opcode before offset {pos}")
        reader = _C_READERS.get(op.name) or (op.arg.reader if op.arg is not None else None)
        yield op.name, reader(stream) if reader is not None else None, pos
        if op.name == "STOP":
            return


def looks_like_pickle(data: bytes) -> bool:
    """A protocol 2+ header, or a protocol 0/1 stream that starts like one (an opcode byte)."""
    if len(data) < 4:
        return False
    if data[0] == 0x80:
        return data[1] <= 5
    return data[0] in OPCODE_BYTES
