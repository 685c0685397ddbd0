"""python_code stored a part at a time runs as the module runs, and only where it can."""
from __future__ import annotations

import hashlib
import marshal
import traceback

import pytest

from precompile.artifact import bytecode, bytecode_check, code_parts
from precompile.artifact.pycode import code_hash

FILENAME = "<parts test>"
FLAGS = bytecode.COMPILE_FLAGS
# Top-level statements of every kind the renderer writes, and some it does not: strings at column 0
# inside a statement (cuts there do not compile alone, so the part grows), decorators, clauses.
SOURCE = '''"""The module's docstring."""
DOC = __doc__
annotated: "Box" = None
import functools
VALUE = 1
TEXT = """
line at column 0
x = 1
"""
def double(x: int) -> int:
    return 2 * x
@functools.lru_cache
def cached(x):
    return x + VALUE
class Box:
    size: int = 3
    def area(self):
        return self.size ** 2
if VALUE:
    BRANCH = "if"
else:
    BRANCH = "else"
try:
    raise KeyError("k")
except KeyError:
    CAUGHT = True
finally:
    DONE = True
SQUARES = [i * i for i in range(5)]
annotated = Box()
def fails():
    raise ValueError("from a later part")
TAIL = (double(3), cached(2), Box().area(), DOC)
'''


@pytest.fixture
def small_parts(monkeypatch):
    monkeypatch.setattr(code_parts, "PART_CHARS", 40)
    monkeypatch.setattr(code_parts, "WHOLE_MAX_CHARS", 100)


def _run(codes):
    """The namespace the codes leave, run as load runs them (serve/load.exec_registered)."""
    from precompile.serve.load import exec_registered

    namespace = {"__name__": "m"}
    exec_registered("", FILENAME, namespace, code=tuple(codes))
    return namespace


def _values(namespace):
    return {k: v for k, v in namespace.items() if k.isupper() or k in ("__doc__", "__annotations__")}


def test_the_parts_run_as_the_module_runs(small_parts):
    lines, codes = code_parts.capture_parts(SOURCE, FILENAME, FLAGS, 0)
    assert len(lines) >= 5 and lines[0] == 1
    whole = _run([compile(SOURCE, FILENAME, "exec", flags=FLAGS, dont_inherit=True)])
    parted = _run(codes)
    assert _values(parted) == _values(whole) and parted["TAIL"][3] == "The module's docstring."
    assert parted["__annotations__"] == whole["__annotations__"] == {"annotated": "'Box'"}  # stringified, as in the file
    # A traceback names the file's own line, from whichever part the function was defined in.
    for namespace in (whole, parted):
        with pytest.raises(ValueError) as raised:
            namespace["fails"]()
        assert traceback.extract_tb(raised.value.__traceback__)[-1].lineno == SOURCE.splitlines().index('    raise ValueError("from a later part")') + 1
    again = list(code_parts.compiled_parts(SOURCE, FILENAME, FLAGS, 0, lines))
    assert marshal.dumps(tuple(again), 2) == marshal.dumps(tuple(codes), 2)


def test_later_parts_are_compiled_with_the_files_future_features(small_parts):
    # An annotation naming what does not exist is a NameError unless annotations are postponed, as the
    # file's first line asks (and capture's compile flags do for every part).
    source = "from __future__ import annotations\n" + "".join(f"X{i} = {i}\n" for i in range(30)) + "def f(x: Undefined): pass\n"
    lines, codes = code_parts.capture_parts(source, FILENAME, FLAGS, 0)
    assert len(lines) > 2 and _run(codes)["f"].__annotations__ == {"x": "Undefined"}


PAD = "pad = 0\n" * 8
# Found by the hostile review of this layout: each ran otherwise as parts than as the module (or the
# module did not compile while the parts did), with parts capture and verify's proof had accepted.
RUN_OTHERWISE_ALONE = {
    "global after a binding": "x = 1\n" + PAD + "global x\n",
    "global after a use, nested": "print(x)\n" + PAD + "if True:\n    global x\n",
    "builtins rebound": "__builtins__ = {'len': lambda o: 42}\n" + PAD + "n = len('abc')\n",
    "builtins deleted": "X = 1\n" + PAD + "del __builtins__\n" + PAD + "has = '__builtins__' in globals()\n",
    "barry": "from __future__ import barry_as_FLUFL\n" + PAD + "t = 1 <> 2\n",
}


@pytest.mark.parametrize("source", list(RUN_OTHERWISE_ALONE.values()), ids=list(RUN_OTHERWISE_ALONE))
def test_a_part_that_would_run_otherwise_alone_is_neither_captured_nor_proven(small_parts, source):
    assert code_parts.capture_parts(source, FILENAME, FLAGS, 0) is None
    lines = tuple(sorted({1, *(i + 1 for i, line in enumerate(source.splitlines()) if line and not line[0].isspace())}))
    with pytest.raises((code_parts.NotInParts, SyntaxError)):
        list(code_parts.compiled_parts(source, FILENAME, FLAGS, 0, lines))


