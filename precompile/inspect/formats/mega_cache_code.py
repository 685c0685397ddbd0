"""The code a Mega-Cache entry carries, and what it records of the torch and host that wrote it, read
from the strings its pickle pushes (never unpickled).

What loading an entry runs is code it holds as text: an Inductor entry's `CompiledFxGraph` holds its
output module (`source_code`, and again in `_cached_files`), which binds each kernel by its Inductor
name (`cpp_fused_relu_0 = async_compile.cpp_pybinding([...], r'''<C++>''')`, `triton_poi_fused_relu_0
= async_compile.triton('triton_poi_fused_relu_0', '''<Triton>''')`) and which load writes out and
imports; an AOTAutograd entry holds such graphs too, and its saved FX graph modules' `forward`, which
`reduce_graph_module` rebuilds with exec (`import_block + body["_code"]`: both are kept as graph code,
found by where the pickle puts them, not by what the text says). Every string and UTF-8 bytes value of the pickle (and of a
pickle nested in bytes, as precompile entries nest them) is read; a value that is an output module is
split into its kernels, one that is a graph module's code is kept whole.

Recorded keys, from the text Inductor stores beside the code: the repro header of each graph
(`# torch version: 2.13.0+cpu`, `# torch cuda version: None`), the cache key's debug lines
(`[<hash>] inductor_config[cpp.cxx]: (None, 'g++')`) and the example inputs' devices; and from a
precompile entry's SystemInfo (torch 2.14) its `python_version` and `torch_version`.
"""
from __future__ import annotations

import hashlib
import re

from precompile.artifact.pickle_ops import PickleStreamError, read_ops
from precompile.inspect.model.artifact import MegaCacheCode, NamedValue

MAX_DEPTH = 3
"""Pickles nested in bytes read for strings, below the entry's own (precompile entries nest two deep)."""
_TEXT_OPS = frozenset({"UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING", "SHORT_BINSTRING"})
_BYTES_OPS = frozenset({"BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"})
_OUTPUT_MODULE = re.compile(r"^async_compile = AsyncCompile\(\)$", re.MULTILINE)
_BINDING = re.compile(r"^(?P<name>[A-Za-z_]\w*) = async_compile\.(?P<how>cpp_pybinding|cpp|triton)\(", re.MULTILINE)
_LITERAL = re.compile(r"r?'''(?P<source>.*?)'''", re.DOTALL)
_GRAPH = re.compile(r"^\s*def forward\(self\b")
_AOT_ID = re.compile(r"^# AOT ID: \[?'?(?P<id>[^'\]\n]*)")
_REPRO = re.compile(r"^# torch (?P<what>version|cuda version|git version): (?P<value>\S+)$", re.MULTILINE)
_DEBUG_LINE = re.compile(r"^\[[a-z0-9]{40,64}\] (?P<key>inductor_config\[cpp\.cxx\]|default_dtype): (?P<value>.+)$")
_DEVICE = re.compile(r"device=device\(type='(?P<type>[a-z_]+)'")
_SYSTEM_INFO = {"python_version": "python version", "torch_version": "torch version"}
"""The fields of a precompile entry's SystemInfo (torch 2.14) whose values are versions in clear: the
value is the first version-like string within the next few (a TorchVersion is its class, then the text)."""
_VERSION = re.compile(r"^[0-9]+\.[0-9]+(?:\.[0-9]+)?(?:[a-z0-9.+-]*)$")
_LOOKAHEAD = 3
_KEYS = {"version": "torch version", "cuda version": "torch cuda version", "git version": "torch git version",
         "inductor_config[cpp.cxx]": "C++ compiler (inductor_config cpp.cxx)", "default_dtype": "default dtype"}


def _texts(data: bytes, depth: int = 0):
    """Each str, and each bytes value that is UTF-8 text, the pickle pushes; nested pickles' too."""
    try:
        for name, arg, _ in read_ops(data):
            if name in _TEXT_OPS and isinstance(arg, (str, bytes)):
                yield arg if isinstance(arg, str) else arg.decode("latin-1")
            elif name in _BYTES_OPS and isinstance(arg, (bytes, bytearray)):
                if arg[:1] == b"\x80" and depth < MAX_DEPTH:
                    yield from _texts(bytes(arg), depth + 1)
                else:
                    try:
                        yield bytes(arg).decode("utf-8")
                    except UnicodeDecodeError:
                        continue
    except (PickleStreamError, ValueError, EOFError):
        return  # the scan reports where the stream breaks; the code before it is still shown


_MEMO_WRITES = frozenset({"MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"})
_TEXT = "text"


