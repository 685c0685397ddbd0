"""`show` and `diff` stay linear on big python_code: the line diff is bounded in work and in output,
and input nested past what Python parses is a clear problem, never a traceback."""
from __future__ import annotations

import base64
import difflib
import json
import pickle
import random
import subprocess
import sys

import pytest

from test_inspect_helpers import FIXTURES, ROOT, run_cli

from precompile.inspect.diff import line_diff


def _apply(a: list[str], b: list[str], codes: list[line_diff.Opcode]) -> list[str]:
    """b rebuilt from a and the opcodes, checking that they cover both sides in order."""
    out: list[str] = []
    i = j = 0
    for tag, i1, i2, j1, j2 in codes:
        assert (i1, j1) == (i, j)
        if tag == "equal":
            assert a[i1:i2] == b[j1:j2]
        out += a[i1:i2] if tag == "equal" else b[j1:j2]
        i, j = i2, j2
    assert (i, j) == (len(a), len(b))
    return out


def _edited(rng: random.Random, a: list[str], edits: int, alphabet: int) -> list[str]:
    b = list(a)
    for _ in range(rng.randint(0, edits)):
        where = rng.randint(0, len(b))
        kind = rng.random()
        if kind < 0.3 and where < len(b):
            del b[where]
        elif kind < 0.6 or where == len(b):
            b.insert(where, str(rng.randrange(alphabet)))
        else:
            b[where] = str(rng.randrange(alphabet))
    return b


def test_a_small_diff_is_difflibs_own():
    rng = random.Random(0)
    for _ in range(500):
        a = [str(rng.randrange(6)) for _ in range(rng.randint(0, 40))]
        b = _edited(rng, a, 8, 9)
        expected = tuple(difflib.unified_diff(a, b, "a", "b", n=3, lineterm=""))
        assert line_diff.unified(a, b, "a", "b", context=3, max_lines=10**6).lines == expected


def test_a_large_diff_rebuilds_its_target(monkeypatch):
    monkeypatch.setattr(line_diff, "SMALL_REGION", 16)  # the unique-line matching, not difflib
    rng = random.Random(1)
    for _ in range(200):
        a = [str(rng.randrange(60)) for _ in range(rng.randint(0, 300))]
        b = _edited(rng, a, 30, 99)
        assert _apply(a, b, line_diff.opcodes(a, b)) == b


def test_work_past_the_cap_is_replaced_wholesale_and_still_correct(monkeypatch):
    monkeypatch.setattr(line_diff, "WORK_PER_LINE", 0)
    monkeypatch.setattr(line_diff, "SMALL_REGION", 0)
    a = [f"line {i}" for i in range(50_000)]
    b = [line + " changed" if i % 2 else line for i, line in enumerate(a)]
    codes = line_diff.opcodes(a, b)
    assert _apply(a, b, codes) == b


def test_the_shown_diff_is_capped_and_the_rest_counted():
    a = [f"line {i}" for i in range(100_000)]
    b = [line + " changed" if i % 2 else line for i, line in enumerate(a)]
    result = line_diff.unified(a, b, "a", "b", context=3, max_lines=100)
    assert result.shown == 100 and result.left_out == 100_000 - 100
    assert len(result.lines) < 250


def test_a_long_line_is_shown_by_its_head_and_digest():
    line = "x = '" + "y" * 10_000 + "'; run()"
    shown = line_diff.shown(line)
    assert len(shown) < 2200 and shown.startswith("x = 'yyy") and "line of 10013 characters, sha256 " in shown


def _big_python_code(tmp_path, rows: int) -> tuple[str, str]:
    """mlp's python_code with `rows` lines appended (about 16 bytes each); b changes every other one."""
    base = (FIXTURES / "v1/mlp.py").read_text(encoding="utf-8")
    a = base + "".join(f"# row {i}: 1\n" for i in range(rows))
    b = base + "".join(f"# row {i}: {1 + i % 2}\n" for i in range(rows))
    (tmp_path / "a.py").write_text(a, encoding="utf-8")
    (tmp_path / "b.py").write_text(b, encoding="utf-8")
    return str(tmp_path / "a.py"), str(tmp_path / "b.py")


def test_a_four_megabyte_diff_finishes_and_shows_a_bounded_part(tmp_path):
    a, b = _big_python_code(tmp_path, 250_000)
    # difflib took minutes here (quadratic: every other line differs); the bound is only a backstop
    proc = subprocess.run([sys.executable, "-m", "precompile", "diff", a, b], capture_output=True, text=True,
                          cwd=ROOT, timeout=240)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) < 4000
    assert lines[-2] == f"    ... {125_000 * 2 - 2000} more changed lines not shown"


def test_the_json_diff_counts_the_lines_it_does_not_show(capsys, tmp_path):
    a, b = _big_python_code(tmp_path, 5_000)
    rc, out, _ = run_cli(capsys, ["diff", "--json", a, b])
    report = json.loads(out)
    assert rc == 1 and report["equal"] is False
    (code,) = report["python_code"]
    assert code["lines_not_shown"] == 5_000 - 2000


@pytest.mark.parametrize("nested", ["(" * 100_000 + ")" * 100_000, "-" * 200_000 + "1", "1" + " + 1" * 300_000])
@pytest.mark.parametrize("verb", ["show", "diff"])
def test_python_code_nested_past_what_python_parses_is_a_clear_problem(capsys, tmp_path, verb, nested):
    source = (FIXTURES / "v1/mlp.py").read_text(encoding="utf-8") + f"X = {nested}\n"
    (tmp_path / "n.py").write_text(source, encoding="utf-8")
    argv = [verb, str(tmp_path / "n.py")] + ([str(FIXTURES / "v1/mlp.py")] if verb == "diff" else [])
    rc, out, err = run_cli(capsys, argv)
    assert rc == 2
    assert err.startswith(f"precompile: error: {tmp_path / 'n.py'} ") and "Traceback" not in out + err


class _CountedSections(tuple):
    """A tuple of sections that counts how often it is read whole."""

    reads = 0

    def __iter__(self):
        type(self).reads += 1
        return super().__iter__()


def test_the_pickle_scan_reads_the_section_list_once_not_once_per_pickle():
    import ast

    from precompile.inspect.parsing.opaque import OpaqueReader, read_part
    from precompile.inspect.parsing.sections import split_sections

    blob = base64.b64encode(pickle.dumps({"k": 1}, protocol=4)).decode()
    banner = "# " + "=" * 40 + "\n"
    source = "".join(f"{banner}# 1. part-{i}: Part\n{banner}_s{i} = {blob!r}\n" for i in range(2_000))
    sections = _CountedSections(section for section, _ in split_sections(source))
    reader = OpaqueReader(source, sections)
    reader.add(read_part(ast.parse(source)))
    scans, problems = reader.finish({})
    assert len(scans) == 2_000 and scans[-1].member == "python_code section part-1999: _s1999 (line 8000)" and problems == ()
    assert _CountedSections.reads == 1


def test_a_pickle_of_more_opcodes_than_the_cap_has_no_masked_fingerprint(monkeypatch):
    from precompile.inspect.diff import process_ids

    data = pickle.dumps(list(range(1_000)), protocol=4)
    assert process_ids.opaque_fingerprint(data) is not None
    monkeypatch.setattr(process_ids, "MAX_OPS", 100)
    assert process_ids.opaque_fingerprint(data) is None  # diff then compares the literal's sha256: stricter