def test_a_later_part_that_annotates_finds_annotations_set_up_before_the_first_as_in_the_file(small_parts):
    # Found by the hostile review: the module sets __annotations__ up before its first statement.
    from precompile.serve.load import exec_registered

    source = "had = '__annotations__' in globals()\n" + PAD + "x: int = 1\n" + PAD + "y: 'Box' = 2\n"
    lines, codes = code_parts.capture_parts(source, FILENAME, FLAGS, 0)
    assert len(lines) > 2 and code_parts.sets_up_annotations(codes) and not code_parts.sets_up_annotations(codes[:1])
    served, alone = {}, {}
    exec_registered(source, FILENAME, served, code=tuple(codes))
    exec(compile(source, FILENAME, "exec", flags=FLAGS, dont_inherit=True), alone)
    assert served["had"] is alone["had"] is True and served["__annotations__"] == alone["__annotations__"] == {"x": "int", "y": "'Box'"}
    plain, unannotated = {}, "A = 1\n" + PAD + "B = 2\n"
    exec_registered(unannotated, FILENAME, plain, code=tuple(code_parts.capture_parts(unannotated, FILENAME, FLAGS, 0)[1]))
    assert "__annotations__" not in plain


def test_global_in_a_function_of_a_later_part_is_as_in_the_file(small_parts):
    source = "x = 1\n" + PAD + "def f():\n    global x\n    x = 2\n" + PAD + "f()\n"
    lines, codes = code_parts.capture_parts(source, FILENAME, FLAGS, 0)
    assert len(lines) > 1 and _run(codes)["x"] == 2


@pytest.mark.parametrize("later", ['"a string that would become __doc__"\n', "from __future__ import annotations\n",
                                   "print(__doc__)\n"])
def test_a_part_that_would_run_otherwise_alone_keeps_python_code_whole(small_parts, later):
    source = "".join(f"X{i} = {i}\n" for i in range(20)) + later + "".join(f"Y{i} = {i}\n" for i in range(20))
    parts = code_parts.capture_parts(source, FILENAME, FLAGS, 0)
    assert parts is None or all(source.splitlines()[line - 1] != later.strip() for line in parts[0][1:])
    if parts is not None:  # the statement landed inside a part that starts elsewhere
        assert _values(_run(parts[1])) == _values(_run([compile(source, FILENAME, "exec", flags=FLAGS, dont_inherit=True)]))


def test_carriage_returns_keep_python_code_whole(small_parts):
    assert code_parts.capture_parts("A = 1\r\n" * 50, FILENAME, FLAGS, 0) is None


def test_the_digest_is_the_marshalled_tuples(small_parts):
    _, codes = code_parts.capture_parts(SOURCE, FILENAME, FLAGS, 0)
    modules = {"ab": compile("y = 2", "<m>", "exec")}
    assert code_parts.digest_of(iter(codes), len(codes), modules) == hashlib.sha256(marshal.dumps((tuple(codes), modules), 2)).digest()


def _prepared(source):
    digest = code_hash(source.encode())
    compiled, _ = bytecode.prepare(source, digest, None, __import__("ast").parse(source))
    return digest, compiled


def test_capture_stores_big_python_code_in_parts_and_verify_proves_it(small_parts, monkeypatch):
    monkeypatch.setattr(bytecode, "_metadata_encoder", type("E", (), {"encode": staticmethod(lambda m: b"")})())
    digest, compiled = _prepared(SOURCE)
    assert compiled.flags == FLAGS | code_parts.PARTS and len(compiled.part_lines) >= 5
    tree = __import__("ast").parse(SOURCE)
    assert bytecode_check.bytecode_problem(SOURCE, digest, compiled, tree) is None
    assert bytecode.unusable_reason(compiled, digest) is None
    replace = __import__("msgspec").structs.replace
    shifted = replace(compiled, part_lines=(1, *(line + 1 for line in compiled.part_lines[1:])))
    assert bytecode_check.bytecode_problem(SOURCE, digest, shifted, tree) is not None
    unflagged = replace(compiled, flags=FLAGS)
    for forged in (unflagged, replace(compiled, part_lines=())):
        assert "disagree on whether it is stored a part at a time" in bytecode_check.bytecode_problem(SOURCE, digest, forged, tree)
        assert "disagree" in bytecode.unusable_reason(forged, digest)
    countless = tuple(range(1, code_parts.MAX_PARTS + 2))
    for lines, problem in [((2, 5), "must start at line 1"), ((1, 9, 9), "not increasing"), ((1, 10_000), "past python_code's"),
                           (countless, "capture writes at most 4096")]:
        assert problem in bytecode_check.bytecode_problem(SOURCE, digest, replace(compiled, part_lines=lines), tree)
        if problem != "past python_code's":  # load, without python_code's text, refuses the others too (a new user's trial)
            assert problem in bytecode.unusable_reason(replace(compiled, part_lines=lines), digest)
    # A cut moved into a statement (the body of `double`): the part, not python_code, is named as not compiling.
    body = SOURCE.splitlines().index("    return 2 * x") + 1
    into = replace(compiled, part_lines=tuple(sorted({*compiled.part_lines, body})))
    problem = bytecode_check.bytecode_problem(SOURCE, digest, into, tree)
    assert problem.startswith("python_code does not run as the parts it is stored in: the part at line") and "does not compile alone" in problem


def test_a_part_forged_to_start_at_a_string_is_refused_by_the_proof(small_parts, monkeypatch):
    monkeypatch.setattr(bytecode, "_metadata_encoder", type("E", (), {"encode": staticmethod(lambda m: b"")})())
    source = "".join(f"X{i} = {i}\n" for i in range(20)) + '"not a docstring in the file"\n' + "Y = 1\n"
    digest, compiled = _prepared(source)
    string_line = source.splitlines().index('"not a docstring in the file"') + 1
    forged = __import__("msgspec").structs.replace(compiled, part_lines=(1, string_line))
    problem = bytecode_check.bytecode_problem(source, digest, forged, __import__("ast").parse(source))
    assert problem.startswith("python_code does not run as the parts it is stored in")
