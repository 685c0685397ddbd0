"""`precompile diff --junit FILE`: the diff as a JUnit XML report, the file CI systems display.

The layout is the one pytest's junitxml plugin writes and GitHub/GitLab/Jenkins read: a
`<testsuites>` root holding one `<testsuite name="precompile diff">` (with its tests, failures,
errors and skipped counts) and one `<testcase classname="precompile diff" name=CATEGORY>` per diff
category, every category always. A category's testcase fails (a `<failure>` whose message counts
its differences and whose text lists them) when it differs and the gate names it (`--fail-on`, or
any difference without it); otherwise it passes, and a difference the gate does not name is listed
in its `<system-out>`. Inputs that could not be read are an `<error>` testcase `inputs`.

Built with xml.etree (so text and attributes are escaped); control, bidirectional and invisible
characters are written as escapes (`terminal_text.printable`, as every renderer writes them) and
what XML 1.0 still cannot carry (a lone surrogate) is replaced by U+FFFD; deterministic (no timestamp, host or duration); written atomically:
readers see no file or the whole of it, never a part.
"""
from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from precompile.errors import PrecompileError
from precompile.inspect.diff.diff import CATEGORIES, category, code_category, gate_failures
from precompile.inspect.model.report import DiffReport
from precompile.inspect.render.render_text import diff_verdict
from precompile.inspect.render.terminal_text import printable

SUITE = "precompile diff"
MAX_LISTED = 1000
"""Differences listed per testcase; the rest are counted."""
_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text: str) -> str:
    return _NOT_XML.sub("\ufffd", printable(text))


def _differences(report: DiffReport) -> dict[str, list[str]]:
    """Each category's differences, one line each, as the text output words them."""
    found: dict[str, list[str]] = {name: [] for name in CATEGORIES}
    for entry in report.entries:
        if entry.change == "changed":
            line = f"~ {entry.section} {entry.key}: {entry.a} -> {entry.b}"
        else:
            line = f"{'+' if entry.change == 'added' else '-'} {entry.section} {entry.key}: {entry.b if entry.change == 'added' else entry.a}"
        found[category(entry.section, entry.key)].append(line)
    for code in report.python_code:
        found[code_category(code.section)].append(f"~ python_code section {code.section} ({code.change})")
    found["kernels"] += [f"~ kernel source {kernel.name} ({kernel.change})" for kernel in report.kernels]
    return found


def _listed(lines: list[str]) -> str:
    shown = lines[:MAX_LISTED]
    more = [f"... {len(lines) - MAX_LISTED} more not shown"] if len(lines) > MAX_LISTED else []
    return "".join(f"{_xml_text(line)}\n" for line in shown + more)


def junit_xml(report: DiffReport, fail_on: tuple[str, ...] | None) -> bytes:
    """The JUnit XML document of `report`, gated as `--fail-on` gates the exit code."""
    differences = _differences(report)
    suite = ET.Element("testsuite", name=SUITE)
    failures = 0
    failing = gate_failures(report, fail_on)
    for name in CATEGORIES:
        count = report.categories.get(name, 0)
        case = ET.SubElement(suite, "testcase", classname=SUITE, name=name)
        if name in failing:
            failures += 1
            message = f"{name}: {count} difference{'s' if count != 1 else ''}"
            if report.unpaired:
                message += f"; {' and '.join(report.unpaired)} given with a cache that is not its python_code's"
            failure = ET.SubElement(case, "failure", message=message, type="difference")
            failure.text = _listed(differences[name])
        elif count:
            ET.SubElement(case, "system-out").text = _listed([f"not gated by --fail-on: {count} differences", *differences[name]])
    if report.problems:
        case = ET.SubElement(suite, "testcase", classname=SUITE, name="inputs")
        error = ET.SubElement(case, "error", message=_xml_text(report.problems[0]), type="trouble")
        error.text = _listed(list(report.problems))
    properties = ET.Element("properties")
    for key, value in (("a", report.a), ("b", report.b), ("verdict", diff_verdict(report, fail_on)[0])):
        ET.SubElement(properties, "property", name=key, value=_xml_text(value))
    suite.insert(0, properties)
    suite.set("tests", str(len(CATEGORIES) + (1 if report.problems else 0)))
    suite.set("failures", str(failures))
    suite.set("errors", "1" if report.problems else "0")
    suite.set("skipped", "0")
    root = ET.Element("testsuites", name=SUITE)
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def write_junit(path: str, report: DiffReport, fail_on: tuple[str, ...] | None) -> None:
    """Write the JUnit XML of `report` to `path` atomically (a temporary file beside it, then renamed)."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as handle:
            handle.write(junit_xml(report, fail_on))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise PrecompileError(f"could not write the JUnit report {path}: {exc.strerror or exc}") from None
