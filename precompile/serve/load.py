"""load(artifact_path, cache_path): read the pair, check it, exec python_code, wrap `forward`."""
from __future__ import annotations

import ast
import builtins
import contextlib
import gc
import logging
import marshal
import os
import time
import types
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

# What load needs is imported with the cyclic collector paused, as load itself runs (see load()):
# thousands of long-lived objects (modules, classes, functions), nothing for a collection to free.
# Imported right after `import torch` and a model's build, they would set off a full collection over
# all of torch's objects (0.05-0.3 s at 48 layers), one that the same process without precompile
# does not run before its first result either; the collector runs when the process next needs it.
_collecting = gc.isenabled()
gc.disable()
try:
    from precompile.artifact import bytecode, code_parts, opaque_state
    from precompile.artifact.envelope import OpaqueCheck
    from precompile.artifact.metadata import ArtifactMetadata, MetadataHeader
    from precompile.artifact.pair import (
        PythonCode,
        pairing_problem,
        parse_cache,
        read_bytes,
        read_cache,
        read_python_code,
    )
    from precompile.artifact.pycode import MAX_PYTHON_CODE_SIZE, code_hash, cyclic_gc_paused, parse_source
    from precompile.errors import CompilationForbidden, PairMismatch, PrecompileError, PrecompileWarning, cause_of
    from precompile.serve import environment, source_lines
    from precompile.storage.locations import checked, is_url, redacted
finally:
    if _collecting:
        gc.enable()
# Imported where they are needed, so that loading an eager artifact from its cache, unsigned, does
# not pay for them: the kernel bundle's rules and runtime (an Inductor bundle), signatures (pins
# set), the interrupted-write recovery.
if TYPE_CHECKING:
    from precompile.signing.pair import TrustedKeys
    from precompile.storage.forms import FetchedPair

_TRUSTED_KEYS_ENV = "PRECOMPILE_TRUSTED_KEYS"
_IDENTITY_ENV = ("PRECOMPILE_EXPECT_NAME", "PRECOMPILE_MIN_RELEASE")
"""precompile.signing's TRUSTED_KEYS_ENV, EXPECT_NAME_ENV and MIN_RELEASE_ENV, named here so that an
unpinned load need not import signing."""

log = logging.getLogger("precompile")

MAX_CACHE_SIZE = 16 * 1024 * 1024 * 1024


class PrecompiledRunnable:
    """What `load` returns: callable with the captured fn's calling convention.

    A standalone artifact installs nothing, so entering, exiting and `unload()` are no-ops and the
    runnable keeps serving after them. An installed artifact's entries stay on the captured code
    objects until the process exits (removing them is not implemented), so for it too they are no-ops.
    """

    def __init__(self, forward, python_code: PythonCode, artifact_path: Path, *, cache_used: bool,
                 bytecode_from_cache: bool = False) -> None:
        self._forward = forward
        self._python_code = python_code
        self.artifact_path = artifact_path
        self.cache_used = cache_used
        self.bytecode_from_cache = bytecode_from_cache
        """Whether python_code ran as the bytecode its cache carries (else it was compiled here)."""

    @property
    def metadata(self) -> ArtifactMetadata:
        """The artifact's typed metadata (decoded on first read, when it came from the cache)."""
        return self._python_code.metadata

    @property
    def metadata_from_cache(self) -> bool:
        """Whether the metadata came typed from the cache (else python_code's literals were parsed)."""
        return self._python_code.metadata_from_cache

    @property
    def installed(self) -> bool:
        return self._python_code.header.serving_mode == "installed"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward(*args, **kwargs)

    def __enter__(self) -> PrecompiledRunnable:
        return self

    def __exit__(self, *exc_info) -> None:
        self.unload()

    def unload(self) -> None:
        """Remove whatever loading installed; nothing, for a standalone artifact."""

    def __repr__(self) -> str:
        meta = self._python_code.header
        return f"<PrecompiledRunnable {meta.fn_name} from {self.artifact_path.name} (backend={meta.backend!r}, {meta.serving_mode})>"


