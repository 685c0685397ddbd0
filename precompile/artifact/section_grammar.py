"""How python_code marks its sections: one definition, which the template writes and inspect reads.

A section opens with a banner line, a title line `# N. slug: Title` and a second banner; whatever
precedes the first banner is the header. The slug is the section's name (metadata, graph, driver,
...). Readers accept any banner of at least MIN_RULE `=` (files of every layout ever written) and a
title without its number or slug (the layout before slugs); the writer writes exactly RULE.
"""
from __future__ import annotations

import re

RULE_WIDTH = 86
BANNER = "# " + "=" * RULE_WIDTH
"""The banner line the template writes above and below each section's title."""
MIN_RULE = 10

BANNER_LINE = re.compile(r"^# ={%d,}\s*$" % MIN_RULE)
TITLE_LINE = re.compile(r"^#\s*(?:\d+\.\s*)?(.*?)\s*$")
"""A title line: its text after the section number (the slug and title, or a legacy prose title)."""
NAMED_TITLE = re.compile(r"([a-z][a-z0-9-]*): (.*)")
"""A title's slug and its prose, as the writer joins them."""


def title_line(number: int, slug: str, title: str) -> str:
    """The title line the template writes for section `number`."""
    return f"# {number}. {slug}: {title}"
