"""Split python_code into its sections at the `# ====` banner lines the templates write.

A section opens with a banner, a `# N. slug: Title` line and a second banner; whatever precedes the
first banner is the "header" section. The slug is the section's explicit name (metadata, world,
kernel-runtime, graph, graph-0, opaque-state, driver, ...), written by the renderer; files rendered
before slugs were written name their sections in prose only, and `_legacy_slug` maps those titles to
the same names, so a diff across the two layouts pairs the same sections. Splitting never fails: a
file without banners is one section.
"""
from __future__ import annotations

import hashlib
import re

from precompile.artifact.section_grammar import BANNER_LINE, NAMED_TITLE, TITLE_LINE
from precompile.inspect.model.artifact import Section

# Titles of the layout before explicit slugs, and the names that layout's sections now go by.
_LEGACY_SUBGRAPH = re.compile(r"Subgraph (graph_\d+), compiled in frame .*?: (forward|backward)? ?")
_LEGACY_PREFIXES = (("Captured graph", "graph"), ("Compiled graph", "graph"), ("Kernel runtime", "kernel-runtime"))


def _legacy_slug(title: str) -> str:
    subgraph = _LEGACY_SUBGRAPH.match(title)
    if subgraph is not None:
        return "-".join(filter(None, (subgraph.group(1).replace("_", "-"), subgraph.group(2))))
    for prefix, slug in _LEGACY_PREFIXES:
        if title.startswith(prefix):
            return slug
    head = re.split(r"[:(]", title, maxsplit=1)[0]
    return re.sub(r"[^a-z0-9]+", "-", head.lower()).strip("-") or "section"


def _named(title: str) -> tuple[str, str]:
    """(slug, title) of a section's title line."""
    named = NAMED_TITLE.fullmatch(title)
    if named is not None:
        return named.group(1), named.group(2)
    return _legacy_slug(title), title


def split_sections(source: str) -> list[tuple[Section, str]]:
    """Each section with its text (lines joined with their newlines), in file order."""
    lines = source.splitlines(keepends=True)
    starts: list[tuple[int, str]] = [(0, "Header")]
    i = 0
    while i + 2 < len(lines):
        if BANNER_LINE.match(lines[i]) and BANNER_LINE.match(lines[i + 2]) and not BANNER_LINE.match(lines[i + 1]):
            match = TITLE_LINE.match(lines[i + 1].rstrip("\r\n"))
            starts.append((i, match.group(1) if match else lines[i + 1].strip()))
            i += 3
        else:
            i += 1
    result: list[tuple[Section, str]] = []
    used: dict[str, int] = {}
    for index, (start, title) in enumerate(starts):
        end = starts[index + 1][0] if index + 1 < len(starts) else len(lines)
        if index == 0 and end == 0:
            continue
        text = "".join(lines[start:end])
        slug, title = _named(title)
        used[slug] = used.get(slug, 0) + 1
        if used[slug] > 1:
            slug = f"{slug}-{used[slug]}"
        section = Section(
            index=len(result),
            slug=slug,
            title=title,
            first_line=start + 1,
            line_count=end - start,
            sha256=hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(),
        )
        result.append((section, text))
    return result
