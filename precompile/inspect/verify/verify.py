"""Integrity checks of a pair, its signature (precompile.signing), and, with `host=True`, whether
this machine can serve it.

Each failed check names the expected and the actual value and the remedy. Nothing imports torch:
the host's torch version and build come from the installed distribution's metadata and version.py
(read as text); what only torch can tell (its C++ ABI, a GPU's compute capability) is a skip.
"""
from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from precompile.artifact import bytecode
from precompile.artifact.bundle_keys import (
    ISA_KEYS,
    NEEDS_TORCH,
    host_keys,
    host_provenance,
    is_gpu_bundle,
    mismatches,
    missing_requirements,
    provenance,
    requirements,
    unchecked,
)
from precompile.artifact.bundle_rules import unserved_reason
from precompile.artifact.codec import (
    MAX_HEADER_SIZE,
    PREFIX_SIZE,
    CacheFormatError,
    decode_header,
    decode_payload,
    payload_limit,
    payload_problem,
)
from precompile.artifact.pair import pending_path, read_bytes
from precompile.artifact.pickle_scan import finding_text, is_pickle, scan_pickle
from precompile.artifact.pycode import MAX_PYTHON_CODE_SIZE, code_hash, decode_source
from precompile.errors import PrecompileError
from precompile.inspect.formats.mega_cache_runs import run_finding
from precompile.inspect.formats.upstream import DEFAULT_TRACER
from precompile.inspect.model.artifact import Artifact, PickleScan, UpstreamCodeInfo, UpstreamPrecompile
from precompile.inspect.model.report import Check, VerifyReport
from precompile.inspect.verify import bytecode_proof
from precompile.signing.identity import Expectation
from precompile.signing.keys import Key
from precompile.signing.pair import check_pair

RECAPTURE = "capture the artifact again with this precompile"


def _integrity(artifact: Artifact, proof_memory_mib: int | None) -> list[Check]:
    checks: list[Check] = []
    code, cache = artifact.python_code, artifact.cache
    if code.problem is None and code.upstream is not None:
        checks.append(Check(name="python_code metadata", status="ok", actual=f"upstream torch.compiler.precompile (make_fx), backend {code.upstream.backend}"))
    elif code.problem is None:
        checks.append(Check(name="python_code metadata", status="ok", actual=f"format version {code.format_version}, tracer {code.tracer}"))
    else:
        checks.append(Check(name="python_code metadata", status="fail", message=code.problem,
                            remedy="upgrade precompile" if code.newer else "pass the python_code capture() wrote"))
    if cache.problem is None:
        checks.append(Check(name="cache envelope", status="ok", actual=f"format version {cache.format_version}"))
    else:
        remedy = "upgrade precompile" if cache.newer else f"delete the cache and {RECAPTURE}, or pass the cache written with this python_code"
        checks.append(Check(name="cache envelope", status="fail", message=cache.problem, remedy=remedy))
        for member, imp in artifact.flagged_imports:
            checks.append(Check(name="pickle imports", status="fail", actual=f"{imp.module}.{imp.name}",
                                message=f"{member} would import {imp.module}.{imp.name} ({imp.risk}) if unpickled",
                                remedy="do not load this cache; treat it as hostile"))
    checks.extend(_cache_pickles(artifact))
    checks.extend(_opaque(artifact))
    upstream = cache.upstream.precompile if cache.upstream is not None else None
    if code.upstream is not None and upstream is not None:
        assert code.file is not None  # upstream python_code was recognised in the file's bytes
        return checks + _upstream_pairing(code.upstream, code.file.sha256, upstream)
    meta, envelope = code.metadata, cache.envelope
    if meta is None or envelope is None:
        checks.append(Check(name="pairing", status="skip", message="needs a readable python_code and cache"))
        return checks
    assert code.file is not None  # the metadata was parsed from the file's bytes
    tracer = type(meta).__struct_config__.tag
    assert isinstance(tracer, str)  # each metadata layout is tagged with its TRACER name
    for name, expected, actual in (
        ("backend tag", meta.backend, envelope.backend),
        ("tracer tag", tracer, envelope.tracer),
        ("code hash", code.file.sha256, envelope.code_hash),
    ):
        if expected == actual:
            checks.append(Check(name=name, status="ok", expected=expected, actual=actual))
        else:
            checks.append(Check(
                name=name, status="fail", expected=expected, actual=actual,
                message=f"the cache's {name} is {actual}, the python_code's is {expected}: they are not one pair",
                remedy=f"pass the cache written with this python_code, or delete the cache and {RECAPTURE}",
            ))
    if artifact.pairing_problem is not None and all(c.status == "ok" for c in checks[-3:]):
        checks.append(Check(name="pairing", status="fail", message=artifact.pairing_problem, remedy=RECAPTURE))
    checks.extend(prepared_checks(artifact, proof_memory_mib))
    checks.extend(_bundle(artifact))
    return checks


