"""`precompile diff --format markdown`: a diff as a pull request comment (GitHub-flavoured Markdown).

In order: the verdict (the same line the text output ends with), the two artifacts, a table of
every category with its count and what the gate makes of it, each changed guard with both values,
the other differences by category, the python_code sections that differ (counted, a captured graph's with its diff: the text output
has their diff), and each changed kernel by its Inductor name with its source diff in a ```diff
fence. Deterministic; bounded so that a comment fits (MAX_ENTRIES per category, MAX_KERNEL_LINES in
all, MAX_VALUE characters a value), saying what it left out. Everything from an artifact is in a
code span or a fence sized past its longest backtick run, so no text of it is read as Markdown or
HTML, and a table cell's `|` is escaped; control, bidirectional and invisible characters in it are
written as escapes (`terminal_text.printable`, as every renderer writes them).
"""
from __future__ import annotations

import re

from precompile.inspect.diff.diff import CATEGORIES, category, code_category, gate_failures
from precompile.inspect.diff.line_diff import around_change
from precompile.inspect.model.report import DiffEntry, DiffReport
from precompile.inspect.render.render_text import diff_verdict
from precompile.inspect.render.terminal_text import printable

MAX_ENTRIES = 50
"""Differences listed per category; the rest are counted."""
MAX_KERNEL_LINES = 400
"""Lines of kernel source diffs shown, all kernels together; the rest are counted."""
MAX_GRAPH_LINES = 400
"""Lines of captured-graph diffs shown, all graph sections together; the rest are counted."""
MAX_VALUE = 300
"""Characters of one key or value shown; a longer one is cut, giving its length."""
_BACKTICKS = re.compile(r"`+")


def code_span(text: str) -> str:
    """`text` as an inline code span: one line, cut past MAX_VALUE, fenced by more backticks than it holds."""
    text = printable(" ".join(text.split("\n")))  # a line break is a space; every other control an escape
    if len(text) > MAX_VALUE:
        text = f"{text[:MAX_VALUE]}... ({len(text)} characters)"
    fence = "`" * (max((len(run) for run in _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def cell(text: str) -> str:
    """Text for a table cell: a `|` escaped so that it does not end the cell."""
    return text.replace("|", "\\|")


def _gate(report: DiffReport, name: str, fail_on: tuple[str, ...] | None) -> str:
    if name in gate_failures(report, fail_on):
        return "fails"
    return "not gated" if report.categories.get(name) else "equal"


def _entry(entry: DiffEntry) -> str:
    if entry.change == "changed":
        a, b = around_change(entry.a or "", entry.b or "", max(60, (MAX_VALUE - len(entry.key)) // 2 - 40))
        return f"- {code_span(f'{entry.key}: {a} → {b}')}"
    value = entry.b if entry.change == "added" else entry.a
    return f"- {entry.change} {code_span(f'{entry.key}: {value}')}"


def _categories(report: DiffReport) -> list[str]:
    """Each category that differs: its differences (the python_code sections for `code`), then for
    `kernels` each changed kernel's source diff."""
    by_category: dict[str, list[str]] = {}
    for entry in report.entries:
        by_category.setdefault(category(entry.section, entry.key), []).append(_entry(entry))
    for name, items in _code(report).items():
        by_category.setdefault(name, []).extend(items)
    lines: list[str] = []
    for name in CATEGORIES:
        items = by_category.get(name, [])
        if not items and not (name == "kernels" and report.kernels):
            continue
        lines += ["", f"#### {name} ({report.categories.get(name, 0)})", ""]
        limit = len(items) if name == "graph" else MAX_ENTRIES  # a graph's diff lines: bounded by MAX_GRAPH_LINES
        lines += items[:limit]
        if len(items) > limit:
            lines.append(f"- ... {len(items) - limit} more not shown (`precompile diff --json` lists them all)")
        if name == "kernels":
            lines += _kernels(report)
    return lines


def _fence(lines: list[str]) -> str:
    longest = max((len(run) for line in lines for run in _BACKTICKS.findall(line)), default=0)
    return "`" * max(3, longest + 1)


def _code(report: DiffReport) -> dict[str, list[str]]:
    """The python_code sections that differ by category, each with its count of changed lines; a
    captured graph's (`graph`) with its diff too, in a ```diff fence (MAX_GRAPH_LINES in all)."""
    items: dict[str, list[str]] = {}
    room = MAX_GRAPH_LINES
    for code in report.python_code:
        changed = sum(1 for line in code.lines if line[:1] in "+-" and not line.startswith(("+++", "---")))
        name = code_category(code.section)
        items.setdefault(name, []).append(
            f"- python_code section {code_span(code.section)} {code.change}: {changed + code.lines_not_shown} lines")
        if name == "graph" and code.lines:
            shown = list(code.lines[:room])
            room -= len(shown)
            if shown:
                fence = _fence(shown)
                items[name] += ["", f"{fence}diff", *(printable(line) for line in shown), fence, ""]
            if len(shown) < len(code.lines):
                items[name].append(f"- ... {len(code.lines) - len(shown)} more diff lines not shown (`precompile diff` prints them)")
    return items


def _kernels(report: DiffReport) -> list[str]:
    if not report.kernels:
        return []
    lines = ["", f"Kernel sources by Inductor name ({len(report.kernels)} differ):", ""]
    room = MAX_KERNEL_LINES
    left_out = 0
    for kernel in report.kernels:
        shown = list(kernel.lines[:room])
        left_out += len(kernel.lines) - len(shown) + kernel.lines_not_shown
        room -= len(shown)
        lines.append(f"- {code_span(kernel.name)} {kernel.change}")
        if shown:
            fence = _fence(shown)
            lines += ["", f"{fence}diff", *(printable(line) for line in shown), fence]
    if left_out:
        lines += ["", f"... {left_out} more kernel diff lines not shown (`precompile diff` prints them)"]
    return lines


def render_markdown(report: DiffReport, *, stat: bool = False, fail_on: tuple[str, ...] | None = None) -> str:
    """The diff as Markdown for a pull request; with `stat`, only the verdict, the artifacts and the table."""
    lines = [f"### {diff_verdict(report, fail_on)[0]}", "",
             f"precompile diff {code_span(report.a)} → {code_span(report.b)}", "",
             "| category | differences | gate |", "| --- | ---: | --- |"]
    lines += [f"| {cell(name)} | {report.categories.get(name, 0)} | {_gate(report, name, fail_on)} |"
              for name in CATEGORIES]
    if report.problems:
        lines += ["", "#### problems", "", *(f"- {code_span(problem)}" for problem in report.problems)]
    if not stat:
        lines += _categories(report)
    return "\n".join(lines) + "\n"
