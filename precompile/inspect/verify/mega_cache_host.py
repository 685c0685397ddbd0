"""`verify --host` of a bare Mega-Cache: would this host hit its entries, judged torch-free.

torch keys each entry by digests (Inductor's FX-graph key hashes torch's own sources, the system's
devices and toolkits, the graph and the config), which only the torch that would load it can
recompute. What the entries record beside the code can be compared: the torch version that wrote
them (a different version never hits), the devices their graphs ran on (CPU is judged; a GPU needs
its driver, which is not asked torch-free), and, where they hold C++ kernels, the compiler Inductor
calls at load to build them, and the Python version a precompile entry (torch 2.14) records, which
torch requires exactly. The CPU's instruction set is not recorded: this host's is shown (Inductor picks
the vector ISA when it compiles the kernels here). The container, every entry's scan and every field of
an entry torch evaluates or imports (`formats/mega_cache_runs`: guard expressions, output strides,
the output module's file) are checked first, as `show` reports them.
"""
from __future__ import annotations

import ast
import platform
import shutil
from collections import Counter

from precompile.artifact.bundle_keys import cpu_flags
from precompile.inspect.formats.mega_cache_runs import run_finding
from precompile.inspect.model.artifact import Artifact, MegaCache, MegaCacheEntry, PickleImport
from precompile.inspect.model.report import Check, VerifyReport
from precompile.inspect.verify.verify import host_torch_version

