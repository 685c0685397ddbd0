"""What of a python_code is the user's, as a `.py` snapshot stores it.

A snapshot locks what the user's code made: the captured graphs, the guards, the calling convention,
the bytecode Dynamo transformed. precompile's own runtime (the header, the driver and its checks, the guard-check
helpers, the kernel and subgraph runtimes, the world check: text copied verbatim from precompile's
source) is named by one line each, `# precompile runtime: driver, precompile 0.1.0, sha256 ...`,
which the comparison leaves out: a precompile release that edits its driver fails no one's snapshot.
Where code sits is not what it does: source line numbers, the marshalled code objects' line tables
and the hashes of inlined sources' text are left out, so a comment above the model changes nothing.
"""
from __future__ import annotations

import ast
import base64
import hashlib
import marshal
import re
import types

from precompile._version import __version__
from precompile.artifact.section_grammar import BANNER, title_line
from precompile.inspect.diff.code_lines import compared_lines
from precompile.inspect.diff.process_ids import mask_artifact_names, mask_process_ids
from precompile.inspect.parsing.sections import split_sections

RUNTIME_SECTIONS = frozenset({"header", "world", "kernel-runtime", "subgraph-runtime", "dispatch-state", "guard-checks",
                              "read-checks", "driver-checks", "driver-sources", "driver"})
"""Sections whose text is precompile's, copied from its source (the entry line rides the last one)."""
RUNTIME_MARK = "# precompile runtime: "
"""How a runtime section's stand-in line starts: the comparison leaves these lines out."""
LINE_FREE_METADATA = ("INLINED_SOURCES", "INLINED_FILES")
"""Metadata literals that say where source sits and hash its text (which comments are part of)."""

_SOURCE_LINE = re.compile(r"(# [\w./<>-]+\.py):\d+ in ")
_LINE_FIELD = re.compile(r"('(?:first|last)_line': )\d+")
_BLOB_COMMENT = re.compile(r": \d+ bytes, sha256 [0-9a-f]{64}$")
_BLOB_OPEN = re.compile(r"^(\s*)('[^']+'): \($")
_FIRST_LINES = "_dynamo_first_lines = "


def normalized_code(source: str) -> str:
    """python_code as a snapshot stores it: each of the user's sections as `diff` compares it (numbered
    anew, so a runtime section added before it renumbers nothing), each runtime section as one line."""
    lines: list[str] = []
    number = 0
    for section, text in split_sections(source):
        if section.slug in RUNTIME_SECTIONS:
            digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
            lines.append(f"{RUNTIME_MARK}{section.slug}, precompile {__version__}, sha256 {digest}")
            continue
        number += 1
        body = text.splitlines(keepends=True)[3:]  # the banner, title and banner are written anew
        if section.slug == "bytecode":
            body = _line_free_bytecode(body)
        if section.slug == "metadata":
            body = _without_literals(body, LINE_FREE_METADATA)
        text = _LINE_FIELD.sub(r"\1<line>", _SOURCE_LINE.sub(r"\1 in ", "".join(body)))
        lines += ["", BANNER, title_line(number, section.slug, section.title), BANNER]
        lines += compared_lines(text, opaque=section.slug.startswith("opaque"))
    return "\n".join(lines).lstrip("\n") + "\n"


def users_lines(normalized: str) -> list[str]:
    """The lines a snapshot comparison counts: all but the runtime stand-ins."""
    return [line for line in normalized.splitlines() if not line.startswith(RUNTIME_MARK)]


def _without_literals(lines: list[str], names: tuple[str, ...]) -> list[str]:
    """The metadata section without the top-level literals `names` (each up to the next unindented line)."""
    out: list[str] = []
    skipping = False
    for line in lines:
        if line[:1] not in (" ", "\t", "\n", ""):
            skipping = line.split(" = ", 1)[0] in names
        if not skipping:
            out.append(line)
    return out


def _line_free_bytecode(lines: list[str]) -> list[str]:
    """The bytecode section with each marshalled code object as a digest of what it runs, its line
    numbers left out (its comment keeps what it is, less the size and hash of the marshalled bytes)."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        opened = _BLOB_OPEN.match(line.rstrip("\n"))
        if line.startswith(_FIRST_LINES):  # where each code object starts (the code is marshalled as if from line 1)
            out.append(f"{_FIRST_LINES}<lines>\n")
            i += 1
            while i < len(lines) and lines[i].startswith(" "):  # the dict's wrapped lines
                i += 1
            continue
        if opened is None:
            out.append(_BLOB_COMMENT.sub("", line.rstrip("\n")) + "\n" if line.lstrip().startswith("#") else line)
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "),")
        chunks = "".join(ast.literal_eval(chunk.strip()) for chunk in lines[i + 1 : end])
        out.append(f"{opened.group(1)}{opened.group(2)}: '<code, line numbers left out: sha256 {_code_digest(chunks)}>',\n")
        i = end + 1
    return out


def _code_digest(encoded: str) -> str:
    """sha256 of a marshalled code object (base64) as it runs: every field but its file and line numbers,
    the names a process or an artifact mints masked as `diff` masks them. The snapshot's own test process
    captured it, on this Python; unmarshalling runs nothing."""
    fields = repr(_code_fields(marshal.loads(base64.b64decode(encoded))))
    return hashlib.sha256(mask_artifact_names(mask_process_ids(fields)).encode("utf-8", "surrogatepass")).hexdigest()


def _code_fields(code: types.CodeType) -> tuple:
    consts = tuple(_code_fields(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts)
    later = tuple(getattr(code, name, None) for name in ("co_qualname", "co_exceptiontable"))  # Python 3.11+
    return (code.co_name, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
            code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars, later)
