"""The inspect verbs read python_code in time and memory linear in its size (issue 40): no syntax
tree of the whole file is held, and four times the code takes about four times as long."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from test_inspect_helpers import FIXTURES

from precompile.inspect.api import guards_report, open_path, show_report, verify_report
from precompile.inspect.parsing import chunked_parse, part_readings

BASE = FIXTURES / "v1" / "dynamo_lowered"


def _pair(directory: Path, name: str, statements: int) -> Path:
    """dynamo_lowered (its guards rendered) with `statements` plain code lines appended, and a line
    naming the file, so that no two pairs read alike (nothing is served from a reader's cache)."""
    prefix = directory / name
    code = f"# {name}\n" + "".join(f"value_{i} = value_{i - 1} + {i % 7} if {i} % 3 else None\n" for i in range(1, statements + 1))
    prefix.with_suffix(".py").write_text(BASE.with_suffix(".py").read_text(encoding="utf-8") + code, encoding="utf-8")
    shutil.copy(BASE.with_suffix(".cache"), prefix.with_suffix(".cache"))
    return prefix


def _verbs(prefix: Path) -> float:
    """Seconds to open the pair and build its show, guards and verify reports, read as the first file
    of its process (no part of it read before: part_readings)."""
    part_readings.remember({}, trees=True)
    started = time.perf_counter()
    artifact = open_path(str(prefix.with_suffix(".py")), str(prefix.with_suffix(".cache")), deep=True)
    show_report(artifact)
    guards = guards_report(artifact)
    verify_report(artifact)
    assert guards.guards is not None and any(slot.check for frame in guards.guards.frames for slot in frame.slots)
    return time.perf_counter() - started


def test_guards_never_parses_the_whole_file(tmp_path, monkeypatch):
    """A syntax tree takes ~250 bytes a byte: guards reads its rendered checks from parts of python_code
    (main parsed the whole file once more for them: 25 GB for 100 MB of code)."""
    monkeypatch.setattr(chunked_parse, "CHUNK_CHARS", 64 * 1024)
    prefix = _pair(tmp_path, "big", 20_000)
    size = prefix.with_suffix(".py").stat().st_size
    parsed: list[int] = []
    real_parse = chunked_parse.parse_source
    monkeypatch.setattr(chunked_parse, "parse_source", lambda text, filename: parsed.append(len(text)) or real_parse(text, filename=filename))
    import ast

    whole: list[int] = []
    real_ast_parse = ast.parse
    monkeypatch.setattr(ast, "parse", lambda text, *a, **k: whole.append(len(text)) or real_ast_parse(text, *a, **k))
    report = guards_report(open_path(str(prefix.with_suffix(".py")), str(prefix.with_suffix(".cache"))))
    assert report.guards is not None and any(slot.check for frame in report.guards.frames for slot in frame.slots)
    assert parsed and max(parsed) < size / 4
    assert not [n for n in whole if n > size / 4], f"parsed {max(whole)} of {size} characters at once"


def test_four_times_the_code_takes_about_four_times_as_long(tmp_path):
    """Side by side in one run (a busy host slows both alike): show, guards and verify of 4N lines
    within 6x of N lines, where anything quadratic would take 16x."""
    _verbs(_pair(tmp_path, "warm", 100))  # imports done
    ratios = []
    for attempt in range(2):  # the better of two: one slow moment of the host is not the code
        small, large = _pair(tmp_path, f"small{attempt}", 5_000), _pair(tmp_path, f"large{attempt}", 20_000)
        ratios.append(_verbs(large) / _verbs(small))
    assert min(ratios) < 6, ratios
