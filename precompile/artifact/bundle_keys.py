"""What keys a kernel bundle to a host, and why a bundle does not fit one. Torch-free.

A frozen kernel depends on the build it links against and the processor it runs on, not on where
that build is installed: a C++ kernel needs libtorch of the same build (version, git revision, C++
ABI, debug or release, CUDA version), the same Python ABI (its bindings use the C API), the same
machine and every CPU flag the compiler was allowed to use (Inductor builds with -march=native); a
Triton kernel needs the same GPU compute capability, CUDA, Triton build and Triton backend (what
Triton's own cache key hashes, less the kernel's source and options, which the bundle carries). Those are the bundle's
`keys`, its requirements: `load` and `precompile verify --host` compare them with this host.

Where the producer's torch and Python lived, and the compile command it used, are `provenance`:
recorded for information, never a reason to refuse a bundle, since no kernel that fits is compiled
again. Bundles written before provenance had its own field kept those paths among their keys;
`requirements` and `provenance` sort them by name.
"""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import platform
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass

# Requirements a host is compared on, by equality. A bundle records the subset that applies to it.
BUILD_KEYS = ("torch", "torch_git", "torch_debug", "torch_cuda", "cxx11_abi", "python", "python_abi", "machine")
# A GPU bundle's own: torch_cuda above is the CUDA runtime torch ships with and links against.
GPU_KEYS = ("gpu_capability", "triton", "triton_key", "triton_env")
# Requirements that describe the kernels' instruction set: implied by `cpu_flags`, which is checked.
ISA_KEYS = ("isa", "valid_isas")
# Requirements capture records for every bundle (cxx11_abi only where torch reports it), and for a
# bundle holding Triton files the GPU's too: a bundle lacking one is not served (see bundle_rules).
ALWAYS_RECORDED = ("torch", "torch_git", "torch_debug", "torch_cuda", "python", "python_abi", "machine", "cpu_flags",
                   "isa", "valid_isas")
# Names an older producer kept among `keys` that are provenance by today's rule.
LEGACY_PROVENANCE = ("torch_dir", "python_include", "compiler_command_sha256", "precompiled_headers")

# Requirements a host cannot tell without importing torch (or, for the GPU, initialising CUDA).
NEEDS_TORCH = {
    "cxx11_abi": "the C++ ABI is compiled into torch._C",
    "gpu_capability": "a GPU's compute capability needs the CUDA driver (nothing torch-free reports it)",
    "triton_key": "Triton's build hash (with its GPU backend's) is computed by Triton itself",
    "triton_env": "Triton names its cache-invalidating environment variables itself",
}


# The x86 flags of /proc/cpuinfo that name instruction-set extensions a compiler may emit: the
# features gcc's -march=native turns on (its -m options), by cpuinfo's names (pni is SSE3, abm is
# LZCNT, 3dnowprefetch is PREFETCHW). The rest (hypervisor, constant_tsc, tsc_known_freq, microcode
# mitigations, power management) say nothing of what a kernel may execute, and differ between a VM
# and the bare-metal host of the same CPU model.
X86_ISA_PREFIXES = ("sse", "ssse3", "avx", "fma", "bmi", "amx", "sha", "xsave")
X86_ISA = frozenset((
    "mmx", "pni", "popcnt", "abm", "lzcnt", "movbe", "aes", "pclmulqdq", "vaes", "vpclmulqdq", "gfni", "adx", "rdrand",
    "rdseed", "f16c", "xop", "tbm", "lwp", "cx8", "cx16", "cmov", "fxsr", "lahf_lm", "lm", "3dnowprefetch", "clflushopt",
    "clwb", "clzero", "fsgsbase", "rdpid", "rdtscp", "movdiri", "movdir64b", "serialize", "waitpkg", "ptwrite", "pku",
    "pconfig", "wbnoinvd", "enqcmd", "uintr", "hle", "rtm", "tsxldtrk", "shstk", "ibt", "cldemote", "mwaitx", "hreset",
    "kl", "widekl", "prefetchi", "cmpccxadd", "raoint", "apx_f",
))


def isa_flags(flags: Iterable[str]) -> frozenset[str]:
    """The flags among `flags` that name instruction-set extensions (see X86_ISA): what a bundle's
    kernels may need of a CPU. Flags of another architecture (aarch64's Features) are all kept."""
    flags = frozenset(flags)
    if not flags & {"sse2", "lm", "pni", "fpu"}:  # not an x86 flag list
        return flags
    return frozenset(flag for flag in flags if flag in X86_ISA or flag.startswith(X86_ISA_PREFIXES))


