"""What a static pickle scan reports (`pickle_scan`): the imports a pickle would perform, with their
risk, and what it evaluates to. Shared by load (the opaque state it unpickles) and inspect."""
from __future__ import annotations

from typing import Literal

import msgspec

Risk = Literal["allowed", "unknown", "dangerous"]


class Blob(msgspec.Struct, frozen=True, kw_only=True):
    """Opaque bytes: never decoded, only measured."""

    size: int
    sha256: str


class PickleImport(msgspec.Struct, frozen=True, kw_only=True):
    """A GLOBAL/STACK_GLOBAL a pickle would resolve when unpickled, with how risky that is."""

    module: str
    name: str
    risk: Risk
    count: int = 1
    offset: int | None = None
    """Byte offset of the first opcode that performs it, in the pickle that holds it."""
    opcode: str | None = None
    unresolved: str | None = None
    """Why the import (or call) cannot be named statically; such an import is always "dangerous"."""
    within: str | None = None
    """Where the nested pickle that holds it sits, e.g. "pickle inside the BINBYTES at offset 120"; None: the pickle itself."""


class Field(msgspec.Struct, frozen=True, kw_only=True):
    """A top-level entry of a pickled dict, statically summarized: a scalar's repr, else a kind."""

    key: str
    summary: str


class PickleScan(msgspec.Struct, frozen=True, kw_only=True):
    member: str
    """Where the pickle sits: a zip member name, or "(file)" for a bare pickle."""
    blob: Blob
    protocol: int | None = None
    imports: tuple[PickleImport, ...] = ()
    top_level: str | None = None
    """What the pickle evaluates to, statically: "dict", "list", "call torch._utils._rebuild_tensor_v2", ..."""
    fields: tuple[Field, ...] = ()
    problem: str | None = None
    nested: int = 0
    """How many nested pickles (in bytes or str values) were scanned; their imports are in `imports`."""
    unpickled_by_load: bool = False
    """True for the opaque state `load` itself unpickles: every import off the data-only list (and the
    list reviewed for it) is a finding there, not "unknown"."""

    @property
    def flagged(self) -> tuple[PickleImport, ...]:
        return tuple(imp for imp in self.imports if imp.risk != "allowed")

    @property
    def dangerous(self) -> tuple[PickleImport, ...]:
        """Dangerous imports, and every import or call the scan could not resolve."""
        return tuple(imp for imp in self.imports if imp.risk == "dangerous")

    @property
    def findings(self) -> tuple[PickleImport, ...]:
        """The dangerous imports, and for a pickle load itself unpickles, the unknown ones too."""
        return self.flagged if self.unpickled_by_load else self.dangerous
