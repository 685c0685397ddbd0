"""The typed model of an artifact pair that every verb renders, checks or compares.

Built by `reader` from the schema's own Structs (metadata, envelope, bundle index); opaque bytes
appear as size and sha256 only. Paths are kept exactly as the user gave them.
"""
from __future__ import annotations

from typing import Literal

import msgspec

from precompile.artifact.envelope import CacheEnvelope
from precompile.artifact.metadata import ArtifactMetadata
from precompile.artifact.pickle_model import Blob, PickleImport, PickleScan


class Section(msgspec.Struct, frozen=True, kw_only=True):
    """A part of python_code delimited by its `# ====` banner lines."""

    index: int
    slug: str
    """The explicit name the renderer wrote: header, metadata, world, kernel-runtime, graph, graph-0, opaque-state, driver, ..."""
    title: str
    first_line: int
    """1-based line of the section's first line (its opening banner, or line 1 for the header)."""
    line_count: int
    sha256: str


class NamedValue(msgspec.Struct, frozen=True, kw_only=True):
    """A top-level literal of python_code, its value as written (the source text of the literal)."""

    name: str
    value: str


class UpstreamCodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """python_code written by torch's own `torch.compiler.precompile` (torch 2.14+): a MakeFx capture
    whose calling convention is a set of UPPER_CASE literals, with no FORMAT_VERSION."""

    backend: str | None = None
    literals: tuple[NamedValue, ...] = ()
    """The calling-convention literals upstream's loader reads, in file order."""
    tracer: str | None = None
    """The TRACER literal (torch 2.15 on), absent from a make_fx capture's python_code: upstream reads
    an absent one as make_fx."""


class PythonCodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    file: Blob | None = None
    """None when the file could not be read at all."""
    format_version: int | None = None
    """FORMAT_VERSION as written, even when newer than understood."""
    tracer: str | None = None
    literal_names: tuple[str, ...] = ()
    """Every top-level UPPER_CASE assignment, sorted: the metadata names and anything else."""
    metadata: ArtifactMetadata | None = None
    sections: tuple[Section, ...] = ()
    pickles: tuple["PickleScan", ...] = ()
    """The pickles python_code carries as literals (a Dynamo artifact's opaque state), scanned, never unpickled."""
    opaque_problems: tuple[str, ...] = ()
    """Why the opaque state or marshalled bytecode cannot be scanned as load reads it (a spelling other
    than the canonical one, a blob that does not match its label): each one a finding."""
    problem: str | None = None
    newer: bool = False
    """True when the problem is a format version newer than this reader understands."""
    upstream: UpstreamCodeInfo | None = None
    """Set when the file is upstream torch's precompile python_code rather than this project's."""


