"""`precompile doctor`: which features work with the installed torch, Python and host, and why not.

Fast and side-effect free: it resolves torch_compat's private names (imports, no compiles), runs one
fresh interpreter (isolated from the current directory, see child_python) to see what the no-Inductor load path imports, and, where a C++ compiler is
found, builds one empty shared library with it (a few hundred ms) to prove it works. It never
compiles a graph, never probes vector ISAs (Inductor builds a library per ISA for that) and never
touches a GPU beyond asking CUDA whether one is there.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass

from precompile import torch_compat
from precompile.capturing.progress import phase
from precompile.cli import child_python
from precompile.errors import PrecompileError


@dataclass(frozen=True)
class Feature:
    name: str
    works: bool
    detail: str  # how it was found to work, or why it does not


@dataclass(frozen=True)
class DoctorReport:
    torch: str
    python: str
    host: str
    supported: bool
    features: tuple[Feature, ...]

    def summary(self) -> str:
        working = [f.name for f in self.features if f.works]
        return (
            f"torch {self.torch}, Python {self.python}, {self.host}: {len(working)} of {len(self.features)} features work"
            + ("" if self.supported else " (this torch is outside the supported range)")
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def _resolves(*names: str) -> str | None:
    """None when every runtime name resolves on this torch, else the first failure's message."""
    for name in names:
        try:
            torch_compat.resolve(torch_compat.where(name))
        except PrecompileError as exc:
            return str(exc)
    return None


def _feature(name: str, problem: str | None, works: str) -> Feature:
    return Feature(name, problem is None, works if problem is None else problem)


# The no-Inductor load path: what a fresh interpreter imports to serve a primed MakeFx artifact
# (the drivers' module-level imports and the kernel loader's torch._C entry).
_LOAD_PATH_PROBE = """
import json, sys, torch
import precompile.codegen.drivers.inductor_runtime, precompile.codegen.drivers.makefx_reads, precompile.codegen.drivers.makefx
import precompile.serve.load
print(json.dumps(sorted(m for m in sys.modules if m == "triton" or m.startswith("torch._inductor"))))
"""


def _no_inductor_load_path() -> Feature:
    with phase("see what a fresh process imports to load an artifact"):
        return _load_path_feature()


def _load_path_feature() -> Feature:
    with child_python.empty_directory() as cwd:
        proc = subprocess.run(child_python.command("-c", _LOAD_PATH_PROBE), cwd=cwd, env=child_python.environment(),
                              capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Feature("no-Inductor load path", False, f"a fresh interpreter could not import the load path: {tail}")
    imported = json.loads(proc.stdout.strip().splitlines()[-1])
    if imported:
        return Feature("no-Inductor load path", False, f"loading imports {', '.join(imported[:3])}{' ...' if len(imported) > 3 else ''}")
    return Feature("no-Inductor load path", True, "a fresh interpreter loads the drivers without torch._inductor")


def _compiler() -> Feature:
    candidates = [os.environ.get("CXX"), "c++", "g++", "clang++"]
    compiler = next((shutil.which(c) for c in candidates if c and shutil.which(c)), None)
    if compiler is None:
        return Feature("C++ compiler", False, "no CXX, c++, g++ or clang++ on PATH: the inductor backend cannot build CPU kernels")
    with tempfile.TemporaryDirectory(prefix="precompile-doctor-") as directory:
        source = os.path.join(directory, "probe.cpp")
        with open(source, "w", encoding="utf-8") as file:
            file.write('extern "C" int precompile_probe() { return 0; }\n')
        proc = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O0", source, "-o", os.path.join(directory, "probe.so")],
            capture_output=True, text=True, timeout=60, check=False,
        )
    if proc.returncode != 0:
        return Feature("C++ compiler", False, f"{compiler} failed to build an empty shared library: {proc.stderr.strip()[:200]}")
    return Feature("C++ compiler", True, f"{compiler} built an empty shared library")


def _triton_cuda() -> Feature:
    import torch

    triton = importlib.util.find_spec("triton")
    version = importlib.metadata.version("triton") if triton is not None else None
    if not torch.cuda.is_available():
        why = "this torch has no CUDA" if torch.version.cuda is None else f"torch built for CUDA {torch.version.cuda} sees no GPU"
        return Feature("Triton/CUDA kernels", False, why + (f"; triton {version} installed" if version else "; triton not installed"))
    if version is None:
        return Feature("Triton/CUDA kernels", False, f"CUDA {torch.version.cuda} works, but triton is not installed")
    return Feature("Triton/CUDA kernels", True, f"{torch.cuda.get_device_name()} with CUDA {torch.version.cuda}, triton {version}")


def diagnose(probe_compiler: bool = True) -> DoctorReport:
    with phase("import torch"):
        import torch

    version = torch_compat.torch_version()
    low, high = torch_compat.SUPPORTED
    supported = low <= version <= high
    dynamo_problem = _resolves("dynamo", "CompilePackage", "PrecompileContext", "load_guards_state", "dynamo_config")
    if dynamo_problem is None:
        from precompile.torch_compat import dynamo

        if not dynamo.is_dynamo_supported():
            dynamo_problem = f"Dynamo does not support Python {platform.python_version()} in torch {torch.__version__}"
    with phase("probe the C++ compiler" if probe_compiler else "skip the C++ compiler probe"):
        compiler = _compiler() if probe_compiler else Feature("C++ compiler", False, "not probed (--no-compiler-probe)")
    inductor_problem = _resolves("inductor_config", "compile_fx", "cpp_builder", "cpu_vec_isa", "temporary_cache_dir")
    if inductor_problem is None and not compiler.works:
        inductor_problem = f"Inductor is there but CPU kernels need a C++ compiler ({compiler.detail})"
    missing_gates = torch_compat.missing_gates()
    features = (
        _feature("MakeFx tracer", _resolves("FakeTensorMode", "pytree", "get_effect", "OpOverload", "check", "fx_custom_builtins"),
                 "make_fx traces, and the refusal checks find their torch helpers"),
        _feature("Dynamo tracer", dynamo_problem, "CompilePackage, PrecompileContext and guard state loading are there"),
        Feature("eager backend", True, "needs nothing beyond torch"),
        _feature("inductor backend", inductor_problem, "Inductor's compile_fx and C++ builder are there and a compiler works"),
        _feature(
            "frozen C++ kernels",
            _resolves("inductor_tensor_data_ptr"),
            "primed kernel libraries load straight from the bundle, through torch._C alone",
        ),
        _triton_cuda(),
        _no_inductor_load_path(),
        _feature(
            "no_compilation() gates",
            None if not missing_gates else "missing gate targets: " + ", ".join(missing_gates),
            f"all {sum(len(g) for g in torch_compat.NO_COMPILATION_GATES.values())} gate targets found in torch's sources",
        ),
        _feature(
            "installed serving mode",
            dynamo_problem or _resolves("load_precompile_entry", "set_eval_frame", "set_code_exec_strategy",
                                        "debug_get_cache_entry_list", "callback_from_stance", "lookup_code"),
            "Dynamo's hook for precompiled entries and its frame evaluator are there",
        ),
    )
    return DoctorReport(
        torch=str(torch.__version__),
        python=platform.python_version(),
        host=f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
        supported=supported,
        features=features,
    )