_HOSTILE_RUN = "do not load this cache; treat it as hostile (torch evaluates or imports that field when it looks the entry up or loads it)"


def _cache_pickles(artifact: Artifact) -> list[Check]:
    """The cache's pickles that could not be scanned to their end, and (a cache read without a
    problem: an upstream pair) their dangerous imports: what loading the cache would unpickle; and
    each field of its Mega-Cache entries torch would run that is not what torch writes there."""
    shown = artifact.cache.problem is not None  # the imports are listed above, as "pickle imports"
    return [Check(name="cache pickle", status="fail",
                  actual=f"{imp.module}.{imp.name} at opcode offset {imp.offset}" if imp else None,
                  message=f"cache {artifact.cache.path}: {finding_text(scan, imp)}",
                  remedy="do not load this cache; treat it as hostile")
            for scan, imp in artifact.cache_findings if imp is None or not shown] + [
        Check(name="cache code torch runs", status="fail", actual=run.field, message=f"cache {artifact.cache.path}: {run_finding(entry, run)}",
              remedy=_HOSTILE_RUN) for entry, run in (artifact.cache.upstream.run_findings if artifact.cache.upstream else ())]


def _proof_inputs(python_code_path: str, cache_path: str):
    """python_code's bytes and the cache's envelope with its blobs, read again for the proof."""
    data = read_bytes(Path(python_code_path), "python_code", MAX_PYTHON_CODE_SIZE)
    decode_source(data, filename=python_code_path)
    full, _ = decode_header(read_bytes(Path(cache_path), "cache", PREFIX_SIZE + MAX_HEADER_SIZE + payload_limit()),
                            source=f"cache {cache_path}")
    return data, full


def start_proofs(pairs: Iterable[tuple[str, str]], proof_memory_mib: int | None = None) -> None:
    """Start the bytecode proofs `prepared_checks` will need for these pairs (python_code, cache), in
    one child, before the caller parses python_code: on a machine with a core to spare the two
    overlap, and a second python_code is proven from the parts the first did not have. Nothing starts
    for a pair where the proof would not run (no bytecode, another pair, another Python); a pair that
    cannot be read is left to the checks, which say why."""
    requests = []
    for python_code_path, cache_path in pairs:
        try:
            data, full = _proof_inputs(python_code_path, cache_path)
        except (PrecompileError, CacheFormatError):
            continue
        compiled, digest = full.python_bytecode, code_hash(data)
        if compiled is not None and full.code_hash == digest and compiled.magic == bytecode.magic():
            requests.append((data, digest, compiled, bytecode_proof.proof_memory(len(data), proof_memory_mib)))
    bytecode_proof.start(*requests)


