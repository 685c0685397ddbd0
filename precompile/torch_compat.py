"""The one door to torch's private surface: every private torch module, class or function the
runtime touches is reached here, under the name the runtime knows it by.

    from precompile.torch_compat import cpp_builder   # torch._inductor.cpp_builder, now

Names resolve lazily (a module `__getattr__`), so importing this module imports nothing private and
a serving process imports only what it uses. Where the supported torch versions (2.11 to 2.15)
differ, `_MOVED` says where a version keeps a name. A name this torch lacks raises PrecompileError
naming the torch version and the dotted name: nothing degrades silently.

The codegen drivers run standalone (only torch installed), so they cannot import this module; each
keeps the few private names it needs in a `_TORCH_PRIVATE` table that tests/project/test_torch_compat.py
checks equal to `DRIVER_NAMES` here.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

from precompile.errors import PrecompileError

SUPPORTED = ((2, 11), (2, 15))  # inclusive, (major, minor)

# runtime name -> "module" or "module:attribute.path", as torch 2.13 spells it.
PRIVATE_NAMES: dict[str, str] = {
    # Inductor: config, C++ builds, ISA probing, the kernel cache dir, lowering
    "inductor_config": "torch._inductor.config",
    "cpp_builder": "torch._inductor.cpp_builder",
    "cpu_vec_isa": "torch._inductor.cpu_vec_isa",
    "temporary_cache_dir": "torch._inductor.runtime.cache_dir_utils:temporary_cache_dir",
    "inductor_default_cache_dir": "torch._inductor.runtime.cache_dir_utils:default_cache_dir",
    "compile_fx": "torch._inductor.compile_fx",
    # what a primed C++ kernel library reads at load (codegen/drivers/inductor_runtime.py)
    "inductor_tensor_data_ptr": "torch._C:_dynamo.guards._torchinductor_pyobject_tensor_data_ptr",
    "assert_size_stride": "torch._C:_dynamo.guards.assert_size_stride",
    # Dynamo package, guards and config
    "dynamo": "torch._dynamo",
    "dynamo_config": "torch._dynamo.config",
    "CompilePackage": "torch._dynamo.package:CompilePackage",
    "load_guards_state": "torch._dynamo.package:load_guards_state",
    "load_guard_manager": "torch._dynamo.package:load_guard_manager",
    "GuardsStatePickler": "torch._dynamo.guards:GuardsStatePickler",
    "GuardStateMissing": "torch._dynamo.guards:_Missing",
    "is_from_unspecialized_builtin_nn_module_source": "torch._dynamo.guards:is_from_unspecialized_builtin_nn_module_source",
    "PrecompileContext": "torch._dynamo.precompile_context:PrecompileContext",
    "SerializedCode": "torch._dynamo.package:SerializedCode",
    "AsyncCompile": "torch._inductor.async_compile:AsyncCompile",
    # which ptxas Triton runs (and keys its cache by), as Inductor picks it before it compiles
    "set_triton_ptxas_path": "torch._inductor.runtime.compile_tasks:_set_triton_ptxas_path",
    # Inductor's in-process memo of compiled Triton kernels by source (a class-level dict)
    "compiled_triton_kernels": "torch._inductor.async_compile:CompiledTritonKernels._cache",
    "traceable_collective_remaps": "torch.distributed._functional_collectives:traceable_collective_remaps",
    "resolve_process_group": "torch._C:_distributed_c10d._resolve_process_group",
    "lookup_code": "torch._dynamo.package:_lookup_code",
    "PackageError": "torch._dynamo.exc:PackageError",
    "dynamo_counters": "torch._dynamo.utils:counters",
    # what the installed serving mode's driver reaches (codegen/drivers/dynamo.py)
    "load_precompile_entry": "torch._C:_dynamo.eval_frame._load_precompile_entry",
    "set_eval_frame": "torch._C:_dynamo.eval_frame.set_eval_frame",
    "set_code_exec_strategy": "torch._C:_dynamo.eval_frame.set_code_exec_strategy",
    "debug_get_cache_entry_list": "torch._C:_dynamo.eval_frame._debug_get_cache_entry_list",
    "callback_from_stance": "torch._dynamo.eval_frame:_callback_from_stance",
    # AOTAutograd, tracing contexts, fake tensors
    "functorch_config": "torch._functorch.config",
    "any_autocast_enabled": "torch._C:_is_any_autocast_enabled",
    "TracingContext": "torch._guards:TracingContext",
    "tracing": "torch._guards:tracing",
    "enable_python_dispatcher": "torch._dispatch.python:enable_python_dispatcher",
    "get_proxy_mode": "torch.fx.experimental.proxy_tensor:get_proxy_mode",
    "FakeTensorMode": "torch._subclasses.fake_tensor:FakeTensorMode",
    "FakeTensor": "torch._subclasses.fake_tensor:FakeTensor",
    "dispatch_keys": "torch._C:_dispatch_keys",
    "RootGuardManager": "torch._C:_dynamo.guards.RootGuardManager",
    # graph inspection and building blocks
    "OpOverload": "torch._ops:OpOverload",
    "get_effect": "torch._higher_order_ops.effects:_get_effect",
    "check": "torch:_check",
    "pytree": "torch.utils._pytree",
    "fx_custom_builtins": "torch.fx.graph:_custom_builtins",
}

# (major, minor) -> {runtime name: where that version keeps it}; only where it differs from 2.13.
_MOVED: dict[tuple[int, int], dict[str, str]] = {}

# Private names the standalone drivers reach (codegen/drivers/*.py `_TORCH_PRIVATE`), by driver.
DRIVER_NAMES: dict[str, dict[str, str]] = {
    "inductor_runtime": {
        "assert_size_stride": "torch._C:_dynamo.guards.assert_size_stride",
        "inductor_tensor_data_ptr": "torch._C:_dynamo.guards._torchinductor_pyobject_tensor_data_ptr",
    },
}

# no_compilation() gates: module -> ((dotted attribute, what calling it would do), ...).
NO_COMPILATION_GATES: dict[str, tuple[tuple[str, str], ...]] = {
    "torch._dynamo.convert_frame": (("_compile", "Dynamo would compile a frame"),),
    "torch.fx.experimental.proxy_tensor": (("_MakefxTracer.trace", "make_fx would trace a graph"),),
    "torch._functorch._aot_autograd.graph_compile": (("aot_stage2_compile", "AOTAutograd would compile a graph"),),
    "torch._inductor.graph": (("GraphLowering.compile_to_module", "Inductor would lower a graph"),),
    "torch._inductor.cpp_builder": (("CppBuilder.build", "a C++ kernel would be built"),),
    "torch._inductor.select_algorithm": (
        ("AlgorithmSelectorCache.autotune", "Inductor would autotune"),
        ("AlgorithmSelectorCache.benchmark_example_value", "Inductor would benchmark"),
    ),
    "torch._inductor.runtime.triton_heuristics": (
        ("CachingAutotuner.benchmark_all_configs", "a Triton kernel would be autotuned"),
    ),
    # Triton's compile() also serves cache hits (a primed kernel): only its cache-miss path, which
    # builds the kernel's IR, is a compile. Methods are gated on their class, so the compile a
    # JITFunction bound by `from ..compiler import compile` still reaches the gate.
    "triton.compiler.compiler": (
        ("ASTSource.make_ir", "a Triton kernel would be compiled"),
        ("IRSource.make_ir", "a Triton kernel would be compiled"),
    ),
    "triton.runtime.autotuner": (("Autotuner._bench", "a Triton autotuner would benchmark"),),
    # The benchmarker itself, wherever a name for it was bound (see no_compilation._rebind).
    "triton.testing": (
        ("do_bench", "a Triton kernel would be benchmarked"),
        ("do_bench_cudagraph", "a Triton kernel would be benchmarked"),
    ),
}

# Imports of Inductor's output code that the kernel runtime driver (inductor_runtime.py) provides,
# so a primed artifact serves without importing torch._inductor.
INDUCTOR_IMPORTS_THE_DRIVER_PROVIDES = (
    "from torch._inductor.hooks import run_intermediate_hooks",
    "from torch._inductor.utils import maybe_profile",
    "from torch._inductor.codegen.memory_planning import _align as align",
    "from torch._inductor.async_compile import AsyncCompile",
    "from torch._inductor.select_algorithm import extern_kernels",
    "from torch._inductor.runtime.runtime_utils import assert_tensor_metadata",  # torch 2.14 on
)


def torch_version() -> tuple[int, int]:
    import torch

    release = re.match(r"(\d+)\.(\d+)", str(torch.__version__))
    assert release is not None  # every torch version starts with major.minor
    return int(release.group(1)), int(release.group(2))


def where(name: str, version: tuple[int, int] | None = None) -> str:
    """Where torch `version` (default: the installed one) keeps the runtime name `name`."""
    version = version or torch_version()
    return _MOVED.get(version, {}).get(name, PRIVATE_NAMES[name])


def _missing(dotted: str, cause: BaseException | None = None) -> PrecompileError:
    import torch

    low, high = SUPPORTED
    return PrecompileError(
        f"torch {torch.__version__} has no {dotted}, which precompile needs; precompile supports torch "
        f"{low[0]}.{low[1]} to {high[0]}.{high[1]}: install one of those"
        + (f" ({type(cause).__name__}: {cause})" if cause is not None else "")
    )


def resolve(location: str) -> Any:
    """The object at "module" or "module:attribute.path", or PrecompileError naming what is missing."""
    module_name, _, attribute_path = location.partition(":")
    try:
        value = importlib.import_module(module_name)
    except ImportError as exc:
        raise _missing(module_name, exc) from None
    for part in filter(None, attribute_path.split(".")):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise _missing(f"{module_name}.{attribute_path}") from None
    return value


def __getattr__(name: str) -> Any:
    if name not in PRIVATE_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = resolve(where(name))
    globals()[name] = value  # resolved once per process
    return value


def missing_gates() -> list[str]:
    """The no_compilation() gates whose target this torch lacks, found without importing a module.

    Reads the gated modules' sources (never imports them: importing torch._inductor to check would
    cost the fast load path its second). Triton's gates count only where Triton is installed.
    """
    import importlib.util

    import torch

    missing = []
    for module_name, gates in NO_COMPILATION_GATES.items():
        root, _, rest = module_name.partition(".")
        if root == "torch":
            base = Path(torch.__file__).parent
        else:
            spec = importlib.util.find_spec(root)
            if spec is None or not spec.submodule_search_locations:
                continue  # not installed here: nothing of it can compile
            base = Path(next(iter(spec.submodule_search_locations)))
        source_file = base.joinpath(*rest.split(".")).with_suffix(".py")
        if not source_file.is_file():
            source_file = base.joinpath(*rest.split("."), "__init__.py")
        try:
            source = source_file.read_text(encoding="utf-8")
        except OSError:
            missing += [f"{module_name}.{dotted}" for dotted, _ in gates]
            continue
        for dotted, _ in gates:
            if not all(any(f"{kind} {part}{end}" in source for kind in ("class", "def") for end in "(:") for part in dotted.split(".")):
                missing.append(f"{module_name}.{dotted}")
    return missing