def _graph_module_texts(data: bytes, depth: int = 0):
    """(name, text) of what `reduce_graph_module` execs when load rebuilds a saved graph module, found by
    where the pickle puts it, whatever the text says: the value of each `_code` key, and the string
    that closes the args tuple after that function is named (its import_block, exec'd first)."""
    recent: list = []  # the last few text pushes, for STACK_GLOBAL's module and name
    rebuilding = False  # reduce_graph_module named: args tuples (body dict, import_block) follow
    code_key = False
    ops: list[str] = []  # the last opcodes but memo writes: a dict closed, then a text, then TUPLE2
    try:
        for name, arg, _ in read_ops(data):
            if name in _TEXT_OPS and isinstance(arg, (str, bytes)):
                text = arg if isinstance(arg, str) else arg.decode("latin-1")
                if code_key:
                    yield "forward", text
                code_key = text == "_code"
                recent = [*recent[-1:], text]
            elif name in _BYTES_OPS and isinstance(arg, (bytes, bytearray)) and arg[:1] == b"\x80" and depth < MAX_DEPTH:
                yield from _graph_module_texts(bytes(arg), depth + 1)
            elif name in ("STACK_GLOBAL", "GLOBAL"):
                named = recent if name == "STACK_GLOBAL" else str(arg).split(" ", 1)
                rebuilding = rebuilding or list(named) == ["torch.fx.graph_module", "reduce_graph_module"]
            elif (name == "TUPLE2" and rebuilding and ops[-1:] == [_TEXT] and ops[-2:-1] in (["SETITEM"], ["SETITEMS"])
                  and recent[-1].strip()):
                yield "import block", recent[-1]
            if name in _MEMO_WRITES:
                continue
            code_key = code_key and name in _TEXT_OPS
            ops = [*ops[-1:], _TEXT if name in _TEXT_OPS else name]
    except (PickleStreamError, ValueError, EOFError):
        return


def _code(kind, name: str, source: str) -> MegaCacheCode:
    return MegaCacheCode(kind=kind, name=name, source=source, sha256=hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest())


def _kernels(module: str) -> list[MegaCacheCode]:
    bindings = list(_BINDING.finditer(module))
    found = []
    for binding, after in zip(bindings, [*bindings[1:], None]):
        literal = _LITERAL.search(module, binding.end(), after.start() if after is not None else len(module))
        if literal is not None:
            kind = "triton" if binding.group("how") == "triton" else "cpp"
            found.append(_code(kind, binding.group("name"), literal.group("source").strip("\n")))
    return found


def entry_code(content: bytes, modules: tuple[str, ...] = ()) -> tuple[MegaCacheCode, ...]:
    """The output modules, their kernels and the graph modules' code an entry's pickle holds, each once;
    then each of `modules` not among them: a source load imports as an output module (`mega_cache_runs`),
    whatever it holds."""
    seen: dict[tuple[str, str, str], MegaCacheCode] = {}
    count = 0

    def module(text: str) -> None:
        nonlocal count
        aot_id = _AOT_ID.match(text)
        count += 1
        name = f"output module {aot_id.group('id') if aot_id else count}"
        for code in [_code("wrapper", name, text), *_kernels(text)]:
            seen.setdefault((code.kind, code.name, code.sha256), code)

    for text in _texts(content):
        if _OUTPUT_MODULE.search(text):
            module(text)
        elif _GRAPH.match(text):
            code = _code("graph", "forward", text)
            seen.setdefault((code.kind, code.name, code.sha256), code)
    for name, text in _graph_module_texts(content):
        code = _code("graph", name, text)
        if not any(known.sha256 == code.sha256 for known in seen.values()):
            seen.setdefault((code.kind, code.name, code.sha256), code)
    for text in modules:
        if _code("wrapper", "", text).sha256 not in {code.sha256 for code in seen.values() if code.kind == "wrapper"}:
            module(text)
    return tuple(seen.values())


def _keys_in(text: str) -> list[tuple[str, str]]:
    """(key, value) pairs one string records: a cache-key debug line and its devices, or a repro header."""
    if text.startswith("["):
        line = _DEBUG_LINE.match(text)
        found = [(_KEYS[line.group("key")], line.group("value"))] if line is not None else []
        return found + [("devices", device.group("type")) for device in _DEVICE.finditer(text)]
    if "# torch version: " in text:
        return [(_KEYS[repro.group("what")], repro.group("value")) for repro in _REPRO.finditer(text)]
    return []


def _recorded_pairs(texts) -> list[tuple[str, str]]:
    """(key, value) of everything the string stream records: each SystemInfo field it names, valued by the
    first version-like string within the next `_LOOKAHEAD`, and the keys each string holds (`_keys_in`)."""
    found: list[tuple[str, str]] = []
    pending: tuple[str, int] | None = None
    for text in texts:
        if pending is not None and _VERSION.match(text):
            found.append((pending[0], text))
            pending = None
        elif pending is not None:
            pending = (pending[0], pending[1] - 1) if pending[1] > 1 else None
        if text in _SYSTEM_INFO:
            pending = (_SYSTEM_INFO[text], _LOOKAHEAD)
        found.extend(_keys_in(text))
    return found


def recorded_keys(contents: list[bytes]) -> tuple[NamedValue, ...]:
    """What the entries record of the torch and host that wrote them; a key whose entries disagree
    shows every value, joined by " | "."""
    values: dict[str, list[str]] = {}
    for content in contents:
        for key, value in _recorded_pairs(_texts(content)):
            if value not in values.setdefault(key, []):
                values[key].append(value)
    order = list(dict.fromkeys([*_KEYS.values(), "python version", "devices"]))
    return tuple(NamedValue(name=key, value=" | ".join(values[key])) for key in order if key in values)