def prepared_checks(artifact: Artifact, proof_memory_mib: int | None = None) -> list[Check]:
    """Proof that the bytecode and typed metadata the cache carries are python_code's: python_code
    compiled here marshals to the very bytes stored, and its literals convert to the metadata stored.
    The stored bytecode is compared, never loaded; caches without them (written before) get no line.
    The compilation runs in a child bounded in memory (`proof_memory_mib`, see bytecode_proof) and
    time: a proof over the bounds is a failed check that says "not proven"."""
    envelope = artifact.cache.envelope
    if envelope is None or (envelope.python_bytecode is None and envelope.metadata_msgpack is None):
        return []
    names = ("python_code bytecode", "python_code typed metadata")
    try:
        data, full = _proof_inputs(artifact.python_code.path, artifact.cache.path)
    except (PrecompileError, CacheFormatError) as exc:
        return [Check(name=name, status="fail", message=f"could not read the pair again: {exc}", remedy=RECAPTURE) for name in names]
    digest, memory = code_hash(data), bytecode_proof.proof_memory(len(data), proof_memory_mib)
    checks = []
    compiled, encoded = full.python_bytecode, full.metadata_msgpack
    if compiled is not None:
        if full.code_hash != digest:
            checks.append(Check(name=names[0], status="skip", message="the cache does not pair with python_code: load never runs it"))
        elif compiled.magic != bytecode.magic():
            checks.append(Check(
                name=names[0], status="fail", expected=compiled.magic, actual=bytecode.magic(),
                message=f"compiled by a Python with magic number {compiled.magic}; this Python ({bytecode.magic()}) cannot "
                        "compile python_code the same way to prove it is python_code's, and a Python with that magic number "
                        "would run it in place of python_code",
                remedy=f"verify on a Python with magic number {compiled.magic} (where load runs it) to prove it"))
        else:
            outcome = bytecode_proof.prove(data, digest, compiled, memory)
            problem = outcome.problem
            if outcome.not_proven is not None:
                checks.append(Check(name=names[0], status="fail", expected=compiled.sha256, actual=bytecode_proof.NOT_PROVEN,
                                    message=f"cache {artifact.cache.path}: the stored bytecode, which load may run in place of "
                                            f"python_code, is not proven to be python_code's: {outcome.not_proven}",
                                    remedy=f"allow the proof more memory (--proof-memory MIB, or {bytecode_proof.PROOF_MEMORY_ENV}) "
                                           "and verify again, or delete the cache (load then compiles python_code)"))
            elif problem is None:
                use = ("load may run it instead of compiling" if not compiled.left_out else
                       f"load does not run it, since {bytecode.left_out_reason(compiled)}")
                checks.append(Check(name=names[0], status="ok", expected=compiled.sha256, actual=f"{compiled.size} bytes",
                                    message=f"identical to python_code compiled here: {use}"))
            else:
                checks.append(Check(name=names[0], status="fail", expected=compiled.sha256, message=f"cache {artifact.cache.path}: "
                                    f"the stored bytecode, which load would run in place of python_code, is refused: {problem}",
                                    remedy=f"delete the cache and {RECAPTURE}"))
    if encoded is not None:
        parsed = artifact.python_code.metadata
        if full.code_hash != digest or parsed is None:
            checks.append(Check(name=names[1], status="skip", message="needs a readable python_code that pairs with the cache"))
        else:
            problem = bytecode.metadata_problem(encoded, digest, parsed)
            if problem is None:
                checks.append(Check(name=names[1], status="ok", expected=encoded.sha256, actual=f"{encoded.size} bytes",
                                    message="equal to python_code's metadata literals"))
            else:
                checks.append(Check(name=names[1], status="fail", expected=encoded.sha256, message=f"cache {artifact.cache.path}: "
                                    f"the stored metadata, which load would use in place of python_code's, is refused: {problem}",
                                    remedy=f"delete the cache and {RECAPTURE}"))
    return checks


def _opaque(artifact: Artifact) -> list[Check]:
    """Each pickle python_code carries (a Dynamo artifact's opaque state): what it would import."""
    checks = [Check(name="opaque state", status="fail", message=problem,
                    remedy="do not load this artifact: what load would decode is not what can be checked; capture it again")
              for problem in artifact.python_code.opaque_problems]
    found = artifact.opaque_findings
    for scan in artifact.python_code.pickles:
        mine = [imp for s, imp in found if s is scan]
        if not mine:
            checks.append(Check(name="opaque pickle", status="ok", actual=f"{scan.member} would import {_clean_imports(scan)}"))
        for imp in mine:
            checks.append(Check(name="opaque pickle", status="fail",
                                actual=f"{imp.module}.{imp.name} at opcode offset {imp.offset}" if imp else None,
                                message=finding_text(scan, imp),
                                remedy="do not load this artifact: loading unpickles this state; treat it as hostile"))
    return checks


def _clean_imports(scan: PickleScan) -> str:
    names = len({(imp.module, imp.name) for imp in scan.imports})
    if scan.unpickled_by_load:
        return f"{names} names, each on the data-only list or reviewed as part of Dynamo's state"
    unknown = len({(imp.module, imp.name) for imp in scan.imports if imp.risk == "unknown"})
    return f"{names} names ({unknown} not on the data-only list), none dangerous"


def _upstream_pairing(code: UpstreamCodeInfo, code_sha256: str, envelope: UpstreamPrecompile) -> list[Check]:
    """Upstream precompile's own pairing rule: the backend and tracer tags agree (an absent tracer is
    make_fx's, on either side) and code_hash = sha256(python_code)."""
    checks = []
    for name, expected, actual in (("backend tag", code.backend, envelope.backend),
                                   ("tracer tag", code.tracer, envelope.tracer or DEFAULT_TRACER),
                                   ("code hash", code_sha256, envelope.code_hash)):
        if expected == actual:
            checks.append(Check(name=name, status="ok", expected=expected, actual=actual))
        else:
            checks.append(Check(name=name, status="fail", expected=expected, actual=actual,
                                message=f"the cache's {name} is {actual}, the python_code's is {expected}: they are not one pair",
                                remedy="pass the cache torch.compiler.precompile returned with this python_code"))
    return checks


