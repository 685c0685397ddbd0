# What a DynamoTracer artifact's driver checks with (precompile/codegen/drivers/dynamo_checks.py,
# included verbatim before the driver, which serves each call from them): that the code Dynamo
# inlined still says what it said at capture (guards do not check it), and each variant's guards,
# rendered in python_code as Python (_RenderedGuards) or rebuilt from the pickled guard state as
# torch's guard manager (_TorchGuards), the invariance policy's slots taken out and the by-name
# identity checks added against what each name resolves to here.
import contextvars as _contextvars
import hashlib as _hashlib
import importlib as _importlib
import importlib.machinery as _machinery
import inspect as _inspect
import json as _json
import linecache as _linecache
import os as _os
import re as _re
import sys as _sys
import types as _types
import typing as _typing

import torch

if "dispatch_key_sets" not in globals():  # imported as a module of its own; python_code has the section above
    from precompile.codegen.drivers.dispatch_state import captured_under, dispatch_key_sets

try:
    from precompile.errors import PrecompileError
except ImportError:  # served where only torch is installed: a twin of the same name

    class PrecompileError(RuntimeError):
        pass


def _fail(artifact, message, remedy, error=PrecompileError) -> _typing.NoReturn:
    raise error(f"{artifact}: {message}; {remedy}")


_RECAPTURE = "capture it again; never load an artifact whose opaque parts were rewritten (precompile inspect verify tells)"


def hash_source_lines(lines, first_line, last_line):
    return _hashlib.sha256("".join(lines[first_line - 1 : last_line - 1]).encode()).hexdigest()


def _unimported_origin(name):
    """The .py file the import system would load for module `name`, found without executing it or
    its packages; None where it is not a plain source file read by the standard source loader."""
    spec, locations = None, None
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        loaded = _sys.modules.get(prefix)
        spec = getattr(loaded, "__spec__", None) if loaded is not None else _machinery.PathFinder.find_spec(prefix, locations)
        if spec is None:
            return None
        locations = spec.submodule_search_locations
    if spec is None:  # a name with no parts
        return None
    origin = spec.origin if spec.has_location else None
    # a real .py file, whichever loader read it (pytest's assertion rewriter loads a plugin's package);
    # a module in a zip archive has no file of its own: its loader reads it
    return origin if origin and origin.endswith(".py") and _os.path.isfile(origin) else None


def source_file(name):
    """The file module `name`'s source is read from: inspect's choice for an imported module, the
    import system's for one not imported yet (found without executing it); None where there is none."""
    loaded = _sys.modules.get(name)
    if loaded is None:
        return _unimported_origin(name)
    path = getattr(loaded, "__file__", None)
    if type(path) is str and path.endswith(".py") and isinstance(getattr(loaded, "__loader__", None), _machinery.SourceFileLoader):
        return path  # what inspect.getsourcefile answers for it, without its lookups
    try:
        return _inspect.getsourcefile(loaded)
    except TypeError:  # a built-in module
        return None


def hash_spans(data, spans):
    """The sha256 of the bytes each [start, end) span of `data` holds, in order (InlinedFile.sha256)."""
    digest = _hashlib.sha256()
    for start, end in spans:
        digest.update(data[start:end])
    return digest.hexdigest()


def _span_bytes(file, start, end):
    """The bytes [start, end) of a file opened unbuffered where they still begin a line and end one (or
    end the file); None otherwise (a short read included: the ranges are then hashed line by line)."""
    before = 1 if start > 0 else 0
    file.seek(start - before)
    chunk = file.read(end - start + before + 1)
    span = chunk[before : before + end - start]
    if len(span) != end - start or (before and chunk[0] != 10):
        return None
    if span and span[-1] != 10 and len(chunk) > before + len(span):  # the span's last line goes on
        return None
    return span


def _is_span(span, size):
    return (type(span) in (list, tuple) and len(span) == 2 and all(type(offset) is int for offset in span)
            and 0 <= span[0] <= span[1] <= size)


