"""What a global a pickle names means, judged by module and name alone (`classify`): data-only
reconstructors, the reviewed makeup of Dynamo's own opaque state, and the names that reach the
process, files, the network or code ("dangerous"). Torch-free: nothing here is imported or called.
"""
from __future__ import annotations

import _compat_pickle
import sys
from collections.abc import Callable

from precompile.artifact.pickle_model import Risk

# The data-only reconstructors. A callable is on this list when, applied to data (and to classes
# that are themselves imports of the same pickle, each judged on its own), it only builds a value:
# it executes no code given as data, imports nothing by a computed name, opens no file, process or
# socket, unpickles nothing, and looks up no attribute by a computed name. The tensor rebuilders
# take storages from the loader's persistent ids (torch.load reads them from its own zip) and set
# sizes, strides and flags; `_rebuild_from_type_v2` and copyreg's helpers call a class or function
# that the pickle imports, and that import is judged by itself. `_codecs.encode` is how protocol-2
# pickles spell bytes: it encodes a str (its codec lookup can only import the standard library's
# `encodings` package); the scan treats its result as bytes and scans them for a nested pickle.
# Everything else is "unknown" (listed for a reviewer; a finding in the opaque state unless on the
# reviewed `DYNAMO_STATE` list) or "dangerous" (named below).
DATA_ONLY = frozenset(
    [("builtins", name) for name in
     "bool bytearray bytes complex dict float frozenset int list object range set slice str tuple".split()]
    + [("collections", name) for name in ("OrderedDict", "Counter", "deque", "defaultdict")]
    + [("copyreg", name) for name in ("_reconstructor", "__newobj__", "__newobj_ex__")]
    + [("_codecs", "encode")]
    + [("datetime", name) for name in ("date", "datetime", "time", "timedelta", "timezone")]
    + [("decimal", "Decimal"), ("fractions", "Fraction"), ("uuid", "UUID")]
    + [("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath")]
    + [("torch._utils", name) for name in (
        "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
        "_rebuild_parameter_with_state", "_rebuild_meta_tensor_no_storage", "_rebuild_wrapper_subclass",
        "_rebuild_qtensor", "_rebuild_sparse_tensor", "_rebuild_nested_tensor",
        "_rebuild_device_tensor_from_cpu_tensor", "_rebuild_device_tensor_from_numpy")]
    + [("torch._tensor", "_rebuild_from_type_v2"), ("torch.nn.parameter", "Parameter"),
       ("torch.serialization", "_get_layout"), ("torch.storage", "UntypedStorage"),
       ("torch.storage", "TypedStorage"), ("torch", "Size"), ("torch", "device"), ("torch", "dtype")]
    + [("torch", f"{kind}Storage") for kind in (
        "Untyped", "Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool",
        "ComplexFloat", "ComplexDouble", "QUInt8", "QInt8", "QInt32", "QUInt4x2", "QUInt2x4")]
    + [("torch", name) for name in (
        "float32 float float64 double float16 half bfloat16 complex32 complex64 cfloat complex128 cdouble "
        "uint8 uint16 uint32 uint64 int8 int16 short int32 int int64 long bool quint8 qint8 qint32 quint4x2 "
        "float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz "
        "strided sparse_coo sparse_csr sparse_csc sparse_bsr sparse_bsc _mkldnn "
        "contiguous_format channels_last channels_last_3d preserve_format").split()]
)

MODULE = "<module>"
"""The name recorded for the import of a whole module."""