def _read_cache_for(python_code: bytes, digest: str, cache_path: Path, signed: bytes | None = None):
    """The cache file, read header-first (not yet judged). `signed`: the cache's bytes a signature
    was checked on, or that were fetched from a URL, used as they are (never a pending cache)."""
    cache = read_cache(cache_path, MAX_CACHE_SIZE) if signed is None else parse_cache(cache_path, signed)
    if signed is None and cache.envelope is not None and cache.envelope.code_hash != digest:
        # A write interrupted between its renames, or one still renaming (resolving waits for its
        # lock): either way the cache that pairs may be in place now.
        from precompile.artifact.writer import resolve_pending_cache

        resolve_pending_cache(cache_path, python_code)
        cache = read_cache(cache_path, MAX_CACHE_SIZE)
    return cache


def _usable_cache(python_code, cache):
    """The cache if it pairs with python_code; None (with a warning) if it is unusable."""
    if cache.envelope is None:
        warnings.warn(
            f"ignoring the cache: {cache.problem}. Loading from python_code {python_code.path} alone "
            "(the cache is only an acceleration); capture again to rebuild it",
            PrecompileWarning,
            stacklevel=3,
        )
        return None
    problem = pairing_problem(python_code, cache.envelope)
    if problem is not None:
        raise PairMismatch(
            f"the pair ({python_code.path}, {cache.path}) came from different captures: {problem}. "
            "Pass the cache written together with this python_code, or capture again"
        )
    return cache


def _prepared_code(envelope, python_code, filename: str) -> tuple[tuple[types.CodeType, ...], dict[str, types.CodeType]] | None:
    """python_code's bytecode from its (paired) cache, renamed to `filename` (its code objects, run in
    turn: one, or one a part where it is stored a part at a time), and the code of the
    output modules it carries as text, by their sha256; None when the cache carries none this
    process can run (another Python, -O, a sha256 that does not match), so that python_code is
    compiled instead."""
    compiled = envelope.python_bytecode
    if compiled is None:
        return None
    reason = bytecode.unusable_reason(compiled, python_code.code_hash)
    if reason is None and compiled.opaque is None and opaque_state.mentioned(python_code.data):
        reason = ("it does not record what load's opaque-state rule finds in python_code (a cache written before load "
                  "applied the rule to the bytecode path too)")
    if reason is not None:
        log.debug("compiling python_code %s: not running the bytecode its cache carries, since %s", python_code.path, reason)
        return None
    try:  # load() runs this with the cyclic collector paused: thousands of tuples, no cycle
        loaded = marshal.loads(bytecode.renamed(bytecode.decompressed(compiled), python_code.code_hash, filename))
    except (ValueError, EOFError, TypeError) as exc:
        log.debug("compiling python_code %s: its cached bytecode does not load (%s)", python_code.path, exc)
        return None
    if not (isinstance(loaded, tuple) and len(loaded) == 2 and isinstance(loaded[1], dict)
            and all(isinstance(c, types.CodeType) for c in loaded[1].values())):
        return None
    code = loaded[0]
    parts = code if compiled.part_lines and isinstance(code, tuple) else (code,)  # a part at a time: code_parts.py
    if not (parts and all(isinstance(part, types.CodeType) for part in parts)):
        return None
    if compiled.part_lines and len(parts) != len(compiled.part_lines):
        log.debug("compiling python_code %s: its cached bytecode holds %d parts, its record %d", python_code.path,
                  len(parts), len(compiled.part_lines))
        return None
    if any(part.co_filename != filename for part in parts):
        log.debug("compiling python_code %s: its cached bytecode names another file (%s)", python_code.path, parts[0].co_filename)
        return None
    return parts, loaded[1]


def _pins(trusted_keys: TrustedKeys | None):
    """The keys the pair must be signed by (precompile.signing.pair.pins_for): none, without
    importing the signing code, when neither `trusted_keys` nor the pinning variable is set."""
    if trusted_keys is None and _TRUSTED_KEYS_ENV not in os.environ:
        return []
    from precompile.signing.pair import pins_for

    return pins_for(trusted_keys)


