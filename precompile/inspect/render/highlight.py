"""A small, dependency-free syntax highlighter for the HTML report: Python through `tokenize`, C++
through one regular expression. Output is HTML-escaped text with `<span class="...">` around
tokens, one line per source line (a token spanning lines is closed and reopened at each newline),
so a caller can number the lines. Artifacts are untrusted: every byte of the source is escaped (its
control, bidirectional and invisible characters first written as `\\xNN`/`\\uNNNN` by
`terminal_text.printable`, so no reordering hides code from the reader), and a file the tokenizer
rejects is shown plain.
"""
from __future__ import annotations

import builtins
import io
import keyword
import re
import tokenize

from markupsafe import Markup, escape

from precompile.inspect.render.terminal_text import printable

_BUILTINS = frozenset(name for name in dir(builtins) if not name.startswith("_"))
_STRING_TYPES = frozenset(getattr(tokenize, name) for name in ("STRING", "FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")
                          if hasattr(tokenize, name))

_CPP_KEYWORDS = (
    "alignas alignof auto bool break case catch char class const constexpr const_cast continue decltype default delete do "
    "double dynamic_cast else enum explicit extern false float for friend goto if inline int int8_t int16_t int32_t int64_t "
    "long namespace new noexcept nullptr operator private protected public register reinterpret_cast return short signed "
    "sizeof static static_assert static_cast struct switch template this throw true try typedef typename uint8_t uint16_t "
    "uint32_t uint64_t union unsigned using virtual void volatile while size_t"
).split()
_CPP = re.compile(
    r"(?P<c>//[^\n]*|/\*.*?(?:\*/|\Z))"
    r"|(?P<p>^[ \t]*\#[^\n]*)"
    r"|(?P<s>\"(?:[^\"\\\n]|\\.)*\"?|'(?:[^'\\\n]|\\.)*'?)"
    r"|(?P<m>\b(?:0[xX][0-9a-fA-F]+|\d+\.?\d*(?:[eE][-+]?\d+)?)[uUlLfF]*\b)"
    r"|(?P<k>\b(?:" + "|".join(_CPP_KEYWORDS) + r")\b)",
    re.DOTALL | re.MULTILINE,
)


def _span(cls: str | None, text: str) -> str:
    """`text` escaped, wrapped in a span of class `cls` line by line (so no span crosses a newline)."""
    if not cls:
        return str(escape(text))
    return "\n".join(f'<span class="{cls}">{escape(part)}</span>' if part else "" for part in text.split("\n"))


def _python(text: str) -> str:
    offsets = [0]
    for line in io.StringIO(text).readlines():  # the lines tokenize reads: split at "\n" only
        offsets.append(offsets[-1] + len(line))

    def at(row: int, col: int) -> int:
        return offsets[min(row - 1, len(offsets) - 1)] + col

    out: list[str] = []
    done = 0
    previous = ""
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            start, end = at(*token.start), at(*token.end)
            if start < done or end <= start:
                continue
            out.append(_span(None, text[done:start]))
            value = text[start:end]
            cls: str | None
            if token.type == tokenize.COMMENT:
                cls = "c"
            elif token.type in _STRING_TYPES:
                cls = "s"
            elif token.type == tokenize.NUMBER:
                cls = "m"
            elif token.type == tokenize.NAME:
                cls = ("f" if previous in ("def", "class") else "k" if keyword.iskeyword(value)
                       else "b" if value in _BUILTINS else None)
            else:
                cls = None
            out.append(_span(cls, value))
            done = end
            if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                previous = value
    except (tokenize.TokenError, SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    out.append(_span(None, text[done:]))
    return "".join(out)


def _cpp(text: str) -> str:
    out: list[str] = []
    done = 0
    for match in _CPP.finditer(text):
        out.append(_span(None, text[done:match.start()]))
        out.append(_span(match.lastgroup, match.group()))
        done = match.end()
    out.append(_span(None, text[done:]))
    return "".join(out)


def language_of(path: str) -> str:
    """"python", "cpp" or "text", by the file's name."""
    lowered = path.lower()
    if lowered.endswith((".py", ".pyi")):
        return "python"
    if lowered.endswith((".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".cu", ".cuh")):
        return "cpp"
    return "text"


def highlight_lines(text: str, language: str) -> list[Markup]:
    """The source as escaped, highlighted HTML, one Markup per line (without its newline)."""
    text = printable(text.replace("\r\n", "\n").replace("\r", "\n"), lines=True)
    if language == "python":
        html = _python(text)
    elif language == "cpp":
        html = _cpp(text)
    else:
        html = str(escape(text))
    lines = html.split("\n")
    if lines and lines[-1] == "" and text.endswith("\n"):
        lines.pop()
    return [Markup(line) for line in lines]
