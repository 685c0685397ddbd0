"""A guard on what a torch config entry's user override holds, checked as the setting itself.

torch 2.15's config modules keep a user's override of a setting in a ContextVar, and Dynamo, inlining
a config module's `__getattr__` (functional collectives read `torch.compiler.config.compile_on_one_rank`,
so every distributed capture does), guards what `<module>._config['NAME'].user_override.get()`
returned: the module's unset sentinel, or the override. That raw value is not the setting: torch's
`config.patch` leaves the value it found behind as an override when it exits, and Inductor's first
compile in a process patches compile_on_one_rank, so such a process holds False where a fresh one
holds the sentinel, both meaning False. Checked as Dynamo writes it, an artifact captured in one kind
of process missed every call in the other. The traced code depends on the setting the module
resolves (`<module>.NAME`), so that is what the artifact checks, against the value the capture saw.
"""
from __future__ import annotations

import re

SETTING_KINDS = frozenset({"TYPE_MATCH", "CONSTANT_MATCH", "EQUALS_MATCH"})
"""The guards on an override's value that are checked as the setting's."""
_OVERRIDE = re.compile(r"(?P<module>.+)\._config\[(?P<quote>['\"])(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?P=quote)\]"
                       r"\.user_override\.get\(\)")


def setting_source(name: str) -> str | None:
    """The source of the setting (`<module>.NAME`) whose user override the guard source `name`
    reads, or None where it reads none."""
    match = _OVERRIDE.fullmatch(name)
    return None if match is None else f"{match.group('module')}.{match.group('name')}"