# What Dynamo's own opaque state is built from (torch 2.11-2.15: its package entries, guard trees and
# AOTAutograd's wrappers), reviewed: dataclasses, enums and named tuples whose reconstruction stores
# fields, guard builder methods referenced by name (never called while unpickling), and the
# containers torch uses. torch 2.15 adds the dispatch state a guard tree was built under
# (`LocalState`, rebuilt from two key-set integers and three flags by its `__setstate__`) and moves
# `_Missing` (a placeholder holding a reason string) to the package module. Not data-only in general,
# so only the opaque state (`load` unpickles it, with its subgraphs' code from python_code) allows
# them; anywhere else they stay "unknown".
DYNAMO_STATE = frozenset(
    [("torch._dynamo.package", name) for name in (
        "SerializedCode", "_DynamoCodeCacheEntry", "_GuardedCodeCacheEntry", "_Missing")]
    + [("torch._dynamo.guards", name) for name in (
        "GuardsState", "GuardsStatePickler", "GuardsStatePickler._unpickle_tensor", "ShapeCodeParts", "_Missing")]
    + [("torch._dynamo.output_graph", "OutputGraphGuardsState"), ("torch._guards", "Guard"), ("torch._guards", "GuardsSet"),
       ("torch._C._dynamo.guards", "GlobalStateGuard"),
       ("torch._C._dynamo.guards", "LocalState"), ("torch.fx.experimental.symbolic_shapes", "_ShapeGuardsHelper"),
       ("torch.utils._ordered_set", "OrderedSet"), ("torch.utils._traceback", "CapturedTraceback"),
       ("traceback", "FrameSummary"), ("traceback", "StackSummary"), ("torch", "Tensor"),
       ("torch._subclasses.functional_tensor", "FunctionalTensor")]
    + [("torch._functorch._aot_autograd.aot_autograd_result", name) for name in (
        "BundledAOTAutogradCacheArtifact", "BundledAOTAutogradResult", "BundledCompiledForward", "BundledCompiledBackward")]
    + [("torch._functorch._aot_autograd.schemas", name) for name in (
        "CacheableAOTConfig", "InputAliasInfo", "MutationType", "OutputAliasInfo", "OutputType", "PlainTensorMeta",
        "ViewAndMutationMeta", "SubclassCreationMeta", "MemoryFormatMeta", "TensorAlias")]
    + [("torch._inductor.cudagraph_utils", "BoxedDeviceIndex"), ("torch._inductor.decomposition", "select_decomp_table"),
       ("torch._inductor.metrics", "CachedMetricsDeltas"), ("torch._inductor.output_code", "CompiledFxGraph"),
       ("torch._inductor.triton_bundler", "TritonBundle"), ("torch._inductor.utils", "BoxedBool"),
       ("torch.nn.modules.module", MODULE)]
)


def _torch_module(module: str) -> bool:
    """A module of torch itself, which guards reference by name (a whole-module import, never a
    `__main__` that runs a program when imported)."""
    return (module == "torch" or module.startswith("torch.")) and "__main__" not in module.split(".")


CAPTURED_FIELDS = ("FN_MODULE", "FRAMES", "INLINED_SOURCES")
"""The metadata literals that name the modules whose code a Dynamo artifact captured."""


def captured_modules(values: dict) -> frozenset[str]:
    """The modules whose code the artifact captured (`values`: its metadata literals, CAPTURED_FIELDS),
    the standard library excepted."""
    listed = [values.get("FN_MODULE")] + [entry.get("module") for name in CAPTURED_FIELDS[1:]
                                          for entry in _dicts(values.get(name))]
    return frozenset(module for module in listed
                     if isinstance(module, str) and module.split(".")[0] not in sys.stdlib_module_names)


def _dicts(value) -> list[dict]:
    return [entry for entry in value if isinstance(entry, dict)] if isinstance(value, (list, tuple)) else []