def _file_unchanged(path, entry):
    """Whether the file at `path` still has the bytes an INLINED_FILES entry hashed: the spans of its
    inlined ranges and its first two lines (read alone), or the whole file for an entry written before
    spans. The spans' line numbers are not checked: text that moved without changing its bytes or
    offsets is the same code (capture's inlined_files.py says more)."""
    spans = entry.get("spans", ())
    with open(path, "rb", buffering=0) as file:
        if not spans:
            return _hashlib.sha256(file.readall()).hexdigest() == entry["sha256"]
        size = file.seek(0, 2)
        digest = _hashlib.sha256()
        for span in spans:
            data = _span_bytes(file, *span) if _is_span(span, size) else None
            if data is None:
                return False
            digest.update(data)
    return digest.hexdigest() == entry["sha256"]


def _unchanged_modules(metadata):
    """The modules whose source file still has the bytes INLINED_FILES recorded: capture checked each of
    their INLINED_SOURCES ranges against exactly those bytes, so none needs reading again."""
    unchanged = set()
    for entry in metadata.get("INLINED_FILES", ()):
        path = None if entry["module"] == "__main__" else source_file(entry["module"])
        if path is None:
            continue
        try:
            if _file_unchanged(path, entry):
                unchanged.add(entry["module"])
        except OSError:
            pass
    return unchanged


def _source_lines(name, artifact):
    """Module `name`'s source lines, read as Dynamo's package reads them to hash the code it inlined
    (inspect.getsourcelines of the module, in torch._dynamo.package._hash_sourcelines; a test keeps
    the two equal). A module not imported yet is read from its file, not imported: the polyfills
    Dynamo inlines live in torch._dynamo, which a standalone artifact never imports."""
    origin = None if name in _sys.modules else _unimported_origin(name)
    if origin is not None:
        return _linecache.getlines(origin)
    return _inspect.getsourcelines(_module(name, artifact))[0]


def _check_sources(metadata, artifact):
    """The code Dynamo inlined must still say what it said at capture: guards do not check it. Each
    module's source is read once, however many of its functions were inlined, and not at all where
    its whole file is unchanged."""
    unchanged = _unchanged_modules(metadata)
    lines_of = {}
    for source in metadata.get("INLINED_SOURCES", ()):
        name = source["module"]
        if name in unchanged:
            continue
        if name not in lines_of:
            try:
                lines_of[name] = _source_lines(name, artifact)
            except (OSError, TypeError):
                lines_of[name] = None
        lines = lines_of[name]
        now = None if lines is None else hash_source_lines(lines, source["first_line"], source["last_line"])
        if now != source["sha256"]:
            _fail(artifact, f"the source of {name} lines {source['first_line']}-{source['last_line']} "
                            "changed since capture (its compiled graphs may no longer match it)",
                  "capture the artifact again from the current source")

def _module(name, artifact):
    if name == "__main__":
        _fail(artifact, "it captured code defined in __main__, which another process cannot import",
              "define fn in an importable module and capture again")
    try:
        return _importlib.import_module(name)
    except ImportError as exc:
        _fail(artifact, f"its code lives in module {name!r}, which cannot be imported here ({exc})",
              "serve it where that module is importable")

def _set_thread_count(guard, threads):
    """The GLOBAL_STATE guard pins torch.get_num_threads(); the driver keeps it at the current count,
    so serving with another thread count matches while grad mode and the rest stay checked."""
    state = _json.loads(guard.__getstate__())
    state["num_threads"] = threads
    guard.__setstate__(_json.dumps(state))

# This driver's regular expressions stay text: `re` compiles (and caches) each on first use, so a load
# that needs none of them compiles none.
_LOCAL = r"L\['([^']+)'\]"


def _drop_guards(state, slots):
    """Take the invariance policy's slots ("GUARD_TYPE source", listed in the variant's guard list) out of a variant."""
    if not slots:
        return
    guards = state.output_graph._guards
    guards.inner = type(guards.inner)(guard for guard in guards.inner if _slot_text(guard) not in slots)


def _slot_text(guard):
    return (guard.create_fn_name() + " " + _re.sub(_LOCAL, r"\1", guard.name)).strip()


# A guard source walked without eval (precompile/capturing/dynamo/named_identity.py SOURCE): a local (x, or
# L['x']) or a global (G['x']), then .attr, [0] or ['key'] steps, optionally inside type(...), then more steps.
_SOURCE_STEP = r"\.(\w+)|\[(\d+)\]|\['([^'\]]+)'\]"
_SOURCE_ROOT = r"(?:([LG])\['([^'\]]+)'\]|([A-Za-z_]\w*))"
# The slot of a torch config setting's override (torch 2.15's Dynamo guards what
# `<module>._config['NAME'].user_override.get()` returned; precompile/capturing/dynamo/config_settings.py).
_OVERRIDE_SLOT = r"(.+)\._config\['([A-Za-z_][\w.]*)'\]\.user_override\.get\(\)"


