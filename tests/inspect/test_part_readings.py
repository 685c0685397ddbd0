"""A file read after one it shares parts with (diff of two releases) parses only the parts that
differ, and reads exactly as it reads alone: every line the reader reports is the file's own."""
from __future__ import annotations

import ast
import base64
import pickle
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from property_budget import examples
from test_inspect_helpers import FIXTURES

from precompile.inspect.parsing import chunked_parse, part_readings, rendered_guards
from precompile.inspect.reading import reader

PICKLE = base64.b64encode(pickle.dumps({"k": "v" * 40}, protocol=4)).decode()
TAIL = f"_blob = {PICKLE!r}\nBACKEND = open('x')\n"


@pytest.fixture
def every_statement_a_part(monkeypatch):
    monkeypatch.setattr(chunked_parse, "CHUNK_CHARS", 1)
    reader._parse_python_code.cache_clear()
    yield
    reader._parse_python_code.cache_clear()


@pytest.fixture
def counted_parses(monkeypatch):
    """Every statement a part of its own; the number of parts parsed so far."""
    monkeypatch.setattr(chunked_parse, "CHUNK_CHARS", 1)
    monkeypatch.setattr(part_readings, "_last", {})
    parsed = []
    real = chunked_parse.parse_source
    monkeypatch.setattr(chunked_parse, "parse_source", lambda text, **kw: parsed.append(text) or real(text, **kw))
    reader._parse_python_code.cache_clear()
    yield parsed
    reader._parse_python_code.cache_clear()


def _read(source: str) -> tuple:
    """What the reader found, the rendered guards' trees as dumps at their lines in the file."""
    info, metadata, rendered = reader._parse_python_code(source.encode(), "p.py")
    trees = [(ast.dump(node, include_attributes=True), before) for node, before in (rendered and rendered.statements) or ()]
    return info, metadata, rendered, trees


def _with_a_wrong_label(source: str) -> str:
    """The first bytecode label with another sha256: a problem that names its line."""
    return re.sub(r"(: \d+ bytes, sha256 )[0-9a-f]{64}", lambda m: m.group(1) + "0" * 64, source, count=1)


@pytest.mark.parametrize("name", ["v1/dynamo_lowered", "v1/dynamo_rows"])
def test_a_file_read_after_one_sharing_its_parts_parses_only_its_own_and_reads_as_alone(counted_parses, name):
    a = _with_a_wrong_label((FIXTURES / f"{name}.py").read_text(encoding="utf-8")) + TAIL
    b = "INSERTED_NOTE = 1\n\n" + a  # every shared part two lines further down
    alone = _read(b)
    parsed_alone = len(counted_parses)
    reader._parse_python_code.cache_clear()
    part_readings._last = {}
    _read(a)
    del counted_parses[:]
    after = _read(b)
    assert after == alone
    assert len(counted_parses) == 1 < parsed_alone  # the inserted statement alone
    info, _, rendered, trees = after
    assert "(line " in info.problem and len(info.pickles) == 1 + name.endswith("rows")  # what was compared holds lines
    if name.endswith("lowered"):  # rendered guards, and marshalled bytecode under labels
        assert trees and any("labelled" in problem for problem in info.opaque_problems)


def test_parts_past_the_kept_lines_are_remembered_without_their_trees(counted_parses, monkeypatch):
    monkeypatch.setattr(rendered_guards, "KEPT_LINES", 10)
    source = (FIXTURES / "v1/dynamo_lowered.py").read_text(encoding="utf-8")
    assert _read(source)[2].statements is None
    assert all(part is None or part.guards is None for part in part_readings.last_file().values())
    monkeypatch.setattr(rendered_guards, "KEPT_LINES", 100_000)
    info, _, rendered, _ = _read("INSERTED_NOTE = 1\n" + source)
    assert rendered.statements is None and rendered.spans and info.metadata is not None


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(["insert", "delete", "duplicate"])), max_size=4))
def test_any_file_reads_after_another_as_it_reads_alone(every_statement_a_part, edits):
    """B made from A by a few line edits (which may break a statement: the part then fails alone, or
    the file does not parse) reads after A exactly as alone."""
    lines = ((FIXTURES / "v1/dynamo_lowered.py").read_text(encoding="utf-8") + TAIL).splitlines(keepends=True)
    a = "".join(lines)
    for at, edit in edits:
        at %= len(lines)
        lines[at:at + 1] = {"insert": ["NOTE_ADDED = 2\n", lines[at]], "delete": [], "duplicate": [lines[at]] * 2}[edit]
    b = "".join(lines)
    part_readings._last = {}
    reader._parse_python_code.cache_clear()
    alone = _read(b)
    part_readings._last = {}
    reader._parse_python_code.cache_clear()
    _read(a)
    assert _read(b) == alone