def dynamo_state_reviewed(captured_modules: frozenset[str]) -> Callable[[str, str], bool]:
    """Whether a name off the data-only list is allowed in a Dynamo artifact's opaque state: on the
    reviewed list (`DYNAMO_STATE`, plus the families it names by pattern: torch's own modules
    referenced whole, guard builder methods, guard sources, AOTAutograd's runtime wrappers), a member
    of a module whose code the artifact captured and load checks (its metadata's FN_MODULE, FRAMES
    and INLINED_SOURCES, the standard library excepted: its classes are no model's own), or a class
    of the package such a module belongs to (a transformers model's guards compare its config's and
    outputs' classes, `transformers.models.llama.configuration_llama.LlamaConfig`, whose code Dynamo
    did not inline). Those fields are literals whoever wrote python_code chose, so naming a module
    there never reviews a name the policy calls dangerous, and of torch's own modules only their
    classes (what guards compare types with: `Linear`), never their functions
    (`torch._inductor.cpp_builder.run_compile_cmd` runs a command), nor the rest of torch's package."""
    packages = frozenset(module.split(".")[0] for module in captured_modules if not _torch_module(module))

    def reviewed(module: str, name: str) -> bool:
        if (module, name) in DYNAMO_STATE or name == MODULE and _torch_module(module):
            return True
        if module in captured_modules:
            return classify(module, name) != "dangerous" and (not _torch_module(module) or name[:1].isupper())
        if module.split(".")[0] in packages and "__main__" not in module.split("."):
            return classify(module, name) != "dangerous" and name[:1].isupper() and "." not in name
        head, _, rest = name.partition(".")
        return ((module, head) == ("torch._dynamo.guards", "GuardBuilder") and rest.isupper()
                or module == "torch._dynamo.source" and (name.endswith("Source") or name == "TensorProperty")
                or module == "torch._functorch._aot_autograd.runtime_wrappers" and name.endswith("Wrapper"))

    return reviewed


# Modules whose every member (directly, or as an alias inside an attribute chain: `tempfile._os`) can
# reach the process, the file system, the network, the import system, an interpreter or a pager, grouped
# by what they reach. The rule is by module, not by the names known to be abused: every module whose
# code runs processes or does I/O on its caller's behalf is in, private helpers included (picklescan's
# and fickling's deny lists name `uuid._get_command_stdout`, `_osx_support._read_output`,
# `pydoc.pipepager`, `ensurepip._run_pip`, `imaplib.IMAP4_stream`; each of their modules is here).
DANGEROUS_MODULES = frozenset(
    # processes and the interpreter itself
    "os posix nt subprocess _posixsubprocess commands pty pexpect multiprocessing threading _thread signal _signal "
    "atexit sys platform sysconfig site gc ctypes _ctypes cffi mmap "
    # evaluating, compiling or importing code
    "builtins __builtin__ __builtins__ code codeop compileall py_compile runpy importlib imp _imp zipimport pkgutil "
    "compile eval exec _frozen_importlib _frozen_importlib_external types inspect operator _operator functools tokenize "
    "timeit cProfile profile pdb bdb trace doctest unittest test lib2to3 "
    # unpickling
    "pickle _pickle cPickle marshal dill cloudpickle joblib shelve dbm yaml "
    # files, archives and databases
    "io _io shutil tempfile glob fileinput linecache filecmp difflib tarfile zipfile sqlite3 _sqlite3 logging syslog "
    # the network
    "socket ssl select selectors socketserver xmlrpc asyncio aiohttp urllib urllib2 http httplib ftplib smtplib "
    "imaplib poplib nntplib telnetlib requests webbrowser "
    # installers, pagers and tools that shell out
    "ensurepip pip venv distutils pydoc idlelib uuid _osx_support _aix_support _pyrepl "
    "numpy.testing numpy.f2py numpy.distutils".split()
)
# torch's own doors to code: compiled or scripted modules, packages, hubs, loaders, code caches, configs
# loaded from pickles, profilers that run scripts.
DANGEROUS_TORCH = (
    "torch.jit", "torch._C._jit", "torch.package", "torch.hub", "torch.serialization", "torch.storage._load",
    "torch.utils.cpp_extension", "torch._inductor.codecache", "torch._inductor.cpp_builder", "torch.multiprocessing", "torch.fx.graph_module",
    "torch._dynamo.eval_frame", "torch.compile", "torch.compiler", "torch.ops", "torch._ops", "torch.library",
    "torch.utils._config_module", "torch.utils.bottleneck", "torch.utils.collect_env",
    "torch.utils.data.datapipes.utils.decoder", "torch.distributed.elastic.rendezvous.api",
    "torch._dynamo.guards.GuardBuilder.get", "torch.fx.experimental.symbolic_shapes.ShapeEnv.evaluate_guards_expression",
)
# Names that unpickle, evaluate, import or run, in whichever module they live.
DANGEROUS_NAMES = frozenset(
    "eval exec execfile compile system popen spawn load loads load_module import_module __import__ "
    "_load_from_bytes reduce_graph_module reduce_package_graph_module reduce_deploy_graph_module "
    "run call check_call check_output Popen getattr setattr delattr open apply breakpoint".split()
)
# pathlib's concrete paths are bound to the file system: any attribute reached on one (`Path.write_text`,
# `Path.unlink`, ...) reads, writes or deletes files. Building one is not; the pure paths are data.
_FILE_SYSTEM_PATHS = frozenset({"Path", "PosixPath", "WindowsPath"})
# Callables judged by how each reference to them is used rather than by their import: getattr on an
# import with a literal attribute name is the import of a dotted name, and Dynamo's module reducer
# applied to a literal is the import of that module; each is recorded and judged as that import.
# Any other use (a computed operand, passed along as data, kept past the end) is dangerous.
GETATTR = ("builtins", "getattr")
PARTIAL = ("functools", "partial")
"""partial(import, *args) only binds arguments to a callable the pickle imports, which is judged by itself;
recorded as allowed on that use alone (functools is otherwise dangerous: reduce calls, wraps, ...)."""
STORED_CALLABLES = frozenset({("torch.fx.graph_module", "reduce_graph_module")})
"""Dangerous callables torch's own pickles hold as a value (a Mega-Cache's SerializedGraphModule.fn,
see `formats.mega_cache_policy.STORED`): their call while unpickling is recorded as a finding of its own."""
MODULE_IMPORTERS = frozenset({("torch._dynamo.guards", "GuardsStatePickler._unpickle_python_module")})