def _expectations(expect_name: str | None, min_release: str | int | None):
    """The identity a signed pair must carry (precompile.signing.identity): the arguments' pin and the
    environment's, each its own; none, without importing the signing code, when neither is set. A pin
    refuses another model signed by the same key, an older release put back in place of a newer one,
    and a signature that binds no identity, and it needs a trusted key to check it with."""
    if expect_name is None and min_release is None and not any(name in os.environ for name in _IDENTITY_ENV):
        return []
    from precompile.signing.identity import expectations_for

    return expectations_for(expect_name, min_release, argument="load(expect_name=, min_release=)")


def _read_if_present(cache_path: Path) -> bytes | None:
    try:
        return read_bytes(cache_path, "cache", MAX_CACHE_SIZE)
    except PrecompileError:
        return None  # the signature check names what is missing


def fetched_if_urls(artifact_path: str | os.PathLike, cache_path: str | os.PathLike) -> FetchedPair | None:
    """The pair fetched into the local fetch cache (storage/) where it is given as URLs; None for paths."""
    given = checked(artifact_path, "artifact_path", "load"), checked(cache_path, "cache_path", "load")
    urls = [is_url(location) for location in given]
    if not any(urls):
        return None
    if not all(urls):
        raise PrecompileError(f"load({redacted(str(given[0]))}, {redacted(str(given[1]))}): pass both files as URLs or both as local paths")
    from precompile.storage.forms import fetch_pair

    return fetch_pair(str(given[0]), str(given[1]))


@contextlib.contextmanager
def _urls_named(fetched: FetchedPair | None):
    """A PrecompileError raised or a PrecompileWarning issued while a fetched pair loads names the URLs,
    not the fetch cache's copies (a cache the store lacks was never there: its name in the fetch cache
    is no path to show). The warnings are held until load ends, then issued where they were."""
    if fetched is None:
        yield
        return
    issued: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as issued:
            yield
    except PrecompileError as exc:
        if exc.args and isinstance(exc.args[0], str):
            exc.args = (fetched.named(exc.args[0]), *exc.args[1:])
        raise
    finally:
        for held in issued:
            message = held.message
            if isinstance(message, PrecompileWarning):
                message = PrecompileWarning(fetched.named(str(message)))
            warnings.warn_explicit(message, held.category, held.filename, held.lineno, source=held.source)


def _read_pair(artifact_path: Path, cache_path: Path, pins, expect, fetched):
    """python_code's bytes, their sha256 and the cache read header-first: read from the files, or as
    fetched (sha256-checked in the fetch cache); where keys or an identity are pinned (precompile.signing),
    the pair's signature is checked on the very bytes used."""
    code_data = read_bytes(artifact_path, "python_code", MAX_PYTHON_CODE_SIZE) if fetched is None else fetched.python_code.data
    given_cache = fetched.cache.data if fetched is not None and fetched.cache is not None else None
    if pins or expect:
        from precompile.signing.pair import require_trusted

        if fetched is None:
            given_cache = _read_if_present(cache_path)
        require_trusted(artifact_path, cache_path, pins, (code_data, given_cache), expect)
    digest = code_hash(code_data)
    return code_data, digest, _read_cache_for(code_data, digest, cache_path, given_cache)


def exec_registered(source: source_lines.Text, filename: str, namespace: dict[str, Any], tree: ast.Module | None = None,
                    code: tuple[types.CodeType, ...] | None = None) -> None:
    """Exec source we rendered into `namespace` as file `filename`, registered in linecache so
    tracebacks and debuggers show its lines (attrs does the same for the code it generates).
    `tree`, the source already parsed, is compiled instead of parsing the source again; `code`, the
    source already compiled (as `filename`: its code objects, run in turn, as artifact/code_parts.py
    says), is run as it is. `source`
    may be a function that returns the text: called to compile it, else when a traceback or debugger
    first reads a line of it."""
    if code is None:
        source = source_lines.text_of(source)
        code = (bytecode.compile_python_code(source if tree is None else tree, filename, optimize=-1),)
    source_lines.register(filename, source)
    if len(code) > 1 and code_parts.sets_up_annotations(code):
        namespace.setdefault("__annotations__", {})  # the module sets it up before its first statement
    for part in code:
        exec(part, namespace)