def _resolve_reference(ref):
    """The object `module:qualname[@unwraps]` names in this process."""
    name, _, unwraps = ref.partition("@")
    module, _, qualname = name.partition(":")
    value = _importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        value = getattr(value, part)
    for _ in range(int(unwraps or 0)):
        value = value.__wrapped__
    defined_in = getattr(value, "__module__", None) or ""
    if isinstance(value, (_types.FunctionType, _types.BuiltinFunctionType)) and (
            not (defined_in == module or defined_in.startswith(module + "."))  # torch.nn:Linear re-exports
            or qualname not in (getattr(value, "__qualname__", None), getattr(value, "__name__", None))):
        # The name now holds another function (a library patched it before load): what the capture
        # compared with is not here.
        raise LookupError(f"{module}:{qualname} is now {getattr(value, '__module__', '?')}."
                          f"{getattr(value, '__qualname__', '?')}, not the function captured")
    return value


def _fill_named_locals(state, lines):
    """Put back the locals the guard state could not pickle (Dynamo leaves a _Missing placeholder) that
    a by-name check names, such as the function a decorator's wrapper closes over: building the guard
    tree reads them (a check on func.__name__ needs func)."""
    local_scope = state.output_graph.local_scope
    for line in lines:
        source, operator, ref = _identity_parts(line)
        root = _re.fullmatch(_SOURCE_ROOT, source)
        if operator != "is" or root is None or root.group(1) == "G":
            continue
        name = root.group(2) or root.group(3)
        if type(local_scope.get(name)).__name__ == "_Missing":
            local_scope[name] = _resolve_reference(ref)


def _identity_parts(line):
    """(source, "is" or "==", reference or literal) of a by-name line: `TYPE source is module:qualname`
    or, for an identity guard on an immutable constant, `TYPE source == literal`."""
    rest = line.split(" ", 1)[1]
    equals, is_ = rest.find(" == "), rest.find(" is ")
    at, operator = (equals, "==") if equals >= 0 and (is_ < 0 or equals < is_) else (is_, "is")
    return rest[:at], operator, rest[at + len(operator) + 2:]


def _pinned_operand(ref):
    """What a `source == operand` line compares with: a literal, or a spelling a literal lacks
    (`float('inf')`, `float('nan')`, `torch.device('cuda:0')`)."""
    import ast

    special = _re.fullmatch(r"float\('(-?inf|nan)'\)|torch\.device\('([^'\\]*)'\)", ref)
    if special is None:
        return ast.literal_eval(ref)
    return float(special.group(1)) if special.group(1) else torch.device(special.group(2))


def _check_by_name(manager, line, scope, artifact):
    """Add to a variant's guards the identity check `TYPE source is module:qualname` that Dynamo could
    not serialize, against the object that name resolves to here; or, for an identity guard on an
    immutable constant or a value the capture pinned (`TYPE source == literal`), its type and value."""
    source, operator, ref = _identity_parts(line)
    manager.root.add_lambda_guard(by_name_check(line, scope, artifact), [f"{line.split(' ', 1)[0]}: {source} {operator} {ref}"], None)