class ZipMember(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    size: int
    compressed_size: int


MegaCacheContent = Literal["pickle", "text", "binary"]


MegaCacheCodeKind = Literal["cpp", "triton", "wrapper", "graph"]


class MegaCacheCode(msgspec.Struct, frozen=True, kw_only=True):
    """Code an entry carries that loading it compiles or runs, read from the pickle's strings: a C++ or
    Triton kernel by its Inductor name, the Inductor output module (`wrapper`) that binds and calls
    them, or an FX graph module's forward (`graph`, which AOTAutograd rebuilds with exec)."""

    kind: MegaCacheCodeKind
    name: str
    source: str
    sha256: str


class MegaCacheRun(msgspec.Struct, frozen=True, kw_only=True):
    """A field of an entry that torch runs as code when it looks the entry up or loads it, read from the
    state the pickle's BUILDs set (`formats/mega_cache_runs`): a guard expression (eval'd at lookup), an
    output stride expression (eval'd at load), or the file its output module is written to and imported
    from (where `cache_key` sends it)."""

    field: str
    """The field as torch names it: `guards_expr`, `output_strides[0][1]`, `cache_key`."""
    offset: int
    """The opcode offset of the BUILD that sets it."""
    within: str | None = None
    """The nested pickle that BUILD sits in; None in the entry's own pickle."""
    text: str
    """The value as torch reads it (a summary where it is not a string)."""
    problem: str | None = None
    """Why it is not what torch itself writes there: a finding. None for torch's own shape."""


class MegaCacheEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One artifact of a Mega-Cache: which of torch's caches it primes, under which key, and what it holds."""

    kind: str
    """torch's cache kind: inductor, aot_autograd, autotune, pgo, precompile, ..."""
    key: str
    file: Blob
    content: MegaCacheContent
    scan: PickleScan | None = None
    """The static scan of the content when it is a pickle: what loading it would import."""
    code: tuple[MegaCacheCode, ...] = ()
    """The kernels, output modules and graph code the entry carries, each once (by kind, name and source)."""
    runs: tuple[MegaCacheRun, ...] = ()
    """The fields torch evaluates or imports from the entry, in offset order, each with its problem."""

    @property
    def kernels(self) -> tuple[MegaCacheCode, ...]:
        return tuple(code for code in self.code if code.kind in ("cpp", "triton"))


class MegaCache(msgspec.Struct, frozen=True, kw_only=True):
    """torch's Mega-Cache container (`torch.compiler.save_cache_artifacts()`), decoded statically."""

    blob: Blob
    crc32: str | None = None
    """The stored checksum, hex; None when the blob is too short to hold one."""
    encoding_version: int | None = None
    entries: tuple[MegaCacheEntry, ...] = ()
    problem: str | None = None
    recorded: tuple[NamedValue, ...] = ()
    """What the entries record of the host and torch that wrote them (`torch version`, `C++ compiler`,
    `devices`, ...), each the one value all entries agree on or every value seen, joined by " | "."""

    @property
    def kernels(self) -> tuple[MegaCacheCode, ...]:
        """Every entry's kernels, each (name and source) once, in entry order."""
        seen: dict[tuple[str, str], MegaCacheCode] = {}
        for entry in self.entries:
            for kernel in entry.kernels:
                seen.setdefault((kernel.name, kernel.sha256), kernel)
        return tuple(seen.values())


class UpstreamPrecompile(msgspec.Struct, frozen=True, kw_only=True):
    """The envelope of an upstream `torch.compiler.precompile` cache: the plain dict in its data.pkl."""

    format: str
    version: int | None = None
    backend: str | None = None
    code_hash: str | None = None
    """sha256 of the python_code the cache belongs to."""
    artifact: MegaCache | None = None
    """The `artifact` field: a Mega-Cache for the inductor backend, None (absent) for eager."""
    tracer: str | None = None
    """The `tracer` field torch 2.15 on writes ("make_fx"); absent before, which upstream reads as make_fx."""


class UpstreamCache(msgspec.Struct, frozen=True, kw_only=True):
    """A cache in a format of upstream torch: a torch.save zip (upstream precompile's cache is one),
    a bare pickle, or a bare Mega-Cache blob."""

    container: Literal["torch_save_zip", "pickle", "mega_cache"]
    members: tuple[ZipMember, ...] = ()
    pickles: tuple[PickleScan, ...] = ()
    precompile: UpstreamPrecompile | None = None
    mega_cache: MegaCache | None = None
    """The bare Mega-Cache, when the file is one (a precompile cache's own is under `precompile`)."""

    @property
    def entries(self) -> tuple[MegaCacheEntry, ...]:
        """The Mega-Cache's entries: the bare blob's, or those of a precompile cache's artifact."""
        mega = self.mega_cache or (self.precompile.artifact if self.precompile is not None else None)
        return mega.entries if mega is not None else ()

    @property
    def scans(self) -> tuple[PickleScan, ...]:
        """Every pickle scanned: the container's own, then each Mega-Cache entry's."""
        return self.pickles + tuple(entry.scan for entry in self.entries if entry.scan is not None)

    @property
    def run_findings(self) -> tuple[tuple[MegaCacheEntry, MegaCacheRun], ...]:
        """Each field torch would run from an entry that is not what torch itself writes there."""
        return tuple((entry, run) for entry in self.entries for run in entry.runs if run.problem is not None)


CacheKind = Literal["precompile", "upstream_precompile", "mega_cache", "torch_save_zip", "pickle", "unknown", "missing", "absent"]


class CacheInfo(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    kind: CacheKind
    file: Blob | None = None
    envelope: CacheEnvelope | None = None
    format_version: int | None = None
    """The envelope's version tag as written, even when newer than understood."""
    header_size: int | None = None
    payload: Blob | None = None
    """The stored (compressed) bundle payload, read only to measure it."""
    upstream: UpstreamCache | None = None
    problem: str | None = None
    newer: bool = False


class Artifact(msgspec.Struct, frozen=True, kw_only=True):
    python_code: PythonCodeInfo
    cache: CacheInfo
    pairs: bool | None
    """True when the cache belongs to this python_code (tags and code hash agree); None: not checkable."""
    pairing_problem: str | None = None
    given: Literal["pair", "python_code", "cache"] = "pair"
    """What was opened: a pair, or one file alone (the other side is then empty: path "", kind "absent")."""

    @property
    def readable(self) -> bool:
        return self.python_code.problem is None and self.cache.problem is None

    @property
    def opaque_findings(self) -> tuple[tuple[PickleScan, PickleImport | None], ...]:
        """Each finding of python_code's pickles (`PickleScan.findings`), and (scan, None) for a
        pickle the scan could not follow to its end."""
        found: list[tuple[PickleScan, PickleImport | None]] = []
        for scan in self.python_code.pickles:
            found.extend((scan, imp) for imp in scan.findings)
            if scan.problem is not None:
                found.append((scan, None))
        return tuple(found)

    @property
    def flagged_imports(self) -> tuple[tuple[str, PickleImport], ...]:
        if self.cache.upstream is None:
            return ()
        return tuple((scan.member, imp) for scan in self.cache.upstream.scans for imp in scan.flagged)

    @property
    def cache_findings(self) -> tuple[tuple[PickleScan, PickleImport | None], ...]:
        """Each dangerous or unresolved import of the cache's pickles, and (scan, None) for a pickle
        the scan could not follow to its end: what it would do past that point is unknown."""
        if self.cache.upstream is None:
            return ()
        found: list[tuple[PickleScan, PickleImport | None]] = []
        for scan in self.cache.upstream.scans:
            found.extend((scan, imp) for imp in scan.dangerous)
            if scan.problem is not None:
                found.append((scan, None))
        return tuple(found)


# ---- guards: empty for MakeFx, shaped for Dynamo's guard slots -------------------------------

SlotStatus = Literal["kept", "dropped", "risky_dropped", "policy_dropped"]


class GuardSlot(msgspec.Struct, frozen=True, kw_only=True):
    """One guard slot of a frame variant, keyed by (guard_type, source) across artifacts."""

    guard_type: str
    source: str
    status: SlotStatus
    check: str = ""
    risky: bool = False
    origin: str = ""
    """Where the user's code made the guard (`path:line in function: code`), where python_code says."""


class FrameGuards(msgspec.Struct, frozen=True, kw_only=True):
    frame: str
    variant: int = 0
    slots: tuple[GuardSlot, ...] = ()


SpecializationKind = Literal["shape", "dtype", "device", "stride", "constant", "param", "buffer",
                             "global_state", "attribute", "global", "closure"]


class Specialization(msgspec.Struct, frozen=True, kw_only=True):
    """Something a MakeFx trace is specialized on; the driver refuses a call that differs (risky: one
    it cannot check, such as a closure cell, whose captured value a served call keeps)."""

    kind: SpecializationKind
    path: str
    value: str
    risky: bool = False


class Guards(msgspec.Struct, frozen=True, kw_only=True):
    tracer: str
    has_guards: bool
    headline: str
    not_checked: tuple[str, ...]
    frames: tuple[FrameGuards, ...] = ()
    specializations: tuple[Specialization, ...] = ()

