"""What a compiled kernel library runs, as one digest: the bytes of the sections the dynamic loader maps.

Two builds of one C++ source with the same flags and compiler differ only outside those sections
(the GNU build id, debug info, the static symbol table naming the source file by its hashed name),
once the capture has mapped this host's paths out of the build (capturing/kernels.reproducible). So
`diff` compares a library by this digest: a library whose code, data or relocations differ is a
change in `kernels`, two venvs of one torch build are not. Read with `struct` from the bytes, never
loaded; anything that is not a well-formed ELF file (another platform's library, a truncated or hostile
file) is digested whole.
"""
from __future__ import annotations

import hashlib
import struct

_ALLOC = 0x2  # SHF_ALLOC: the section occupies memory when the library is loaded
_NOBITS = 8  # SHT_NOBITS (.bss): its size is loaded, it has no bytes in the file
_NOT_CODE = frozenset({".note.gnu.build-id"})  # a hash of the whole build, debug info included
_MAX_SECTIONS = 4096


def code_digest(data: bytes) -> str:
    """`code sha256 …` of an ELF library's loaded sections (each one's name, type, flags, address,
    size and bytes, in file order, the build id left out), or `file sha256 …` of any other bytes."""
    digest = _loaded_sections(data)
    if digest is None:
        return "file sha256 " + hashlib.sha256(data).hexdigest()
    return "code sha256 " + digest


def _loaded_sections(data: bytes) -> str | None:
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return None
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    try:
        if wide:
            (shoff,) = struct.unpack_from(order + "Q", data, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", data, 0x3A)
            layout, expected = order + "IIQQQQIIQQ", 64
        else:
            (shoff,) = struct.unpack_from(order + "I", data, 0x20)
            shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", data, 0x2E)
            layout, expected = order + "IIIIIIIIII", 40
        if shentsize != expected or not 0 < shnum <= _MAX_SECTIONS or shstrndx >= shnum or shoff + shnum * shentsize > len(data):
            return None
        headers = [struct.unpack_from(layout, data, shoff + index * shentsize) for index in range(shnum)]
    except struct.error:
        return None
    names_at, names_size = headers[shstrndx][4], headers[shstrndx][5]
    if names_at + names_size > len(data):
        return None
    names = data[names_at:names_at + names_size]
    digest = hashlib.sha256()
    for name_at, kind, flags, address, offset, size, *_ in headers:
        end = names.find(b"\0", name_at)
        if name_at >= len(names) or end < 0:
            return None
        name = names[name_at:end]
        if not flags & _ALLOC or name.decode("latin-1") in _NOT_CODE:
            continue
        if kind != _NOBITS and offset + size > len(data):
            return None
        body = b"" if kind == _NOBITS else data[offset:offset + size]
        digest.update(struct.pack("<I", len(name)) + name + struct.pack("<IQQQ", kind, flags, address, size) + body)
    return digest.hexdigest()
