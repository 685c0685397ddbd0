"""What keys a kernel bundle to a host, and why a bundle does not fit one. Torch-free.

Compiled kernels are keyed (by Inductor) on their full build command, which holds the torch and
Python install paths and the ISA flags; they also run only on a CPU with the instruction sets they
were built for. A capture records these ingredients in the bundle's `keys`; `load` and
`precompile verify --host` compare them with this host.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
import sysconfig
from dataclasses import dataclass


def cpu_flags() -> frozenset[str] | None:
    """This host's CPU feature flags, or None where /proc/cpuinfo cannot tell."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def _torch_install() -> tuple[str, str]:
    """(version, package dir) of torch: from the imported module, else found without importing it."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return str(torch.__version__), os.path.dirname(torch.__file__)
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "", ""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        version = ""
    return version, list(spec.submodule_search_locations)[0]


def host_keys() -> dict[str, str]:
    """The ingredients of the kernel cache keys that this host can tell cheaply, without importing torch."""
    torch_version, torch_dir = _torch_install()
    flags = cpu_flags()
    return {
        "torch": torch_version,
        "python": "%d.%d" % sys.version_info[:2],
        "machine": platform.machine(),
        "torch_dir": torch_dir,
        "python_include": sysconfig.get_paths()["include"],
        "cpu_flags": " ".join(sorted(flags)) if flags is not None else "",
    }


@dataclass(frozen=True)
class Mismatch:
    """One key on which a bundle does not fit this host."""

    key: str
    captured: str
    here: str

    def __str__(self) -> str:
        if self.key == "cpu_flags":
            return f"this CPU lacks instruction-set flags of the capturing CPU: {self.captured}"
        return f"{self.key} is {self.here!r} here but {self.captured!r} where it was captured"


def mismatches(recorded: dict[str, str], host: dict[str, str]) -> list[Mismatch]:
    """Why a bundle keyed by `recorded` cannot serve this host, one entry per key."""
    found = [
        Mismatch(key, recorded.get(key, ""), host.get(key, ""))
        for key in ("torch", "python", "machine", "torch_dir", "python_include")
        if recorded.get(key) != host.get(key)
    ]
    missing = sorted(set(recorded.get("cpu_flags", "").split()) - set(host.get("cpu_flags", "").split()))
    if missing:
        shown = " ".join(missing[:8]) + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else "")
        found.append(Mismatch("cpu_flags", shown, host.get("cpu_flags") or "(unreadable)"))
    return found