def by_name_check(line, scope, artifact):
    """The check of one by-name line: a function of a call's locals, true where it holds (`scope`: the
    frame's module globals). A pinned source may be a length (`len(source)`) or a ContextVar's value
    (`source.get()`). The capture runs it on its own state, as load will on a call's."""
    source, operator, ref = _identity_parts(line)
    of_len = source.startswith("len(") and source.endswith(")")
    walked = source[4:-1] if of_len else source
    of_get = walked.endswith(".get()")
    walked = walked[:-6] if of_get else walked
    of_type = walked.startswith("type(")
    walked, after = walked[5:].split(")", 1) if of_type else (walked, "")
    root = _re.match(_SOURCE_ROOT, walked)
    if root is None:
        _fail(artifact, f"{line}: its source names neither a local, a global nor a name", _RECAPTURE)
    steps, type_steps = _re.findall(_SOURCE_STEP, walked[root.end():]), _re.findall(_SOURCE_STEP, after)
    try:
        expected = _pinned_operand(ref) if operator == "==" else _resolve_reference(ref)
    except Exception as exc:  # the named object is not here: the variant cannot serve
        _fail(artifact, f"{line}: {ref} does not resolve here ({type(exc).__name__}: {exc})",
              "serve it with the code it was captured from")
    in_globals, name = root.group(1) == "G", root.group(2) or root.group(3)

    def check(f_locals):
        try:
            value = (scope if in_globals else f_locals)[name]
            for attr, index, key in steps:
                value = getattr(value, attr) if attr else value[int(index)] if index else value[key]
            value = type(value) if of_type else value
            for attr, index, key in type_steps:
                value = getattr(value, attr) if attr else value[int(index)] if index else value[key]
            if of_get and not isinstance(value, _contextvars.ContextVar):
                return False
            value = value.get() if of_get else value
            value = len(value) if of_len else value
        except Exception:  # a source that is not there fails the check
            return False
        return value is expected or (operator == "==" and type(value) is type(expected)
                                     and (value == expected or value != value and expected != expected))  # nan

    return check

class _RenderedGuards:
    """A variant's guards as rendered in python_code (`guards_F_V(L, G)`): the checks that run."""

    manager = None

    def __init__(self, function, scope):
        self.function = function
        self.scope = scope

    def check(self, f_locals):
        return self.function(f_locals, self.scope) is None

    def explain(self, f_locals):
        failed = self.function(f_locals, self.scope, True)
        if not failed:
            return "every guard holds"
        received = _received(failed, f_locals, self.scope)
        return failed if received is None else f"{failed} (this call's {received})"


def _received(failed, f_locals, scope):
    """What the source a failed check names holds in this call, described ("model.act is
    torch._VariableFunctionsClass.tanh"); None where the failure is not a plain source's (torch's own
    words follow a tensor's or the global state's) or the source is not there."""
    parts = failed.split(" ")
    if len(parts) < 2 or parts[0] in ("TENSOR_MATCH", "GLOBAL_STATE", "SHAPE_ENV"):
        return None
    source = parts[1]
    setting = _re.fullmatch(_OVERRIDE_SLOT, source)
    if setting is not None:  # what a torch config override's slot stands for: the setting
        source = f"{setting.group(1)}.{setting.group(2)}"
    root = _re.match(_SOURCE_ROOT, source)
    if root is None or not _re.fullmatch(f"(?:{_SOURCE_STEP})*", source[root.end():]):
        return None
    try:
        value = (scope if root.group(1) == "G" else f_locals)[root.group(2) or root.group(3)]
        for attr, index, key in _re.findall(_SOURCE_STEP, source[root.end():]):
            value = getattr(value, attr) if attr else value[int(index)] if index else value[key]
    except Exception:  # a source that is not there: the failed check says so
        return None
    return f"{source} is {_described(value)}"


