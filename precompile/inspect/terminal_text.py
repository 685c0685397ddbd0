"""Text an artifact supplied, made safe to print: what the inspect verbs and the CLI write quotes
names, paths and messages taken from files people do not trust. Control characters (escape
sequences, carriage returns, line breaks within a line), line separators, bidirectional controls and
invisible characters are written as escapes (`\\xNN`, `\\uNNNN`), never interpreted by a terminal
nor hidden from the reader."""
from __future__ import annotations

__all__ = ["printable"]

_ESCAPED = {
    **{code: f"\\x{code:02x}" for code in (*range(0x00, 0x09), *range(0x0A, 0x20), 0x7F, *range(0x80, 0xA0))},
    **{code: f"\\u{code:04x}" for code in (
        0x061C, 0x180E, *range(0x200B, 0x2010), 0x2028, 0x2029, *range(0x202A, 0x202F), 0x2060,
        *range(0x2066, 0x206A), 0xFEFF, *range(0xFFF9, 0xFFFC),
    )},
}


def printable(text: str) -> str:
    """One line of output as a terminal must show it: literally."""
    return text.translate(_ESCAPED)