def _opaque_globals(found: OpaqueCheck | None, filename: str) -> dict[str, Any]:
    """Refuse a Dynamo python_code whose opaque state or marshalled bytecode is spelled other than
    precompile writes it (inspect scans only that spelling), or whose marshalled code is not what its
    label says; seed the bytecode's labelled sha256s, which the driver checks before marshal.loads.
    `found`: what the rule (artifact/opaque_state.py) finds in python_code, from its parse here or, with
    the cache's bytecode, as recorded beside it (verify finds it again from python_code)."""
    if found is None:
        return {}
    if found.problems:
        raise PrecompileError(f"python_code {filename}: {found.problems[0]} (`precompile verify` names every such problem)")
    return {} if found.labels is None else {opaque_state.BYTECODE_SHA256: dict(found.labels)}


def execute(
    source: source_lines.Text,
    filename: str,
    primed_kernels: dict[str, str] | None = None,
    allow_serve_time_compiles: bool = False,
    tree: ast.Module | None = None,
    code: tuple[types.CodeType, ...] | None = None,
    modules: dict[str, types.CodeType] | None = None,
    opaque: OpaqueCheck | None = None,
) -> dict[str, Any]:
    """Exec python_code as its own namespace (see exec_registered: `source` is its text, or a function
    that returns it, called where it is needed; `tree` is its parse, if made,
    `code` its compiled bytecode, if at hand, `modules` the code of the output modules it carries as
    text, by the sha256 of the text, which its dynamo_subgraphs driver then runs instead of compiling).

    `primed_kernels` ({kernel source sha256: library path}) lets the kernel runtime of an Inductor
    artifact load its kernels directly instead of compiling them; `allow_serve_time_compiles` tells
    an installed Dynamo artifact's driver that a missed call may compile.

    The opaque-state rule applies whichever way python_code runs: to its parse when it is compiled here
    (parsed first where it names an opaque part), else to `opaque`, what capture recorded beside `code`.
    """
    namespace: dict[str, Any] = {"__name__": "precompile_artifact", "__file__": filename, "__builtins__": builtins}
    if code is None:
        source = source_lines.text_of(source)
        if tree is None and opaque_state.mentioned(source):
            tree = parse_source(source, filename=filename)
        opaque = opaque_state.checked(tree, source) if tree is not None else None
    namespace.update(_opaque_globals(opaque, filename))
    if primed_kernels:
        namespace["__precompile_kernels__"] = dict(primed_kernels)
    if allow_serve_time_compiles:
        namespace["__precompile_allow_serve_time_compiles__"] = True
    if modules:
        namespace["__precompile_subgraph_code__"] = modules
    try:
        exec_registered(source, filename, namespace, tree, code)
    except PrecompileError:
        raise
    except Exception as exc:
        forbidden = cause_of(exc, CompilationForbidden)
        if forbidden is not None:  # Inductor wraps what its compile workers raise
            raise forbidden from exc
        raise PrecompileError(f"python_code {filename} failed to execute: {type(exc).__name__}: {exc}") from exc
    if not callable(namespace.get("forward")):
        raise PrecompileError(f"python_code {filename} defines no forward(); it is not a complete precompile artifact")
    return namespace


