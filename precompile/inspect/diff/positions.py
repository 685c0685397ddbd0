"""Where code sits, apart from what it is: a release that only moved code (a comment added above the
captured function, an import added at the top of its file) diffs equal, its moves listed apart.

A Dynamo artifact records positions in several places: each frame's first line (FRAMES, FRAME_LINES),
the lines of each inlined source (INLINED_SOURCES: its text's sha256 says what it is), load's proofs
that a file still holds them (INLINED_FILES: byte spans and their hash), where each marshalled code object starts
(`_dynamo_first_lines`: the code is marshalled as if from line 1, so moved code marshals alike) and the
`file.py:N` a rendered guard's comment names; and Dynamo names a graph break's continuation after the
line it resumes at (`torch_dynamo_resume_in_step_at_6`). `compared` takes them out of a python_code
section's text before it is compared, `resumes_numbered` names each continuation by its place among
its function's instead of by line, and `is_move` tells a flattened entry that only says something moved.
"""
from __future__ import annotations

import re

# Each masks digits only, in the exact shapes the renderer writes (a value of any other shape, which
# python_code would execute, is compared as written): linear scans, no syntax tree of a large section.
_MASKS = (
    (re.compile(r"'(first_line|last_line)': \d+"), r"'\1': <line>"),
    (re.compile(r"^_dynamo_first_lines = \{\s*(?:'[0-9.]+': \d+,?\s*)*\}", re.M), "_dynamo_first_lines = <lines>"),
    (re.compile(r"(#[^\n]*?\.py):\d+( in )"), r"\1:<line>\2"),
    # The same comment inside an installed variant's rendered checks (GUARDS' `rendered`), where the
    # string literal breaks after its `# `: `'pkg/model.py:70 in forward: ...` begins the next piece.
    (re.compile(r"(# [\"']\n\s*'[\w./<>-]+\.py):\d+( in )"), r"\1:<line>\2"),
)
# Load's proof that a module's file still holds the inlined lines, by hashing their byte spans and the
# file's first two lines: its spans' offsets say where they sit in the file, its modules and hashes what
# load skips re-reading (a proof forged to hash no bytes would skip it), so only the offsets are masked.
_PROOFS = re.compile(r"^INLINED_FILES = \((?:[\s(){},:]|'[\w.]*'|\d+)*\)$", re.M)
_PROOF_PART = re.compile(r"'[\w.]*'|\d+")
_MOVES = ("FRAME_LINES ", "INLINED_SOURCES ")
_RESUME = re.compile(r"\btorch_dynamo_resume_in_\w+?_at_\d+(?:_at_\d+)*\b")
_AT_LINE = re.compile(r"_at_(\d+)")


def is_move(key: str) -> bool:
    """Whether a changed flattened metadata entry says only where something sits: a frame's first line,
    or the lines of an inlined source whose text is the same (its key names the text's sha256)."""
    return key.startswith(_MOVES)


def compared(text: str, numbers: dict[str, str]) -> str:
    """A python_code section's text with every position it records masked (see the module's doc),
    continuations named by `numbers` (`resume_numbers` of the whole python_code)."""
    for pattern, mask in _MASKS:
        text = pattern.sub(mask, text)
    text = _PROOFS.sub(lambda proofs: _PROOF_PART.sub(_offset_masked, proofs.group(0)), text)
    return resumes_numbered(text, numbers)


def _offset_masked(part: re.Match) -> str:
    return part.group(0) if part.group(0).startswith("'") else "<offset>"


def resume_numbers(text: str) -> dict[str, str]:
    """{continuation name: the same name with each `_at_<line>` replaced by its place, counted from 1,
    among the continuations of its function that `text` names}: code moved down its file keeps the
    order of its graph breaks, so it keeps their numbers."""
    by_function: dict[str, list[tuple[tuple[int, ...], str]]] = {}
    for name in set(_RESUME.findall(text)):
        by_function.setdefault(_AT_LINE.sub("_at_", name), []).append((tuple(map(int, _AT_LINE.findall(name))), name))
    return {name: f"{function}<break {place}>" for function, names in by_function.items()
            for place, (_, name) in enumerate(sorted(names), 1)}


def resumes_numbered(text: str, numbers: dict[str, str]) -> str:
    return _RESUME.sub(lambda match: numbers.get(match.group(0), match.group(0)), text) if numbers else text