def _bundle(artifact: Artifact) -> list[Check]:
    cache = artifact.cache
    bundle = cache.envelope.bundle if cache.envelope is not None else None
    if bundle is None or not bundle.files:
        extra = (cache.payload.size if cache.payload else 0)
        if extra:
            return [Check(name="bundle payload", status="fail", expected="0 bytes", actual=f"{extra} bytes",
                          message="the cache has no bundle index but carries payload bytes", remedy=RECAPTURE)]
        return [Check(name="bundle", status="ok", actual="empty")]
    limit = PREFIX_SIZE + MAX_HEADER_SIZE + payload_limit()
    data = read_bytes(Path(cache.path), "cache", limit)
    offset = (cache.header_size or 0) + PREFIX_SIZE
    problem = payload_problem(bundle, data, offset)
    if problem is not None:
        return [Check(name="bundle payload sizes", status="fail", message=f"cache {cache.path}: {problem}", remedy=RECAPTURE)]
    checks = [_header_seal(cache.envelope)]
    checks.append(Check(name="bundle payload sizes", status="ok", actual=f"{bundle.payload_compressed_size} bytes compressed, {bundle.payload_size} uncompressed"))
    try:
        files = decode_payload(bundle, data, offset, source=f"cache {cache.path}")
    except CacheFormatError as exc:
        checks.append(Check(name="bundle payload", status="fail", message=str(exc), remedy=RECAPTURE))
        return checks
    for entry in bundle.files:
        checks.append(Check(name=f"bundle file {entry.path}", status="ok", expected=entry.sha256, actual=f"{len(files[entry.path])} bytes"))
        checks.extend(_bundle_pickle(cache.path, entry.path, files[entry.path]))
    return checks


def _header_seal(envelope) -> Check:
    """Whether load would serve the bundle at all: a header bound by its digest (checked when the
    cache was decoded) that records every requirement capture records."""
    unserved = unserved_reason(envelope)
    if unserved is None:
        return Check(name="bundle header", status="ok", actual=f"header_sha256 {envelope.header_sha256}",
                     message="bound by its digest, with every requirement capture records: load serves these kernels where they fit")
    if not envelope.header_sha256:
        return Check(name="bundle header", status="skip", message=f"load will not serve these kernels (it compiles them instead): {unserved}",
                     remedy=f"{RECAPTURE} to ship kernels load serves")
    return Check(name="bundle header", status="fail", message=f"load will not serve these kernels: {unserved}",
                 remedy=f"this is not a bundle capture writes; {RECAPTURE}")


def _bundle_pickle(cache_path: str, path: str, data: bytes) -> list[Check]:
    """A bundle file that is a pickle (a cache entry a compiler would unpickle) is scanned like the opaque state."""
    if not is_pickle(data):
        return []
    scan = scan_pickle(data, member=f"bundle file {path}")
    found = [(scan, imp) for imp in scan.dangerous] + ([(scan, None)] if scan.problem else [])
    return [Check(name="bundle pickle", status="fail",
                  actual=f"{imp.module}.{imp.name} at opcode offset {imp.offset}" if imp else None,
                  message=f"cache {cache_path}: {finding_text(scan, imp)}",
                  remedy="do not load this cache; treat it as hostile") for scan, imp in found]


def host_torch_version() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _host(artifact: Artifact) -> list[Check]:
    meta = artifact.python_code.metadata
    if meta is None:
        return [Check(name="host", status="skip", message="needs a readable python_code")]
    checks = []
    wanted = ".".join(map(str, meta.python_version))
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if wanted == here:
        checks.append(Check(name="host python", status="ok", expected=wanted, actual=here))
    else:
        checks.append(Check(name="host python", status="fail", expected=wanted, actual=here,
                            message=f"the artifact was captured with Python {wanted}, this host runs Python {here}",
                            remedy=f"serve it with Python {wanted}, or capture it again with Python {here}"))
    torch_here = host_torch_version()
    if torch_here == meta.torch_version:
        checks.append(Check(name="host torch", status="ok", expected=meta.torch_version, actual=torch_here))
    else:
        shown = torch_here or "not installed"
        checks.append(Check(name="host torch", status="fail", expected=meta.torch_version, actual=shown,
                            message=f"the artifact was captured with torch {meta.torch_version}, this host has torch {shown}",
                            remedy=f"install torch=={meta.torch_version}, or capture it again with torch {shown}"))
    bundle = artifact.cache.envelope.bundle if artifact.cache.envelope is not None else None
    if bundle is not None and bundle.files:
        checks.extend(_host_kernels(bundle))
    return checks