_VECTOR_ISA = ("avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "avx2", "fma", "sse4_2", "asimd", "sve", "sve2")


def _recorded(mega: MegaCache, name: str) -> str | None:
    return next((value.value for value in mega.recorded if value.name == name), None)


def _integrity(mega: MegaCache) -> list[Check]:
    checks = [Check(name="mega-cache container", status="fail", message=mega.problem, remedy="do not load this blob")
              if mega.problem else
              Check(name="mega-cache container", status="ok", actual=f"{len(mega.entries)} entries, crc32 {mega.crc32}")]
    flagged: list[tuple[MegaCacheEntry, PickleImport | None]] = list({
        (entry.kind, entry.key, imp.module, imp.name): (entry, imp)  # one check per name an entry imports, nested pickles too
        for entry in mega.entries if entry.scan is not None for imp in entry.scan.flagged}.values())
    flagged += [(entry, None) for entry in mega.entries if entry.scan is not None and entry.scan.problem]
    checks += [Check(name="mega-cache pickle", status="fail",
                     message=(f"{entry.kind} {entry.key} would import {imp.module}.{imp.name} ({imp.risk}) if unpickled"
                              + (f": {imp.unresolved}" if imp.unresolved else "") if imp
                              else f"{entry.kind} {entry.key}: the scan stopped: {entry.scan.problem if entry.scan else ''}"),
                     remedy="do not load this blob; treat it as hostile") for entry, imp in flagged]
    if not flagged:
        checks.append(Check(name="mega-cache pickles", status="ok",
                            actual="only data-only names and torch's classes reviewed for each entry's kind"))
    return checks + _runs(mega)


def _runs(mega: MegaCache) -> list[Check]:
    """Each field torch evaluates or imports (guard expressions, output strides, the output module's
    file) judged against what torch writes there: a finding where it is anything else."""
    bad = [(entry, run) for entry in mega.entries for run in entry.runs if run.problem is not None]
    if bad:
        return [Check(name="mega-cache code torch runs", status="fail", actual=run.field, message=run_finding(entry, run),
                      remedy="do not load this blob; treat it as hostile (torch evaluates or imports that field at lookup or load)")
                for entry, run in bad]
    counts = Counter("guard expressions" if run.field == "guards_expr" else "output module files" if run.field == "cache_key"
                     else "output strides" for entry in mega.entries for run in entry.runs)
    return [Check(name="mega-cache code torch runs", status="ok",
                  actual=", ".join(f"{count} {what}" for what, count in sorted(counts.items())) or "none",
                  message="each as torch writes it (shown by show)")]


def _torch(mega: MegaCache) -> Check:
    wanted, here = _recorded(mega, "torch version"), host_torch_version()
    if wanted is None:
        return Check(name="host torch", status="skip", actual=here, message="no entry records the torch version in clear (only a digest of torch's sources, not comparable torch-free)")
    if "|" in wanted:
        return Check(name="host torch", status="skip", expected=wanted, actual=here,
                     message="the entries record several torch versions: at most those of one version can hit")
    if here == wanted:
        return Check(name="host torch", status="ok", expected=wanted, actual=here,
                     message=f"torch {here} wrote it (a hit also needs torch's source digest to match: not judged torch-free)")
    shown = here or "not installed"
    return Check(name="host torch", status="fail", expected=wanted, actual=shown,
                 message=f"torch {wanted} wrote this Mega-Cache, this host has torch {shown}: every entry would miss",
                 remedy=f"load it with torch=={wanted}, or save the cache again with torch {shown}")


def _devices(mega: MegaCache) -> Check:
    devices = (_recorded(mega, "devices") or "").split(" | ")
    others = [device for device in devices if device and device != "cpu"]
    if not devices or devices == [""]:
        return Check(name="host devices", status="skip", message="no entry records the devices its graphs ran on")
    if others:
        return Check(name="host devices", status="skip", expected=", ".join(devices),
                     message=f"{', '.join(others)} cannot be judged torch-free (it needs the device's driver)")
    return Check(name="host devices", status="ok", expected="cpu", actual="cpu")


def _compiler(mega: MegaCache) -> Check | None:
    if not any(kernel.kind == "cpp" for kernel in mega.kernels):
        return None
    recorded = _recorded(mega, "C++ compiler (inductor_config cpp.cxx)")
    try:
        names = [name for name in ast.literal_eval(recorded) if isinstance(name, str)] if recorded else []
    except (ValueError, SyntaxError, TypeError):
        names = []
    names = names or ["g++"]
    found = [name for name in names if shutil.which(name)]
    if found:
        return Check(name="host C++ compiler", status="ok", expected=", ".join(names), actual=shutil.which(found[0]),
                     message="load compiles the C++ kernels with it")
    return Check(name="host C++ compiler", status="fail", expected=", ".join(names), actual="not on PATH",
                 message=f"load compiles this blob's C++ kernels with {' or '.join(names)}, which this host lacks",
                 remedy=f"install {names[0]}, or set TORCHINDUCTOR_CPP_CXX / CXX to a C++ compiler")


def _isa() -> Check:
    flags = cpu_flags()
    shown = ", ".join(flag for flag in _VECTOR_ISA if flags and flag in flags) if flags is not None else "unknown"
    shown = shown or "none of " + ", ".join(_VECTOR_ISA)
    return Check(name="host CPU ISA", status="skip", actual=shown,
                 message=f"not recorded by the entries: Inductor picks the vector ISA when it compiles the kernels on this host ({shown})")


def _python(mega: MegaCache) -> Check:
    wanted, here = _recorded(mega, "python version"), platform.python_version()
    if wanted is None:
        return Check(name="host python", status="skip", actual=here, message="not recorded by the entries")
    if wanted == here:
        return Check(name="host python", status="ok", expected=wanted, actual=here)
    return Check(name="host python", status="fail", expected=wanted, actual=here,
                 message=f"its precompile entries were written under Python {wanted}, this host runs {here}: torch refuses them",
                 remedy=f"load it with Python {wanted}, or save the cache again with Python {here}")


def mega_cache_host_report(artifact: Artifact, *, host: bool = True) -> VerifyReport:
    """verify of a bare Mega-Cache: its integrity (the container and each entry's scan, as `show`
    judges them), then, with `host`, each recorded key against this host."""
    upstream = artifact.cache.upstream
    assert upstream is not None and upstream.mega_cache is not None  # the caller opened a bare Mega-Cache
    mega = upstream.mega_cache
    checks = _integrity(mega)
    if host:
        checks += [_torch(mega), _devices(mega)]
        compiler = _compiler(mega)
        checks += [compiler] if compiler is not None else []
        checks += [_isa(), _python(mega)]
    return VerifyReport(python_code="", cache=artifact.cache.path, host=host,
                        ok=not any(check.status == "fail" for check in checks), checks=tuple(checks))
