"""The `--json` reports: one tagged, versioned Struct per verb, and their exported JSON Schema.

`report_version` changes only on a backward-incompatible change (a field removed, or its meaning or
type changed); tools must check it. New fields may appear with defaults at any time. After a
deliberate change run `python -m precompile.inspect.model.report` to refresh `report.schema.json`; a test
fails while it drifts.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Union

import msgspec

from precompile.inspect.model.artifact import Artifact, Blob, Guards, PickleScan

REPORT_VERSION = "1"
SCHEMA_PATH = Path(__file__).parent / "report.schema.json"

Change = Literal["added", "removed", "changed"]


class _Report(msgspec.Struct, frozen=True, kw_only=True, tag_field="verb"):
    report_version: str = REPORT_VERSION


class ShowReport(_Report, frozen=True, kw_only=True, tag="show"):
    artifact: Artifact
    problems: tuple[str, ...] = ()


class GuardsReport(_Report, frozen=True, kw_only=True, tag="guards"):
    python_code: str
    guards: Guards | None
    problems: tuple[str, ...] = ()
    pickles: tuple[PickleScan, ...] = ()
    """The opaque state's pickles (guard trees live there for Dynamo artifacts), scanned, never unpickled."""
    findings: tuple[str, ...] = ()
    """That the cache does not pair with python_code (naming both), and the dangerous or unresolved imports of
    those pickles, each naming the section, the import and its opcode offset."""


class DiffEntry(msgspec.Struct, frozen=True, kw_only=True):
    section: str
    """guards, inputs, outputs, params, buffers, metadata, envelope, bundle or entries (a Mega-Cache's)."""
    key: str
    """The identity compared: an input path, a parameter name, a field name, a bundle file path, a
    Mega-Cache entry's "kind key"."""
    change: Change
    a: str | None = None
    b: str | None = None


class CodeDiff(msgspec.Struct, frozen=True, kw_only=True):
    section: str
    change: Change
    lines: tuple[str, ...]
    """Unified diff of the section's lines, trailing blanks stripped, names Dynamo mints per process
    masked, long base64 literals shown as their fingerprint, long lines shortened (see `code_lines`)."""
    lines_not_shown: int = 0
    """Changed lines of the section counted but not shown: the diff shows 2000 changed lines in all."""


class KernelDiff(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    """The kernel's Inductor name (cpp_fused_..., triton_...), read statically (`inspect.kernels`);
    "OLD → NEW" for a kernel Inductor renamed (same family and counter); its bundle path when
    python_code does not name it."""
    change: Change
    lines: tuple[str, ...] = ()
    """Unified diff of a changed kernel's source (the bundle file load builds or maps); none for a
    kernel only one artifact has."""
    lines_not_shown: int = 0
    """Changed lines counted but not shown: the kernels' diffs show 2000 changed lines in all."""


class DiffReport(_Report, frozen=True, kw_only=True, tag="diff"):
    a: str
    b: str
    equal: bool
    entries: tuple[DiffEntry, ...] = ()
    python_code: tuple[CodeDiff, ...] = ()
    problems: tuple[str, ...] = ()
    categories: dict[str, int] = {}
    """How many differences fall in each category (inspect.diff.CATEGORIES; python_code sections are `code`)."""
    kernels: tuple[KernelDiff, ...] = ()
    """The bundle kernel sources that differ, by Inductor name, with their source diff: which kernels
    the `kernels` entries (compared by content) are, and how they changed."""
    unpaired: tuple[str, ...] = ()
    """Which of `a` and `b` were given with a cache that is not their python_code's (another build's):
    what load would serve is not what was compared, so such a diff fails every gate (`--fail-on`)."""
    moved: tuple[DiffEntry, ...] = ()
    """What only changed place (a frame's first line, an inlined source's lines: code moved down its
    file by a comment added above it): listed, not a difference, so two such releases diff equal."""


class Check(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    status: Literal["ok", "fail", "skip"]
    expected: str | None = None
    actual: str | None = None
    message: str = ""
    remedy: str | None = None


class VerifyReport(_Report, frozen=True, kw_only=True, tag="verify"):
    python_code: str
    cache: str
    host: bool
    ok: bool
    checks: tuple[Check, ...]


class ExtractedFile(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    """As written: DIR as given on the command line joined with the file's relative path."""
    file: Blob
    what: str


class ExtractReport(_Report, frozen=True, kw_only=True, tag="extract"):
    directory: str
    files: tuple[ExtractedFile, ...]
    problems: tuple[str, ...] = ()


class HtmlReport(_Report, frozen=True, kw_only=True, tag="report"):
    """What `precompile report` wrote: the HTML page itself is the report; this says where and what."""

    output: str
    """The HTML file, as given with -o."""
    artifacts: tuple[str, ...]
    """Each artifact shown, as "PYTHON_CODE + CACHE" (paths as given)."""
    size: int
    sha256: str
    sections: tuple[str, ...]
    """The ids of the page's sections (anchors), in page order."""
    equal: bool | None = None
    """Given two artifacts: whether their diff found nothing; None for one."""
    problems: tuple[str, ...] = ()
    findings: tuple[str, ...] = ()


class ErrorReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a verb given `--json` prints on stdout when it cannot make its report at all (exit 2: no
    readable artifact named, a bad option value, a file that cannot be written): the verb, and the
    message it also prints on stderr. Not one of the verbs' reports: tools tell it by `error`."""

    verb: str
    report_version: str = REPORT_VERSION
    error: str


Report = Union[ShowReport, GuardsReport, DiffReport, VerifyReport, ExtractReport, HtmlReport]

_encoder = msgspec.json.Encoder(order="deterministic")


def encode(report: Report | ErrorReport) -> str:
    return json.dumps(json.loads(_encoder.encode(report)), indent=2, sort_keys=False) + "\n"


def render_schema() -> str:
    return json.dumps(msgspec.json.schema(Report), indent=2, sort_keys=True) + "\n"


def main() -> None:
    SCHEMA_PATH.write_text(render_schema(), encoding="utf-8")
    print(f"wrote {SCHEMA_PATH}")


if __name__ == "__main__":
    main()