def _host_kernels(bundle) -> list[Check]:
    """One line per requirement of the kernel bundle (fits, does not, or cannot tell without torch),
    then its provenance: the producer's paths, shown beside this host's and never required."""
    gpu = is_gpu_bundle(bundle.keys) or any(entry.kind == "triton" for entry in bundle.files)
    host = host_keys(gpu=gpu)
    found = {mismatch.key: mismatch for mismatch in mismatches(bundle.keys, host)}
    cannot_tell = set(unchecked(bundle.keys, host))
    checks = [
        Check(name=f"host kernels requirement {key}", status="fail", expected="recorded", actual="missing",
              message=f"the bundle does not record {key}, which every capture records: load will not serve these kernels",
              remedy=RECAPTURE)
        for key in missing_requirements(bundle.keys, gpu=gpu)
    ]
    for key, captured in sorted(requirements(bundle.keys).items()):
        name = f"host kernels requirement {key}"
        mismatch = found.get(key)
        if mismatch is not None:
            checks.append(Check(name=name, status="fail", expected=mismatch.captured,
                                actual=mismatch.here if key != "cpu_flags" else "(this CPU's flags)",
                                message=str(mismatch),
                                remedy="serving here compiles the kernels again (JIT, needs a C++ compiler): "
                                       "capture on a host like this one to ship kernels it can use"))
        elif key in cannot_tell:
            checks.append(Check(name=name, status="skip", expected=captured,
                                message=f"{captured!r} where captured; cannot tell here without importing torch "
                                        f"({NEEDS_TORCH.get(key, 'not known to this precompile')}): load checks it"))
        elif key == "cpu_flags":
            checks.append(Check(name=name, status="ok", actual=f"this CPU has all {len(captured.split())} flags of the capturing CPU"))
        elif key in ISA_KEYS:
            checks.append(Check(name=name, status="ok", actual=f"{captured} (needs only the CPU flags checked above)"))
        else:
            checks.append(Check(name=name, status="ok", expected=captured, actual=host[key],
                                message="" if captured else "empty here and where captured"))
    here = host_provenance()
    for key, captured in provenance(bundle.keys, bundle.provenance).items():
        shown = f"captured with {captured}" + (f", here {here[key]}" if key in here else "")
        checks.append(Check(name=f"host kernels provenance {key}", status="ok", expected=captured, actual=here.get(key),
                            message=f"{shown} (for information: not required of a serving host)"))
    if not found and not any(check.status == "fail" for check in checks):
        checks.append(Check(name="host kernels", status="ok",
                            message="the kernel bundle fits this host" + (" as far as a torch-free check can tell" if cannot_tell else "")))
    return checks


def _pending(artifact: Artifact) -> list[Check]:
    """A `<cache>.pending` beside the cache is what load adopts, once it passes every check a cache
    passes, when the cache does not pair: verify cannot vouch for a pair that may change under it."""
    if not artifact.cache.path:
        return []
    pending = pending_path(Path(artifact.cache.path))
    if not os.path.lexists(pending):
        return []
    return [Check(name="pending cache", status="fail", actual=str(pending),
                  message=f"{pending} (left by an interrupted write) replaces the cache at load when the cache does not "
                          "pair with python_code and it does; this verify covered the cache only",
                  remedy=f"verify it as the cache (precompile verify {artifact.python_code.path} {pending}), then move it "
                         "over the cache, or delete it")]


def _signature(artifact: Artifact, trusted_keys: Sequence[Key] | None, expect: Sequence[Expectation]) -> Check:
    """Whether one of `trusted_keys` signed the pair as the identity `expect` pins; without them, only
    whether it carries a signature, and what it says."""
    verdict = check_pair(artifact.python_code.path, artifact.cache.path, trusted_keys, expect=expect)
    return Check(name="signature", status=verdict.status, expected=verdict.expected, actual=verdict.actual,
                 message=verdict.message, remedy=verdict.remedy)


def verify(artifact: Artifact, *, host: bool, trusted_keys: Sequence[Key] | None = None,
           expect: Sequence[Expectation] = (), proof_memory_mib: int | None = None) -> VerifyReport:
    checks = _integrity(artifact, proof_memory_mib) + _pending(artifact)
    checks.append(_signature(artifact, trusted_keys, expect))
    if host:
        checks.extend(_host(artifact))
    return VerifyReport(
        python_code=artifact.python_code.path,
        cache=artifact.cache.path,
        host=host,
        ok=all(c.status != "fail" for c in checks),
        checks=tuple(checks),
    )