def _prime_kernels(cache, root: Path) -> dict[str, str] | None:
    """Extract the cache's kernel bundle under `root` (serve/kernel_root.py) for this process and
    return its kernels by source sha256; None if there is no bundle, or (with a warning saying why) if
    it cannot serve this host."""
    bundle = cache.envelope.bundle
    if bundle is None or not bundle.files:
        return None
    from precompile.artifact import bundle_keys, bundle_rules
    from precompile.artifact.codec import CacheFormatError, decode_payload
    from precompile.serve import kernels

    unserved = bundle_rules.unserved_reason(cache.envelope)
    if unserved is not None:
        warnings.warn(
            f"not serving the kernel bundle in {cache.path}: {unserved}. python_code will compile its kernels here "
            "instead (JIT); capture again to ship kernels this precompile serves",
            PrecompileWarning,
            stacklevel=4,
        )
        return None
    reasons = bundle_keys.mismatches(bundle.keys, kernels.serving_keys(bundle.keys))
    if reasons:
        warnings.warn(
            f"the kernel bundle in {cache.path} does not fit this host: {'; '.join(map(str, reasons))}. "
            "python_code will compile its kernels here instead (JIT)",
            PrecompileWarning,
            stacklevel=4,
        )
        return None
    try:
        files = decode_payload(bundle, cache.data, cache.payload_offset, source=f"cache {cache.path}")
        return kernels.prime(bundle, files, root)
    except (CacheFormatError, OSError, ValueError, MemoryError) as exc:
        warnings.warn(
            f"ignoring the kernel bundle: {exc}. python_code will compile its kernels here instead (JIT)",
            PrecompileWarning,
            stacklevel=4,
        )
        return None


def _kernels_for(python_code: PythonCode, cache, kept: set[str], *, pinned: bool):
    """The bundle's kernels primed for python_code (see _prime_kernels; None where none are) and the
    root judged for them (serve/kernel_root.py), before python_code runs: where this process's
    Inductor looks kernels up and compiles them, for an Inductor artifact or a cache with a bundle
    (None for an eager one without: nothing of it reaches Inductor). A private root Inductor is
    pointed at outlives load (`kept`), so compiles after load returns use it too; under trust pins,
    python_code that would compile its kernels beside a root someone else can write is refused."""
    bundle = cache.envelope.bundle if cache is not None else None
    if python_code.header.backend == "eager" and (bundle is None or not bundle.files):
        return None, None
    from precompile.serve import kernel_root

    judged = kernel_root.for_this_process()
    if judged.set_aside is not None:
        kept.add("TORCHINDUCTOR_CACHE_DIR")
    primed = _prime_kernels(cache, judged.root) if cache is not None else None
    if pinned and primed is None and judged.set_aside is not None and python_code.header.backend != "eager":
        raise kernel_root.jit_refused(judged, python_code.path)
    return primed, judged


def served_by_aotautograd(header: MetadataHeader) -> bool:
    """Whether a Dynamo artifact has a subgraph AOTAutograd serves (every inductor subgraph of one
    written before subgraphs were lowered)."""
    if header.tracer != "dynamo" or header.backend != "inductor":
        return False
    return any(graph.served_by in ("", "aotautograd") for graph in header.subgraphs) or not header.subgraphs