def cpu_flags() -> frozenset[str] | None:
    """This host's CPU instruction-set flags (isa_flags of /proc/cpuinfo's), or None where it cannot tell."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return isa_flags(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def _literals(path: str) -> dict[str, object]:
    """Top-level `name = literal` assignments of a Python file, read with ast (never executed)."""
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return {}
    found: dict[str, object] = {}
    for node in tree.body:
        target: ast.expr
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and value is not None:
            try:
                found[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    return found


def _torch_build() -> tuple[dict[str, str], str]:
    """(build keys of the installed torch, its package dir): from the imported module, else from
    torch/version.py read as text, so verify never imports torch."""
    torch = sys.modules.get("torch")
    if torch is not None:
        version = torch.version
        build = {"torch": str(torch.__version__), "torch_git": str(version.git_version), "torch_debug": str(bool(version.debug)),
                 "torch_cuda": str(version.cuda or "")}
        abi = getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", None)
        if abi is not None:
            build["cxx11_abi"] = str(int(abi))
        assert torch.__file__ is not None  # torch is a regular package: its module has an __init__.py
        return build, os.path.dirname(torch.__file__)
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {"torch": ""}, ""
    directory = list(spec.submodule_search_locations)[0]
    literals = _literals(os.path.join(directory, "version.py"))
    # torch.__version__ is version.py's, local part included (2.15.0+cu132); a wheel's metadata may
    # leave that part out (PyPI's CUDA builds say 2.15.0), so it is only the fallback.
    version = str(literals.get("__version__") or _distribution_version())
    build = {"torch": version}
    if "git_version" in literals:
        build.update(torch_git=str(literals["git_version"]), torch_debug=str(bool(literals.get("debug"))),
                     torch_cuda=str(literals.get("cuda") or ""))
    return build, directory


def _distribution_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return ""


def triton_version() -> str:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def host_keys(*, gpu: bool = False) -> dict[str, str]:
    """The requirements this host can tell cheaply, without importing torch (see NEEDS_TORCH);
    with `gpu`, the Triton release too (a search of the installed distributions)."""
    build, _ = _torch_build()
    flags = cpu_flags()
    keys = {
        **build,
        "python": "%d.%d" % sys.version_info[:2],
        "python_abi": str(sysconfig.get_config_var("SOABI") or ""),
        "machine": platform.machine(),
        "cpu_flags": " ".join(sorted(flags)) if flags is not None else "",
    }
    if gpu:
        keys["triton"] = triton_version()
    return keys


def is_gpu_bundle(keys: dict[str, str]) -> bool:
    return any(key in keys for key in GPU_KEYS)


def host_provenance() -> dict[str, str]:
    """Where torch and Python are installed here: what a producer records for information only."""
    _, torch_dir = _torch_build()
    return {"torch_dir": torch_dir, "python_include": sysconfig.get_paths()["include"]}


def requirements(keys: dict[str, str]) -> dict[str, str]:
    """The keys of a bundle that a host must match (an older bundle's paths left out)."""
    return {key: value for key, value in keys.items() if key not in LEGACY_PROVENANCE}


def provenance(keys: dict[str, str], recorded: dict[str, str]) -> dict[str, str]:
    """A bundle's provenance: its `provenance` field plus the paths an older producer kept in `keys`."""
    return dict(sorted({**{k: v for k, v in keys.items() if k in LEGACY_PROVENANCE}, **recorded}.items()))


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
    """Why a bundle keyed by `recorded` cannot serve this host, one entry per requirement.

    Only requirements both sides know are compared: a key the bundle does not record (an older
    producer) or this host cannot tell (see `unchecked`) is not a reason to refuse.
    """
    wanted = requirements(recorded)
    found = [
        Mismatch(key, value, host[key])
        for key, value in wanted.items()
        if key not in ISA_KEYS and key != "cpu_flags" and key in host and value != host[key]
    ]
    # Caches written before recorded every cpuinfo flag: only the instruction-set ones are compared.
    missing = sorted(isa_flags(wanted.get("cpu_flags", "").split()) - isa_flags(host.get("cpu_flags", "").split()))
    if missing:
        shown = " ".join(missing[:8]) + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else "")
        found.append(Mismatch("cpu_flags", shown, host.get("cpu_flags") or "(unreadable)"))
    return found


def missing_requirements(recorded: dict[str, str], *, gpu: bool) -> list[str]:
    """The requirements capture always records that `recorded` lacks (with `gpu`, the GPU's too)."""
    wanted = ALWAYS_RECORDED + (GPU_KEYS if gpu else ())
    return [key for key in wanted if key not in recorded]


def unchecked(recorded: dict[str, str], host: dict[str, str]) -> list[str]:
    """The requirements of `recorded` that `host` cannot tell (a torch-free host: see NEEDS_TORCH)."""
    return [key for key in requirements(recorded) if key not in ISA_KEYS and key != "cpu_flags" and key not in host]
