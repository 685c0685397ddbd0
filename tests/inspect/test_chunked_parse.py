"""python_code parsed a part at a time reads exactly as the whole file parsed at once."""
from __future__ import annotations

import ast
import base64
import pickle

import pytest

from test_inspect_helpers import ALL, FIXTURES

from precompile.errors import PrecompileError
from precompile.inspect.parsing import chunked_parse
from precompile.inspect.reading import reader
from precompile.artifact.pycode import parse_source

STATE = base64.b64encode(pickle.dumps({"k": "v" * 40}, protocol=4)).decode()
TRICKY = f'''"""Docstring
X = 'not a statement: inside the docstring'
"""
FORMAT_VERSION = 1
if FORMAT_VERSION:
    A = 1
else:
    A = 2
try:
    pass
except Exception:
    pass
finally:
    pass
@decorator
def f():
# a comment at column 0 inside a function
    return (
1,
)
TRACER = (
'make_fx'
)
B = 1 + \\
2
BIG = """
Y = 3
""" + {STATE!r}
_state = ({STATE!r},)
'''


@pytest.fixture
def every_line_a_part(monkeypatch):
    monkeypatch.setattr(chunked_parse, "CHUNK_CHARS", 1)


def _read(source: str) -> tuple:
    """What the parts yield: each top-level statement's dump and line, the file's pickles and literals."""
    chunks = list(chunked_parse.parsed_chunks(source, filename="p.py"))
    statements = [(ast.dump(node), node.lineno + chunk.first_line - 1) for chunk in chunks for node in chunk.tree.body]
    return statements, len(chunks)


def test_parts_hold_the_statements_of_the_whole_file_at_their_lines(every_line_a_part):
    whole = parse_source(TRICKY)
    statements, parts = _read(TRICKY)
    assert statements == [(ast.dump(node), node.lineno) for node in whole.body]
    assert parts > 1  # it was cut (a part that ends inside a construct is parsed with the next ones)


@pytest.mark.parametrize("name", ALL)
def test_every_fixture_reads_the_same_in_parts(monkeypatch, name):
    data = (FIXTURES / f"{name}.py").read_bytes()
    reader._parse_python_code.cache_clear()
    whole = reader._parse_python_code(data, "p.py")
    monkeypatch.setattr(chunked_parse, "CHUNK_CHARS", 1)
    reader._parse_python_code.cache_clear()
    assert reader._parse_python_code(data, "p.py") == whole
    reader._parse_python_code.cache_clear()


@pytest.mark.parametrize("broken", ["X = (\n1,\n", "def f():\nreturn 1\n", 'S = """\nunterminated\n', "else:\n    pass\n"])
def test_a_file_that_does_not_parse_reports_the_whole_files_error(every_line_a_part, broken):
    source = TRICKY + broken + "Z = 1\n" * 50
    with pytest.raises(PrecompileError) as whole:
        parse_source(source, filename="p.py")
    with pytest.raises(PrecompileError) as parts:
        list(chunked_parse.parsed_chunks(source, filename="p.py"))
    assert str(parts.value) == str(whole.value)


def test_a_metadata_literal_that_is_not_one_is_named_at_its_line_in_the_file(every_line_a_part):
    source = (FIXTURES / "v1/mlp.py").read_text(encoding="utf-8") + "BACKEND = open('x')\n"
    reader._parse_python_code.cache_clear()
    info, _, _ = reader._parse_python_code(source.encode(), "p.py")
    reader._parse_python_code.cache_clear()
    assert info.problem == f"p.py has metadata that is not a Python literal: BACKEND (line {source.count(chr(10))})"
