"""Static scan of a pickle: what it would import and call, without unpickling it.

`pickle_ops.read_ops` decodes opcodes and their arguments exactly as the C unpickler reads them; on
top of it `_Machine` runs the pickle machine symbolically, opcode by opcode (by the dispatch table
`_DISPATCH`, as pickle.py does): the same stack, the same mark stack, the same memo. Values are
literals (exactly as the string, bytes and number opcodes push them), containers of values, imported
objects (`_Global`) or results nothing static can know (`_Computed`: a call, a persistent id, an
out-of-band buffer). Nothing is ever called or imported. `is_pickle` tells a pickle of any protocol
by content; `evaluate` gives the value a pickle of plain data holds (formats/pickle_values).

Sound by construction: an import is *resolved* only when its module and name are `str` values that
a string opcode pushed (directly or through the memo); any other operand of STACK_GLOBAL, an EXT
registry code, a call of something that is not an import, and a BUILD or APPEND/SETITEM that
mutates an imported object itself are *unresolved* findings, risk "dangerous". Bytes and strings
that hold a pickle (and the bytes `_codecs.encode` builds from a string) are scanned too, to a
bounded depth. Malformed input ends the run where the unpickler itself would stop, with `problem`
set; every import seen up to there is kept, since the unpickler would have performed them. A run
that stops, for that reason or at one of the scan's limits, is a finding wherever the pickle sits.
"""
from __future__ import annotations

import _compat_pickle
import hashlib
import re
import warnings
from collections.abc import Callable

from precompile.inspect.model import Blob, Field, PickleImport, PickleScan, Risk
from precompile.inspect.pickle_ops import OPCODE_BYTES, read_ops

MAX_PICKLE_SIZE = 256 * 1024 * 1024
HIGHEST_PROTOCOL = 5
MAX_OPS = 2_000_000
MAX_FIELDS = 200
MAX_NESTED_DEPTH = 3
MAX_NESTED_BYTES = 64 * 1024 * 1024
"""Bytes scanned as candidate nested pickles, over one top-level scan and all its depths."""
MAX_NESTED_SCANS = 10_000
"""Candidate nested pickles scanned, likewise; past either limit the scan ends with a problem."""

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

