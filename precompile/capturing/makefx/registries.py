"""Class registries a library fills as it imports modules and builds models (transformers' set of
output classes, its `_CAN_RECORD_REGISTRY` keyed by class name): what one holds says which modules a
process imported or which models it built first, not a setting, so a MakeFx trace that reads one
records it under one spelling in every process, listed and not checked (`specialized.records`)."""
from __future__ import annotations

import re

from precompile.codegen.drivers.makefx_reads import spelled

REGISTRY = "a registry of classes, filled as modules import (its members are not compared)"
"""The spelling of a class registry a global holds: what it holds says which of the library's modules
the process imported or which models it built first, not a setting, and differs from process to
process, so it is recorded alike in all of them (and not checked: `specialized.records`)."""
_CLASS_NAME = re.compile(r"<class '[\w.]+'>")


def class_registry(value: object) -> bool:
    """A library's registry of classes: a set of them, or a dict keyed by them or by their names as
    str() spells a class (transformers' `_CAN_RECORD_REGISTRY`, keyed by `str(model.__class__)`)."""
    members = value if isinstance(value, (set, frozenset)) else value.keys() if isinstance(value, dict) else None
    return bool(members) and all(isinstance(member, type) or (isinstance(member, str) and _CLASS_NAME.fullmatch(member))
                                 for member in members)  # type: ignore[union-attr]


def global_spelling(value: object) -> str | None:
    """A global's spelling: a class registry's is REGISTRY, whatever it holds; the rest `spelled`."""
    return REGISTRY if class_registry(value) else spelled(value)
