"""The Jinja2 environment every template renders in: strict, no autoescape, stable literal output."""
from __future__ import annotations

import ast
import pprint

import jinja2

from precompile.artifact.section_grammar import BANNER, title_line

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("precompile.codegen", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)


def py_literal(value) -> str:
    """`value` as a deterministic Python literal that `ast.literal_eval` reads back."""
    return pprint.pformat(value, width=110, sort_dicts=False)


def text_literal(text: str) -> str:
    """`text` as a readable multi-line string literal: raw and triple-quoted where that reads back
    exactly (source code usually does), otherwise triple-quoted with its backslashes and quotes escaped."""
    raw = 'r"""' + text + '"""'
    if _reads_back(raw, text):
        return raw
    escaped = '"""' + text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') + '"""'
    if _reads_back(escaped, text):
        return escaped
    return repr(text)


def _reads_back(literal: str, text: str) -> bool:
    try:
        return ast.literal_eval(literal) == text
    except (SyntaxError, ValueError):
        return False


_ENV.filters["py_literal"] = py_literal
_ENV.globals.update(BANNER=BANNER, title_line=title_line)


def render(template: str, **context) -> str:
    text = _ENV.get_template(template).render(**context)
    return text.rstrip("\n") + "\n"