def _described(value):
    """A short, safe description of a value a guard checked: a constant as a literal, a class or
    function by qualified name, a collection by its type and size, anything else by its type."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        text = repr(value)
    elif isinstance(value, (dict, list, tuple, set, frozenset)):
        text = f"{_article(kind.__name__)} {kind.__name__} of {len(value)} item{'s' if len(value) != 1 else ''}"
    elif isinstance(value, type) or callable(value) and isinstance(getattr(value, "__qualname__", None), str):
        text = f"{getattr(value, '__module__', None) or '?'}.{value.__qualname__}"
    else:
        text = f"{_article(kind.__module__)} {kind.__module__}.{kind.__qualname__}"
    return text if len(text) <= 120 else text[:117] + "..."


def _article(word):
    return "an" if word[:1].lower() in "aeiou" else "a"


# torch's hint on any failed check of a parameter, wrong where the parameter's dispatch keys differ.
_PARAMETER_HINT = _re.compile(r"\.? ?Guard failed on a parameter, consider using \S+ = False to allow dynamism on parameters\.?")


class _TorchGuards:
    """A variant's guards as torch's guard manager rebuilt from its pickled guard state; `modes`: what
    its call ran under that changes how the tensor checks read dispatch keys (a miss on them names it)."""

    def __init__(self, manager, scope, modes=()):
        self.manager = manager
        self.scope = scope
        self.modes = modes

    def check(self, f_locals):
        return self.manager.check(f_locals)

    def explain(self, f_locals):
        failed = [part.strip() for part in self.manager.check_verbose(f_locals).verbose_code_parts if part.strip()]
        text = "; ".join(failed[:2]) or "a guard failed"
        if "dispatch key set mismatch" in text:
            text = _PARAMETER_HINT.sub("", text)
            text += f" {captured_under(self.modes)}"
        received = _received(failed[0], f_locals, self.scope) if failed else None  # a by-name line's source
        return text if received is None else f"{text} (this call's {received})"


def read_guards_state(guards_state):
    """A variant's pickled guard state, read back as Dynamo's own loader reads it, except that a
    source for a module a frame imports (ImportSource: a state-space model's layers import their
    kernels inside forward) does not install its guard again as it is rebuilt: that needs a running
    trace, and the guard is in the saved state already. Capture reads guard state back by this too."""
    from torch._dynamo.package import load_guards_state
    from torch._dynamo.source import ImportSource

    rebuild = vars(ImportSource).get("__post_init__")  # torch 2.14's installs no guard there
    if rebuild is None:
        return load_guards_state(guards_state)
    setattr(ImportSource, "__post_init__", lambda self: None)  # noqa: B010 - a method, set for the read only
    try:
        return load_guards_state(guards_state)
    finally:
        setattr(ImportSource, "__post_init__", rebuild)  # noqa: B010


def rebuilt_guards_state(guards_state, by_name, policy_dropped, scope, artifact="this artifact"):
    """A variant's pickled guard state as its guard manager is built from: the modules its globals
    bind taken from `scope` (the frame's module globals), the locals its by-name identity lines name
    put back, the invariance policy's slots taken out."""
    state = read_guards_state(guards_state)
    _fill_global_modules(state, scope, artifact)
    _fill_named_locals(state, by_name)
    _drop_guards(state, policy_dropped)
    return state


def _fill_global_modules(state, scope, artifact):
    """Bind the modules the capture wrote as placeholders in the saved global scope (a frame reading
    `flags.SCALE` binds `flags`) to the ones the serving frame's globals hold under those names: the
    state imports no module by name, and the values read through one are checked against the
    capture's by the variant's by-name lines."""
    global_scope = state.output_graph.global_scope
    for name, value in global_scope.items():
        if type(value).__name__ != "_Missing":
            continue
        if isinstance(scope.get(name), _types.ModuleType):
            global_scope[name] = scope[name]
            continue
        reason = getattr(value, "_reason", None)
        if isinstance(reason, str) and reason.startswith("module "):
            _fail(artifact, f"its guards read {reason} through the global {name!r}, which module "
                            f"{scope.get('__name__')!r} does not bind to a module here",
                  "serve it with the code it was captured from")


def _torch_guards(guards_state, target, scope, policy_dropped, by_name, artifact, modes=()):
    """torch's guard manager for one variant, from its pickled guard state: the invariance policy's
    slots taken out, the by-name identity checks added, built under the dispatch state its call ran
    under (`modes`, see the dispatch-state section), as Dynamo built it at capture. Returns it with its
    GLOBAL_STATE guard."""
    from torch._dynamo.package import load_guard_manager

    state = rebuilt_guards_state(guards_state, by_name, policy_dropped, scope, artifact)
    global_state = state.output_graph.global_state_guard
    _set_thread_count(global_state, torch.get_num_threads())
    builtins_key = state.output_graph.name_of_builtins_dict_key_in_fglobals
    if builtins_key:
        _seed_builtins(scope, builtins_key, artifact)
    # Dynamo builds its checks of the module hook tables only with this off (the capture turned it off).
    with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False), torch._C._ForceDispatchKeyGuard(*dispatch_key_sets(modes)):
        manager = load_guard_manager(state, target, scope)
    for line in by_name:
        _check_by_name(manager, line, scope, artifact)
    return _TorchGuards(manager, scope, modes), global_state, builtins_key


def _builtins_dict(scope):
    """The dict Dynamo's bytecode reads builtins from (the module's __builtins__, a dict or a module)."""
    found = scope["__builtins__"]
    return found if isinstance(found, dict) else found.__dict__


def _seed_builtins(scope, key, artifact):
    builtins_dict = _builtins_dict(scope)
    if scope.setdefault(key, builtins_dict) is not builtins_dict:
        _fail(artifact, f"module binds {key!r} to something other than its builtins dict",
              "load the artifact in a fresh process")
