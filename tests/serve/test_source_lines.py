"""The linecache entry load registers for python_code: every reader sees the text that ran, whatever is
on disk, and the text is split (or fetched) once, when first read."""
from __future__ import annotations

import inspect
import linecache
import traceback

import pytest

from precompile.serve import source_lines

TEXT = "def add(a, b):\n    return a + b\n\n\ndef fail():\n    raise ValueError('from the registered text')\n"


def _run(filename: str) -> dict:
    namespace: dict = {}
    exec(compile(TEXT, filename, "exec"), namespace)
    return namespace


@pytest.fixture(params=["text", "function"])
def registered(request, tmp_path):
    """A file on disk that says something else, registered with TEXT (given as is, or by a function)."""
    path = tmp_path / "python_code.py"
    path.write_text("# another capture's python_code\n" * 10)
    calls = []

    def text():
        calls.append(1)
        return TEXT

    source_lines.register(str(path), TEXT if request.param == "text" else text)
    yield path, calls, request.param
    linecache.cache.pop(str(path), None)


def test_linecache_serves_the_registered_text_not_the_file(registered):
    path, calls, _ = registered
    assert linecache.getline(str(path), 2) == "    return a + b\n"
    assert linecache.getlines(str(path)) == TEXT.splitlines(keepends=True)
    path.write_text("changed\n")
    linecache.checkcache(str(path))
    linecache.checkcache()
    assert linecache.getline(str(path), 6).strip() == "raise ValueError('from the registered text')"
    path.unlink()
    linecache.checkcache()
    assert linecache.getline(str(path), 1) == "def add(a, b):\n"
    size, mtime, lines, fullname = linecache.cache[str(path)]
    assert (size, mtime, lines, fullname) == (len(TEXT), None, TEXT.splitlines(keepends=True), str(path))
    assert len(calls) <= 1


def test_tracebacks_and_inspect_read_the_registered_text(registered):
    path, _, _ = registered
    namespace = _run(str(path))
    with pytest.raises(ValueError) as raised:
        namespace["fail"]()
    printed = "".join(traceback.format_exception(raised.value))
    assert "raise ValueError('from the registered text')" in printed
    assert inspect.getsource(namespace["add"]) == "def add(a, b):\n    return a + b\n"


def test_the_text_is_fetched_and_split_only_when_first_read(registered):
    path, calls, given = registered
    entry = linecache.cache[str(path)]
    assert len(entry) == 4 and calls == []  # linecache's check of an entry's length reads no line
    assert tuple.__getitem__(entry, 2) == []  # nothing split yet
    linecache.getline(str(path), 1)
    linecache.getline(str(path), 2)
    assert tuple.__getitem__(entry, 2) == TEXT.splitlines(keepends=True)  # filled in place, for C readers
    assert calls == ([1] if given == "function" else [])


def test_the_entry_copies_and_pickles_as_the_plain_entry_it_reads_as(registered):
    """`copy.deepcopy(linecache.cache)` or a pickle of it works as with attrs-style plain tuples (helper-20)."""
    import copy
    import pickle

    path, _, _ = registered
    entry = linecache.cache[str(path)]
    plain = (len(TEXT), None, TEXT.splitlines(keepends=True), str(path))
    assert copy.deepcopy(entry) == copy.copy(entry) == pickle.loads(pickle.dumps(entry)) == plain


def test_lines_are_numbered_as_the_compiler_numbers_them(tmp_path):
    """A form feed or a line separator inside a line is no line break to the compiler, nor to the
    registered lines: the line a traceback names is the line that ran (str.splitlines would shift it)."""
    text = "x = '\f\x1c\x85\u2028'\r\ny = 2\rdef fail():\n    raise ValueError('the line that ran')\n"
    filename = str(tmp_path / "separators.py")
    source_lines.register(filename, text)
    try:
        namespace: dict = {}
        exec(compile(text, filename, "exec"), namespace)
        with pytest.raises(ValueError) as raised:
            namespace["fail"]()
        lineno = raised.value.__traceback__.tb_next.tb_lineno
        assert linecache.getline(filename, lineno).strip() == "raise ValueError('the line that ran')"
    finally:
        linecache.cache.pop(filename, None)