def resolve(module: str, name: str, protocol: int) -> tuple[str, str]:
    """The name Unpickler.find_class would import: below protocol 3 it maps Python 2 names
    (`commands.check_output` is `subprocess.check_output`, `__builtin__` is `builtins`)."""
    if protocol < 3:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            return _compat_pickle.NAME_MAPPING[(module, name)]
        if module in _compat_pickle.IMPORT_MAPPING:
            return _compat_pickle.IMPORT_MAPPING[module], name
    return module, name


def classify(module: str, name: str) -> Risk:
    """allowed (on the data-only list), dangerous (named as able to execute, import, open or
    unpickle, reached directly or through a dotted attribute chain) or unknown."""
    if (module, name) in DATA_ONLY:
        return "allowed"
    parts = name.split(".")
    if any(part.startswith("__") and part.endswith("__") and len(part) > 4 for part in parts):
        return "dangerous"  # __globals__, __builtins__, __subclasses__, __import__: escapes
    modules = module.split(".")
    dotted = {".".join(modules[: i + 1]) for i in range(len(modules))}
    if dotted & DANGEROUS_MODULES or any(part.lstrip("_") in DANGEROUS_MODULES for part in parts[:-1]):
        return "dangerous"
    full = f"{module}.{name}"
    if any(full == prefix or full.startswith(prefix + ".") for prefix in DANGEROUS_TORCH):
        return "dangerous"
    if parts[-1] in DANGEROUS_NAMES:
        return "dangerous"
    if module == "pathlib" and len(parts) > 1 and parts[0] in _FILE_SYSTEM_PATHS:
        return "dangerous"
    return "unknown"