def load(
    artifact_path: str | os.PathLike, cache_path: str | os.PathLike, *, allow_serve_time_compiles: bool = False,
    trusted_keys: TrustedKeys | None = None, expect_name: str | None = None, min_release: str | int | None = None,
) -> PrecompiledRunnable:
    """Reconstruct a runnable from the two files a precompile capture wrote.

    Both files are trusted, EXECUTABLE input. A cache that cannot be read, or is of another format or
    version, is ignored with a PrecompileWarning; a cache that belongs to another python_code (its
    backend, tracer or code_hash differs) is a PrecompileError. `allow_serve_time_compiles` is for
    installed artifacts only: a call no captured variant covers then compiles with the artifact's
    backend under the process-wide stance; a standalone artifact has no compiler behind it, so
    passing it there is a PrecompileError.

    Either may be an fsspec URL (s3://, gs://, http(s)://, hf://, file://; needs precompile[remote]), then
    both are: the pair, and the .sig beside python_code, are fetched into the local content-addressed
    fetch cache (storage/fetch_cache.py; reused while the store's ETag or checksum is unchanged) and
    checked as local files are.

    Signed pairs: with `trusted_keys` (public key paths or PEM bytes) or PRECOMPILE_TRUSTED_KEYS set,
    a pair none of those keys signed (`precompile sign`), whose files changed since, or whose cache is
    missing, is a PrecompileError raised before anything of it is parsed or executed; with `expect_name`
    / `min_release` (or PRECOMPILE_EXPECT_NAME / PRECOMPILE_MIN_RELEASE) so is a signature that binds
    another name, an older release (PEP 440 order) or no identity (see `_expectations`).
    """
    started = time.perf_counter()
    fetched = fetched_if_urls(artifact_path, cache_path)
    # Load builds long-lived objects (the metadata, python_code's code and namespace): the collector
    # waits until it is done, as it does for load's own imports (see the top of this module), unless
    # python_code is to compile something here (its bytecode, or kernels no bundle primed).
    with environment.restored() as kept, contextlib.ExitStack() as collector, _urls_named(fetched):
        collector.enter_context(cyclic_gc_paused())
        if fetched is not None:  # the bytes fetched (and sha256-checked) are the ones used, named in the fetch cache
            artifact_path, cache_path = fetched.python_code_path, fetched.cache_path
        artifact_path, cache_path = Path(artifact_path), Path(cache_path)
        pins, expect = _pins(trusted_keys), _expectations(expect_name, min_release)
        code_data, digest, cache_file = _read_pair(artifact_path, cache_path, pins, expect, fetched)
        paired = cache_file.envelope if cache_file.envelope is not None and cache_file.envelope.code_hash == digest else None
        python_code = read_python_code(artifact_path, code_data, envelope=paired, digest=digest)
        if allow_serve_time_compiles and python_code.header.serving_mode != "installed":
            raise PrecompileError(
                f"load(allow_serve_time_compiles=True): {artifact_path} is a {python_code.header.serving_mode} "
                "artifact, which has no compiler behind it (only an installed Dynamo artifact can compile a call its "
                "variants miss); load it without the flag, and capture the calls it misses"
            )
        cache = _usable_cache(python_code, cache_file)
        primed, kernel_dir = _kernels_for(python_code, cache, kept, pinned=bool(pins))
        filename = str(artifact_path.resolve())
        prepared = _prepared_code(cache.envelope, python_code, filename) if cache is not None else None
        code, modules = prepared if prepared is not None else (None, None)
        opaque = cache.envelope.python_bytecode.opaque if code is not None else None
        # Output modules AOTAutograd serves load their kernels through Inductor itself, which would
        # probe this host's vector ISAs first and look kernels up by keys that hash install paths; the
        # kernel runtime (MakeFx artifacts, lowered Dynamo subgraphs) does neither.
        # A bundle written before it mapped kernel sources to libraries is served through Inductor too.
        through_inductor = primed is not None and python_code.header.tracer == "dynamo" and (
            served_by_aotautograd(python_code.header) or not cache.envelope.bundle.kernels
        )
        if code is None or (primed is None and python_code.header.backend != "eager"):
            collector.close()  # the collector runs as usual while python_code compiles
        with contextlib.ExitStack() as stack:
            if through_inductor:
                assert primed is not None and kernel_dir is not None  # set only when the bundle's kernels were primed
                from precompile.serve import kernels

                bundle = cache.envelope.bundle
                stack.enter_context(kernels.producer_vec_isas(bundle.keys))
                stack.enter_context(kernels.inductor_serves_from(primed, kernels.built_sources(bundle, kernel_dir.root)))
            # The text is decoded where it is parsed or compiled here, else when a traceback first reads it.
            namespace = execute(lambda: python_code.source, filename, primed, allow_serve_time_compiles, python_code.tree,
                                code, modules, opaque)
        log.info(
            "loaded %s in %.3f s (cache %s, %d kernels primed, bytecode %s, metadata %s)",
            artifact_path, time.perf_counter() - started, "used" if cache else "not used", len(primed or ()),
            "from the cache" if code is not None else "compiled here",
            "from the cache" if python_code.encoded is not None else "parsed here",
        )
        return PrecompiledRunnable(namespace["forward"], python_code, artifact_path, cache_used=cache is not None,
                                   bytecode_from_cache=code is not None)
