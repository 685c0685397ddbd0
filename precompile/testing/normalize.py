"""The readable, normalized form of an artifact a snapshot stores, and what a mismatch says.

Two files per capture: the user's python_code (`user_code`: precompile's runtime named by one line
each, line numbers left out, each section through `diff`'s line normalizer), and the guard table and
calling convention (`diff`'s flattened sections: guards, inputs, outputs, params, buffers, metadata,
less where source lines sit and the hashes of their text). Both leave out what depends on the host
rather than on the model: torch's thread count, which a served call does not check, and the cache's
envelope and kernel bundle (keyed to this CPU). A mismatch is told as `precompile diff` tells it, on
these forms, leaving out the runtime lines. Torch-free.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from precompile.artifact.pycode import decode_source
from precompile.inspect.diff.diff import compare_flattened, flatten
from precompile.inspect.diff.line_diff import unified
from precompile.inspect.reading.reader import open_artifact, python_code_bytes
from precompile.inspect.render.render_text import render_diff
from precompile.testing.user_code import normalized_code, users_lines

TABLE_SECTIONS = ("guards", "inputs", "outputs", "params", "buffers", "metadata")
"""diff's sections a guard table snapshot holds (the envelope and bundle describe the host that built it)."""
LINE_FREE_KEYS = ("FRAME_LINES", "INLINED_SOURCES", "INLINED_FILES")
"""Metadata keys a table leaves out: where source lines sit, and hashes of their text (comments included)."""
_HEADER = ("# precompile snapshot: what a served call is checked against (guards), its calling convention (inputs,\n"
           "# outputs, metadata) and the model's parameters and buffers; a key, then its value indented.\n"
           "# Written by `pytest --snapshot-update`; the python_code it goes with is the .py beside it.\n")
_VALUE_INDENT = "    "


class Readable(NamedTuple):
    code: str
    """python_code, normalized."""
    table: str
    """The guard table and calling convention."""


def readable(python_code: Path, cache: Path) -> Readable:
    """The normalized, readable form of a captured pair."""
    artifact = open_artifact(str(python_code), str(cache))
    data = python_code_bytes(artifact)
    if data is None or artifact.python_code.problem is not None:
        raise AssertionError(f"the captured python_code cannot be read: {artifact.python_code.problem}")
    flat = flatten(artifact, data)
    sections = {name: flat.get(name, {}) for name in TABLE_SECTIONS}
    sections["metadata"] = {key: value for key, value in sections["metadata"].items()
                            if key.split(" ", 1)[0] not in LINE_FREE_KEYS}
    return Readable(normalized_code(decode_source(data)), table_text(sections))


def table_text(sections: dict[str, dict[str, str]]) -> str:
    """`[section]`, then each key (sorted) on a line of its own and its value indented below it."""
    out = [_HEADER]
    for name, values in sections.items():
        out.append(f"\n[{name}]\n")
        for key in sorted(values):
            out.append(f"{key}\n")
            out.extend(f"{_VALUE_INDENT}{line}\n" for line in values[key].split("\n"))
    return "".join(out)


def parse_table(text: str) -> dict[str, dict[str, str]]:
    """The sections `table_text` wrote (comments and blank lines skipped)."""
    sections: dict[str, dict[str, str]] = {}
    values: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if line.startswith(_VALUE_INDENT) and key is not None:
            values[key] = line[len(_VALUE_INDENT):] if key not in values else f"{values[key]}\n{line[len(_VALUE_INDENT):]}"
        elif line.startswith("[") and line.endswith("]"):
            values, key = sections.setdefault(line[1:-1], {}), None
        elif line and not line.startswith("#"):
            key = line
    return sections


def mismatch_message(stored: tuple[str | None, str | None], new: Readable, *, names: tuple[str, str]) -> str:
    """What changed between a stored snapshot (code, table; None: missing) and this run: `precompile
    diff`'s verdict and categories first, then the changed python_code sections as unified diffs."""
    code, table = stored
    if code is None and table is None:
        return (f"no snapshot of this capture yet ({names[0]}): run `pytest --snapshot-update` to write it, "
                "then review and commit __snapshots__/")
    old_code, new_code = (_counted(code) if code is not None else None), _counted(new.code)
    report = compare_flattened(
        names[0], names[1], parse_table(table or ""), parse_table(new.table),
        old_code.encode("utf-8") if old_code is not None else None, new_code.encode("utf-8"),
    )
    lines = [text for text, _ in render_diff(report, verdict_first=True)]
    if report.equal:  # only what the normalized forms leave out differs: show the text itself
        lines[0] = "verdict: equal as precompile diff compares them, but the snapshot's text differs"
        for old, now, suffix in ((old_code, new_code, ".py"), (table, new.table, ".guards.txt")):
            if old != now:
                lines.extend(unified((old or "").splitlines(), now.splitlines(), f"snapshot{suffix}", f"this run{suffix}",
                                     context=3, max_lines=200).lines)
    lines.append("run `pytest --snapshot-update` to accept this change, then review the diff of __snapshots__/")
    return "\n".join(lines)


def _counted(code: str) -> str:
    """A `.py` snapshot as its comparison counts it: without the lines naming precompile's runtime."""
    return "\n".join(users_lines(code)) + "\n"