# What Dynamo's own opaque state is built from (torch 2.11-2.14: its package entries, guard trees and
# AOTAutograd's wrappers), reviewed: dataclasses, enums and named tuples whose reconstruction stores
# fields, guard builder methods referenced by name (never called while unpickling), and the
# containers torch uses. Not data-only in general, so only the opaque state (`load` unpickles it,
# with its subgraphs' code from python_code) allows them; anywhere else they stay "unknown".
DYNAMO_STATE = frozenset(
    [("torch._dynamo.package", name) for name in ("SerializedCode", "_DynamoCodeCacheEntry", "_GuardedCodeCacheEntry")]
    + [("torch._dynamo.guards", name) for name in (
        "GuardsState", "GuardsStatePickler", "GuardsStatePickler._unpickle_tensor", "ShapeCodeParts", "_Missing")]
    + [("torch._dynamo.output_graph", "OutputGraphGuardsState"), ("torch._guards", "Guard"), ("torch._guards", "GuardsSet"),
       ("torch._C._dynamo.guards", "GlobalStateGuard"), ("torch.fx.experimental.symbolic_shapes", "_ShapeGuardsHelper"),
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


def dynamo_state_reviewed(captured_modules: frozenset[str]) -> Callable[[str, str], bool]:
    """Whether a name off the data-only list is allowed in a Dynamo artifact's opaque state: on the
    reviewed list (`DYNAMO_STATE`, plus the families it names by pattern: torch's own modules
    referenced whole, guard builder methods, guard sources, AOTAutograd's runtime wrappers), or a member of a module whose code the artifact
    captured and load checks (its metadata's FN_MODULE, FRAMES and INLINED_SOURCES, the standard
    library excepted: its classes are no model's own)."""
    def reviewed(module: str, name: str) -> bool:
        if (module, name) in DYNAMO_STATE or module in captured_modules:
            return True
        head, _, rest = name.partition(".")
        return (name == MODULE and _torch_module(module)
                or (module, head) == ("torch._dynamo.guards", "GuardBuilder") and rest.isupper()
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
    "torch.utils.cpp_extension", "torch._inductor.codecache", "torch.multiprocessing", "torch.fx.graph_module",
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
MODULE_IMPORTERS = frozenset({("torch._dynamo.guards", "GuardsStatePickler._unpickle_python_module")})
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


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


class _Global:
    """An object an import would produce; `resolved` is False when its names were not literals."""

    __slots__ = ("module", "name", "resolved", "judged_by_use")

    def __init__(self, module: str, name: str, resolved: bool = True) -> None:
        self.module, self.name, self.resolved = module, name, resolved
        self.judged_by_use = resolved and ((module, name) in (GETATTR, PARTIAL) or (module, name) in MODULE_IMPORTERS)


class _Computed:
    """A value the scan cannot know without running code: a call's result, a persistent id, a buffer."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what


class _Unhashable:
    """A dict key standing for a value that is not a plain literal (only used for summaries)."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what


class _Stop(Exception):
    """The unpickler itself would raise here: the run ends with this message as its problem."""


class _Limit(_Stop):
    """The scan's own bound is reached where the unpickler would go on: nothing past it is vouched for."""


_SCALARS = (type(None), bool, int, float, str)
_LITERAL_KEYS = (type(None), bool, int, float, str, bytes)
_STRING_OPS = frozenset("STRING BINSTRING SHORT_BINSTRING UNICODE BINUNICODE SHORT_BINUNICODE BINUNICODE8".split())
_BYTES_OPS = frozenset("BINBYTES SHORT_BINBYTES BINBYTES8 BYTEARRAY8".split())
_NUMBER_OPS = frozenset("INT BININT BININT1 BININT2 LONG LONG1 LONG4 FLOAT BINFLOAT".split())
_LATIN1 = frozenset({"latin1", "latin-1", "latin_1", "iso-8859-1", "iso8859-1", "l1"})


def summarize(value) -> str:
    if isinstance(value, _Computed):
        return value.what
    if isinstance(value, _Global):
        return f"{value.module}.{value.name}"
    if isinstance(value, _Unhashable):
        return value.what
    if isinstance(value, str):
        return repr(value) if len(value) <= 80 else f"str ({len(value)} chars)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"int ({value.bit_length()} bits)"  # repr of a huge int is refused (and quadratic)
    if isinstance(value, _SCALARS):
        return repr(value)
    if isinstance(value, (bytes, bytearray)):
        return f"bytes ({len(value)} bytes, sha256 {hashlib.sha256(value).hexdigest()[:16]})"
    if isinstance(value, dict):
        return f"dict ({len(value)} keys)"
    if isinstance(value, list):
        return f"list ({len(value)} items)"
    if isinstance(value, tuple):
        return f"tuple ({len(value)} items)"
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__} ({len(value)} items)"
    return type(value).__name__


def _dict_key(value):
    return value if isinstance(value, _LITERAL_KEYS) else _Unhashable(summarize(value))


def _key_text(value) -> str:
    return value if isinstance(value, str) else summarize(value)


def _looks_like_pickle(data: bytes) -> bool:
    """A protocol 2+ header, or a protocol 0/1 stream that starts like one (an opcode byte)."""
    if len(data) < 4:
        return False
    if data[0] == 0x80:
        return data[1] <= 5
    return data[0] in OPCODE_BYTES


class _Shared:
    """What one top-level scan and all its nested scans share: the nested-pickle budget, and which
    names off the data-only list are reviewed for where this pickle sits (see `scan_pickle`)."""

    def __init__(self, reviewed: Callable[[str, str], bool] | None = None) -> None:
        self.nested_bytes = MAX_NESTED_BYTES
        self.nested_scans = MAX_NESTED_SCANS
        self.reviewed = reviewed


class _Machine:
    def __init__(self, data: bytes, budget: _Shared, depth: int, within: str | None) -> None:
        self.data = data
        self.budget = budget
        self.depth = depth
        self.within = within
        self.stack: list = []
        self.metastack: list[list] = []
        self.memo: dict = {}
        self.protocol = 0
        self.seen_proto = False
        self.imports: dict[tuple, list] = {}
        """(module, name, risk, unresolved, within) -> [count, first offset, opcode]."""
        self.refs: dict[tuple[str, str], list[int]] = {}
        """Offsets of each reference to a callable judged by use (GETATTR, PARTIAL, MODULE_IMPORTERS)."""
        self.safe_uses: dict[tuple[str, str], int] = {}
        self.nested = 0
        self.unscanned: list[int] = []
        """Offsets of values that may hold a pickle but were past the nested-scan limits."""
        self.reached_stop = False
        self.incomplete = False
        """True when the run ended at one of the scan's limits, not where the unpickler would stop."""

    # ---- findings ------------------------------------------------------------------------------

    def record(self, module: str, name: str, risk: Risk, offset: int, opcode: str, unresolved: str | None = None,
               within: str | None = None, count: int = 1) -> None:
        key = (module, name, risk, unresolved, within if within is not None else self.within)
        entry = self.imports.get(key)
        if entry is None:
            self.imports[key] = [count, offset, opcode]
        else:
            entry[0] += count

    def unresolved(self, what: str, offset: int, opcode: str, module: str = "?", name: str = "?") -> None:
        self.record(module, name, "dangerous", offset, opcode, unresolved=what)

    # ---- stack -----------------------------------------------------------------------------------

    def pop(self):
        if not self.stack:
            raise _Stop("stack underflow")
        return self.stack.pop()

    def top(self):
        if not self.stack:
            raise _Stop("stack underflow")
        return self.stack[-1]

    def pop_mark(self) -> list:
        if not self.metastack:
            raise _Stop("MARK missing")
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def push(self, value, offset: int) -> None:
        self.stack.append(value)

    def copy(self, value, offset: int) -> None:
        """Push a second reference (GET, DUP): each reference to a callable judged by use counts."""
        if isinstance(value, _Global) and value.judged_by_use:
            self.refs.setdefault((value.module, value.name), []).append(offset)
        self.stack.append(value)

    # ---- the run ---------------------------------------------------------------------------------

    def run(self):
        """The value the pickle evaluates to (None when it never reached STOP) and the problem, if any."""
        result, problem = None, None
        try:
            for count, (name, arg, pos) in enumerate(read_ops(self.data)):
                if count >= MAX_OPS:
                    raise _Limit(f"more than {MAX_OPS} opcodes: not scanned past offset {pos}")
                if name == "STOP":
                    result = self.pop()
                    self.reached_stop = True
                    break
                self.step(name, arg, pos)
        except _Stop as exc:
            problem = f"scan stopped: {exc}"
            self.incomplete = isinstance(exc, _Limit)
        except RecursionError:
            problem = "scan stopped: nesting too deep"
            self.incomplete = True
        except Exception as exc:  # read_ops on malformed bytes: ValueError, EOFError, UnicodeDecodeError, ...
            problem = f"not a well-formed pickle: {type(exc).__name__}: {exc}"
        if self.unscanned and problem is None:
            problem = (f"{len(self.unscanned)} values that may hold a pickle (the first at offset {self.unscanned[0]}) "
                       f"are past the nested-scan limits ({MAX_NESTED_SCANS} pickles, {MAX_NESTED_BYTES} bytes) and were not scanned")
        for (module, name), offsets in sorted(self.refs.items()):
            unsafe = len(offsets) - self.safe_uses.get((module, name), 0)
            if unsafe > 0:
                self.record(module, name, "dangerous", offsets[0], "GLOBAL", count=unsafe,
                            unresolved=f"{name} is used other than on literal operands naming what it reaches")
        return result, problem

    def step(self, name: str, arg, pos: int) -> None:
        """Run one opcode, by the dispatch table (`_DISPATCH`: opcode name -> the method running it)."""
        handler = _DISPATCH.get(name)
        if handler is None:
            raise _Stop(f"unsupported opcode {name} at offset {pos}")
        handler(self, name, arg, pos)

    # ---- opcodes: each method runs the opcodes `_DISPATCH` maps to it, as the unpickler does -------

    def proto(self, name: str, arg, pos: int) -> None:
        if arg > HIGHEST_PROTOCOL:
            raise _Stop(f"unsupported pickle protocol: {arg}")
        self.protocol, self.seen_proto = arg, True

    def frame(self, name: str, arg, pos: int) -> None:
        """FRAME only announces the next bytes' length; the opcodes inside are read one by one."""

    def mark(self, name: str, arg, pos: int) -> None:
        self.metastack.append(self.stack)
        self.stack = []

    def string(self, name: str, arg, pos: int) -> None:
        self.push(arg, pos)
        self.nested_pickle(arg, pos, name)

    def bytes_(self, name: str, arg, pos: int) -> None:
        self.push(bytearray(arg) if name == "BYTEARRAY8" else arg, pos)
        self.nested_pickle(arg, pos, name)

    def literal(self, name: str, arg, pos: int) -> None:
        """A number opcode pushes its argument; NONE, NEWTRUE, NEWFALSE their constant."""
        self.push(_CONSTANTS.get(name, arg), pos)

    def empty(self, name: str, arg, pos: int) -> None:
        self.push(_EMPTY[name](), pos)

    def put(self, name: str, arg, pos: int) -> None:
        if arg < 0:
            raise _Stop("negative PUT argument")
        self.memo[arg] = self.top()

    def memoize(self, name: str, arg, pos: int) -> None:
        self.memo[len(self.memo)] = self.top()

    def get(self, name: str, arg, pos: int) -> None:
        if arg not in self.memo:
            raise _Stop(f"memo value {arg} not found (opcode {name} at offset {pos})")
        self.copy(self.memo[arg], pos)

    def dup(self, name: str, arg, pos: int) -> None:
        self.copy(self.top(), pos)

    def pop_(self, name: str, arg, pos: int) -> None:
        """POP drops the top item, or the topmost mark when the stack above it is empty."""
        if self.stack:
            self.stack.pop()
        else:
            self.pop_mark()

    def pop_mark_(self, name: str, arg, pos: int) -> None:
        self.pop_mark()

    def tuple_(self, name: str, arg, pos: int) -> None:
        self.push(tuple(self.pop_mark()), pos)

    def small_tuple(self, name: str, arg, pos: int) -> None:
        n = int(name[-1])
        if len(self.stack) < n:
            raise _Stop("stack underflow")
        items = tuple(self.stack[-n:])
        del self.stack[-n:]
        self.push(items, pos)

    def list_(self, name: str, arg, pos: int) -> None:
        self.push(self.pop_mark(), pos)

    def dict_(self, name: str, arg, pos: int) -> None:
        items = self.pop_mark()
        if len(items) % 2:
            raise _Stop("DICT with an odd number of items")
        self.push({_dict_key(items[i]): items[i + 1] for i in range(0, len(items), 2)}, pos)

    def frozenset_(self, name: str, arg, pos: int) -> None:
        self.push(frozenset(_dict_key(item) for item in self.pop_mark()), pos)

    def global_(self, name: str, arg, pos: int) -> None:
        """GLOBAL imports; INST imports and calls the import on the items above the mark."""
        module, _, attr = str(arg).partition(" ")
        value = self.import_(module, attr, pos, name)
        if name == "INST":
            value = self.call(value, tuple(self.pop_mark()), pos, name)
        self.push(value, pos)

    def stack_global(self, name: str, arg, pos: int) -> None:
        attr = self.pop()
        module = self.pop()
        if type(module) is str and type(attr) is str:
            self.push(self.import_(module, attr, pos, name), pos)
            return
        shown_module = module if type(module) is str else f"<{summarize(module)}>"
        shown_name = attr if type(attr) is str else f"<{summarize(attr)}>"
        self.unresolved("STACK_GLOBAL operands are not strings pushed by string opcodes", pos, name, shown_module, shown_name)
        self.push(_Global(shown_module, shown_name, resolved=False), pos)

    def ext(self, name: str, arg, pos: int) -> None:
        self.unresolved(f"extension code {arg} names its import in the copyreg registry", pos, name,
                        "<copyreg extension>", str(arg))
        self.push(_Global("<copyreg extension>", str(arg), resolved=False), pos)

    def reduce(self, name: str, arg, pos: int) -> None:
        """REDUCE and NEWOBJ call the callable below the arguments; NEWOBJ_EX drops the keywords first."""
        if name == "NEWOBJ_EX":
            self.pop()
        args = self.pop()
        func = self.pop()
        self.push(self.call(func, args, pos, name), pos)

    def obj(self, name: str, arg, pos: int) -> None:
        items = self.pop_mark()
        if not items:
            raise _Stop("OBJ without a class")
        self.push(self.call(items[0], tuple(items[1:]), pos, name), pos)

    def build(self, name: str, arg, pos: int) -> None:
        self.pop()
        target = self.top()
        if isinstance(target, _Global) and target.resolved:
            self.unresolved(f"BUILD sets state on the imported object {target.module}.{target.name} itself",
                            pos, name, target.module, target.name)

    def persistent_id(self, name: str, arg, pos: int) -> None:
        what = repr(arg) if name == "PERSID" else summarize(self.pop())
        self.push(_Computed(f"persistent id {what}"), pos)

    def next_buffer(self, name: str, arg, pos: int) -> None:
        self.push(_Computed("out-of-band buffer"), pos)

    def readonly_buffer(self, name: str, arg, pos: int) -> None:
        self.top()  # makes the buffer on top read-only, in place

    def import_(self, module: str, name: str, pos: int, opcode: str) -> _Global:
        module, name = resolve(module, name, self.protocol)
        return self.reach(_Global(module, name), pos, opcode)

    def reach(self, value: _Global, pos: int, opcode: str) -> _Global:
        """Record an import, or a reference to a callable judged by use (see call() and run())."""
        if value.judged_by_use:
            self.refs.setdefault((value.module, value.name), []).append(pos)
        else:
            self.record(value.module, value.name, self.judge(value.module, value.name), pos, opcode)
        return value

    def judge(self, module: str, name: str) -> Risk:
        """classify(), with an "unknown" name the scan's caller reviewed for this pickle counted as allowed."""
        risk = classify(module, name)
        reviewed = self.budget.reviewed
        return "allowed" if risk == "unknown" and reviewed is not None and reviewed(module, name) else risk

    def call(self, func, args, pos: int, opcode: str):
        if not isinstance(func, (_Global, _Computed)):
            raise _Stop(f"{opcode} at offset {pos} calls {summarize(func)}, which is not callable")
        if isinstance(func, _Computed):
            self.unresolved(f"{opcode} calls a value that is not an import ({summarize(func)})", pos, opcode,
                            "<computed>", summarize(func))
            return _Computed(f"{summarize(func)}(...)")
        if not func.resolved:
            return _Computed(f"{func.module}.{func.name}(...)")
        if func.judged_by_use and opcode == "REDUCE" and isinstance(args, tuple):
            used = self.safe_use(func, args, pos)
            if used is not None:
                return used
        if (func.module, func.name) == ("_codecs", "encode") and isinstance(args, tuple) and args and type(args[0]) is str:
            return self.encoded(args, pos)
        if (func.module, func.name) == ("builtins", "bytes") and args == ():
            return b""  # protocol 2's spelling of empty bytes
        return _Computed(f"{func.module}.{func.name}(...)")

    def safe_use(self, func: _Global, args: tuple, pos: int) -> _Global | _Computed | None:
        """A REDUCE of a callable judged by use in one of its safe shapes (getattr of an import by a
        literal name, importing a module by a literal name, partial of an import), or None."""
        key = (func.module, func.name)
        if key == GETATTR and len(args) == 2:
            owner, attr = args
            if isinstance(owner, _Global) and owner.resolved and type(attr) is str and _IDENT.match(attr):
                # getattr(imported object, "literal") is the import of a dotted name: judged as one
                self.safe_uses[key] = self.safe_uses.get(key, 0) + 1
                name = f"{owner.name}.{attr}" if owner.name != MODULE else attr
                return self.reach(_Global(owner.module, name), pos, "REDUCE getattr")
        elif key in MODULE_IMPORTERS and len(args) == 1 and type(args[0]) is str and _IDENT.match(args[0]):
            self.safe_uses[key] = self.safe_uses.get(key, 0) + 1
            return self.reach(_Global(args[0], MODULE), pos, f"REDUCE {func.name}")
        elif key == PARTIAL and args and isinstance(args[0], _Global) and args[0].resolved:
            self.safe_uses[key] = self.safe_uses.get(key, 0) + 1
            self.record(*PARTIAL, "allowed", pos, "REDUCE partial")
            return _Computed(f"functools.partial({args[0].module}.{args[0].name}, ...)")
        return None

    def encoded(self, args: tuple, pos: int) -> bytes | _Computed:
        """_codecs.encode(text, encoding), protocol 2's spelling of bytes: the bytes (scanned as a
        nested pickle too) where the encoding is one of the few it uses, else a computed value."""
        encoding = args[1] if len(args) > 1 else "utf-8"
        if type(encoding) is str and encoding.lower() in _LATIN1 | {"utf-8", "utf8", "ascii"}:
            try:
                data = args[0].encode(encoding)
            except (UnicodeEncodeError, LookupError):
                return _Computed("_codecs.encode(...)")
            self.nested_pickle(data, pos, "_codecs.encode")
            return data
        return _Computed("_codecs.encode(...)")

    def mutate(self, name: str, arg, pos: int) -> None:
        """APPEND(S), SETITEM(S), ADDITEMS: fill the container below; mutating an import itself is a finding."""
        if name == "APPEND":
            items = [self.pop()]
        elif name == "SETITEM":
            value = self.pop()
            items = [self.pop(), value]
        else:
            items = self.pop_mark()
        target = self.top()
        if isinstance(target, _Global):
            if target.resolved:
                self.unresolved(f"{name} mutates the imported object {target.module}.{target.name} itself", pos, name,
                                target.module, target.name)
        elif name in ("APPEND", "APPENDS") and isinstance(target, list):
            target.extend(items)
        elif name in ("SETITEM", "SETITEMS") and isinstance(target, dict):
            if len(items) % 2:
                raise _Stop("SETITEMS with an odd number of items")
            for i in range(0, len(items), 2):
                target[_dict_key(items[i])] = items[i + 1]
        elif name == "ADDITEMS" and isinstance(target, set):
            target.update(_dict_key(item) for item in items)

    def nested_pickle(self, value, pos: int, opcode: str) -> None:
        """Scan a bytes or str literal that holds a pickle, and keep what it would import."""
        if self.depth >= MAX_NESTED_DEPTH or len(value) < 4:
            return
        if isinstance(value, str):
            try:
                value = value.encode("latin-1")
            except UnicodeEncodeError:
                return  # a pickle is bytes; a str outside latin-1 never encodes to one with _codecs.encode's spelling
        if not _looks_like_pickle(value):
            return
        if len(value) > self.budget.nested_bytes or self.budget.nested_scans <= 0:
            self.unscanned.append(pos)  # cannot vouch for it: run() turns this into the scan's problem
            return
        self.budget.nested_bytes -= len(value)
        self.budget.nested_scans -= 1
        where = f"pickle inside the {opcode} at offset {pos}"
        within = f"{self.within} > {where}" if self.within else where
        inner = _Machine(bytes(value), self.budget, self.depth + 1, within)
        inner.run()
        if inner.unscanned or inner.incomplete:
            self.unscanned.append(pos)
        found = {key: entry for key, entry in inner.imports.items()}
        framed = value[0] == 0x80
        keep = inner.reached_stop or (framed and found) or any(key[2] == "dangerous" for key in found)
        if not keep:
            return
        self.nested += 1 + inner.nested
        for (module, name, risk, unresolved, inner_within), (count, offset, op) in found.items():
            if not framed and not inner.reached_stop and risk != "dangerous":
                continue
            if not (framed or _IDENT.match(module) or unresolved):
                continue  # a protocol 0 lookalike naming no importable module: the unpickler would fail there
            self.record(module, name, risk, offset, op, unresolved, within=inner_within, count=count)


_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_EMPTY = {"EMPTY_DICT": dict, "EMPTY_LIST": list, "EMPTY_TUPLE": tuple, "EMPTY_SET": set}
_DISPATCH: dict[str, Callable[[_Machine, str, object, int], None]] = {
    "PROTO": _Machine.proto, "FRAME": _Machine.frame, "MARK": _Machine.mark,
    **dict.fromkeys(_STRING_OPS, _Machine.string), **dict.fromkeys(_BYTES_OPS, _Machine.bytes_),
    **dict.fromkeys(_NUMBER_OPS | _CONSTANTS.keys(), _Machine.literal), **dict.fromkeys(_EMPTY, _Machine.empty),
    **dict.fromkeys(("PUT", "BINPUT", "LONG_BINPUT"), _Machine.put), "MEMOIZE": _Machine.memoize,
    **dict.fromkeys(("GET", "BINGET", "LONG_BINGET"), _Machine.get), "DUP": _Machine.dup,
    "POP": _Machine.pop_, "POP_MARK": _Machine.pop_mark_,
    "TUPLE": _Machine.tuple_, **dict.fromkeys(("TUPLE1", "TUPLE2", "TUPLE3"), _Machine.small_tuple),
    "LIST": _Machine.list_, "DICT": _Machine.dict_, "FROZENSET": _Machine.frozenset_,
    **dict.fromkeys(("APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS"), _Machine.mutate),
    **dict.fromkeys(("GLOBAL", "INST"), _Machine.global_), "STACK_GLOBAL": _Machine.stack_global,
    **dict.fromkeys(("EXT1", "EXT2", "EXT4"), _Machine.ext),
    **dict.fromkeys(("REDUCE", "NEWOBJ", "NEWOBJ_EX"), _Machine.reduce), "OBJ": _Machine.obj, "BUILD": _Machine.build,
    **dict.fromkeys(("PERSID", "BINPERSID"), _Machine.persistent_id),
    "NEXT_BUFFER": _Machine.next_buffer, "READONLY_BUFFER": _Machine.readonly_buffer,
}
"""Every opcode of protocols 0-5 but STOP (which `run` handles), as pickle.py's `dispatch` table maps them."""


def is_pickle(data: bytes) -> bool:
    """Whether an unpickler given `data` would act on it, by content alone: a protocol 2-5 header, or a
    protocol 0/1 opcode stream (read as the C unpickler reads it) that imports or calls something
    before it ends or breaks (what the unpickler did up to a break stays done), or that is past the
    scan's limits. A protocol 0/1 stream of plain data is not one: it can do nothing, and text often
    reads as one (`G['torch']._dynamo` is a float). Every container (Mega-Cache entries, bundle files,
    bare files, python_code literals) sniffs its content with this."""
    if len(data) >= 2 and data[0] == 0x80:
        return data[1] <= HIGHEST_PROTOCOL
    if not data or data[0] not in OPCODE_BYTES or len(data) > MAX_PICKLE_SIZE:
        return False
    machine = _Machine(bytes(data), _Shared(), MAX_NESTED_DEPTH, None)  # at the depth limit: nothing nested is scanned
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        machine.run()
    return machine.incomplete or any(unresolved or _importable(module) for module, _, _, unresolved, _ in machine.imports)


def _importable(module: str) -> bool:
    return all(part.isidentifier() for part in module.split("."))


def evaluate(data: bytes) -> tuple[object, str | None]:
    """What a pickle evaluates to, by the same machine (literals and containers as they are; imports,
    calls and persistent ids as placeholders that `summarize` names), and the problem that stopped
    it, if any. For reading values only: nested pickles are not scanned, nothing is judged."""
    machine = _Machine(bytes(data), _Shared(), MAX_NESTED_DEPTH, None)  # at the depth limit: nothing nested is scanned
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return machine.run()


def scan_pickle(data: bytes, *, member: str, reviewed: Callable[[str, str], bool] | None = None) -> PickleScan:
    """Scan one pickle; malformed input gives a scan with `problem` set, never an exception.

    `reviewed(module, name)` marks names off the data-only list that are allowed in this pickle, and
    makes every other name off it a finding (`PickleScan.findings`): for a pickle `load` itself
    unpickles, where "unknown" is not good enough (the opaque state, see `dynamo_state_reviewed`)."""
    blob = Blob(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    strict = reviewed is not None
    if len(data) > MAX_PICKLE_SIZE:
        return PickleScan(member=member, blob=blob, unpickled_by_load=strict,
                          problem=f"{len(data)} bytes, over the {MAX_PICKLE_SIZE}-byte scan limit")
    machine = _Machine(bytes(data), _Shared(reviewed), 0, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # escape_decode on odd STRING escapes: not our reader's noise
        result, problem = machine.run()
    fields: tuple[Field, ...] = ()
    top = None
    if machine.reached_stop:
        top = summarize(result)
        if isinstance(result, dict):
            items = sorted(result.items(), key=lambda kv: _key_text(kv[0]))
            fields = tuple(Field(key=_key_text(k), summary=summarize(v)) for k, v in items[:MAX_FIELDS])
    found = tuple(
        PickleImport(module=module, name=name, risk=risk, count=count, offset=offset, opcode=opcode,
                     unresolved=unresolved, within=within)
        for (module, name, risk, unresolved, within), (count, offset, opcode) in sorted(
            machine.imports.items(), key=lambda kv: (kv[0][4] or "", kv[1][1], kv[0][0], kv[0][1]))
    )
    return PickleScan(member=member, blob=blob, protocol=machine.protocol if machine.seen_proto else None, imports=found,
                      top_level=top, fields=fields, problem=problem, nested=machine.nested, unpickled_by_load=strict)
