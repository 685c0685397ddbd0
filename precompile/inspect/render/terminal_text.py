"""Text an artifact supplied, made safe to show: every renderer (the text the inspect verbs and the
CLI print, diff's Markdown and JUnit XML, the HTML report; JSON escapes all non-ASCII itself) quotes
names, paths, messages and sources taken from files and stores people do not trust through this one
helper. Control characters (C0 and C1: escape sequences, carriage returns, line breaks within a
line), line and paragraph separators, bidirectional controls (U+061C, U+200E/U+200F, U+202A-U+202E,
U+2066-U+2069) and invisible characters (zero-width ones, U+FEFF, interlinear annotations) are
written as escapes (`\\xNN`, `\\uNNNN`), never interpreted by a terminal or a browser nor hidden
from the reader."""
from __future__ import annotations

__all__ = ["printable"]

_ESCAPED = {
    **{code: f"\\x{code:02x}" for code in (*range(0x00, 0x09), *range(0x0A, 0x20), 0x7F, *range(0x80, 0xA0))},
    **{code: f"\\u{code:04x}" for code in (
        0x061C, 0x180E, *range(0x200B, 0x2010), 0x2028, 0x2029, *range(0x202A, 0x202F), 0x2060,
        *range(0x2066, 0x206A), 0xFEFF, *range(0xFFF9, 0xFFFC),
    )},
}
_ESCAPED_BUT_NEWLINES = {code: escape for code, escape in _ESCAPED.items() if code != 0x0A}


def printable(text: str, *, lines: bool = False) -> str:
    """`text` as it must be shown: literally. One line of output, or with `lines` a block of them
    (a source, a page's preformatted text) whose line feeds are kept and everything else escaped."""
    return text.translate(_ESCAPED_BUT_NEWLINES if lines else _ESCAPED)
