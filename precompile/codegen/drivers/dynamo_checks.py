# What a DynamoTracer artifact's driver checks with (precompile/codegen/drivers/dynamo_checks.py,
# included verbatim before the driver, which serves each call from them): each variant's guards,
# rendered in python_code as Python (_RenderedGuards) or rebuilt from the pickled guard state as
# torch's guard manager (_TorchGuards), the invariance policy's slots taken out and the by-name
# identity checks added against what each name resolves to here.
import contextvars as _contextvars
import enum as _enum
import importlib as _importlib
import json as _json
import keyword as _keyword
import re as _re
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
    (`float('inf')`, `float('nan')`, `torch.device('cuda:0')`, `frozenset({'a'})`)."""
    import ast

    special = _re.fullmatch(r"float\('(-?inf|nan)'\)|torch\.device\('([^'\\]*)'\)|frozenset\((.*)\)", ref)
    if special is None:
        return ast.literal_eval(ref)
    if special.group(3) is not None:
        return frozenset(ast.literal_eval(special.group(3)) if special.group(3) else ())
    return float(special.group(1)) if special.group(1) else torch.device(special.group(2))


_BY_NAME = "the checks by name"
"""What torch's guard manager calls a variant's by-name lines when one fails (they run as one guard)."""


def _by_name_parts(line, artifact):
    """A by-name line `TYPE source is module:qualname` (an identity Dynamo could not serialize) or
    `TYPE source == literal` (an immutable constant, or a value the capture pinned), read into what its
    check walks: the source's root and steps, and the object that name or literal resolves to here. A
    pinned source may be a length (`len(source)`) or a ContextVar's value (`source.get()`)."""
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
    return in_globals, name, steps, of_type, type_steps, of_get, of_len, operator, expected


def by_name_check(line, scope, artifact):
    """The check of one by-name line: a function of a call's locals, true where it holds (`scope`: the
    frame's module globals). The capture runs it on its own state, as load will on a call's."""
    in_globals, name, steps, of_type, type_steps, of_get, of_len, operator, expected = _by_name_parts(line, artifact)

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


def _by_name_code(parts, at):
    """By-name line `at`'s check as one Python condition on a call's locals `L` and the frame's globals
    `G`, written from its parsed parts (names and keys as reprs), comparing with `E{at}` as
    by_name_check does."""
    in_globals, name, steps, of_type, type_steps, of_get, of_len, operator, _ = parts

    def walked(text, found):
        for attr, index, key in found:
            if attr:
                plain = attr.isidentifier() and not _keyword.iskeyword(attr)
                text = f"{text}.{attr}" if plain else f"getattr({text}, {attr!r})"
            else:
                text = f"{text}[{int(index)}]" if index else f"{text}[{key!r}]"
        return text

    text = walked(f"{'G' if in_globals else 'L'}[{name!r}]", steps)
    text = walked(f"type({text})", type_steps) if of_type else text
    text = f"(_v.get() if isinstance(_v := {text}, _ContextVar) else _ABSENT)" if of_get else text
    text = f"len({text})" if of_len else text
    if operator == "is":
        return f"{text} is E{at}"
    return f"((_v := {text}) is E{at} or type(_v) is T{at} and (_v == E{at} or _v != _v and E{at} != E{at}))"


def _add_by_name_checks(manager, lines, scope, artifact):
    """Add a variant's by-name lines to its guards as one guard, each line a condition of one compiled
    function: they run on every call that reaches the frame (a Llama's variants hold hundreds), and one
    Python call per line cost a third of a call. Returns each line's own check with the words a miss
    names it by, which `_TorchGuards.explain` runs one by one to find the line that failed."""
    parts = [_by_name_parts(line, artifact) for line in lines]
    namespace = {"G": scope, "_ContextVar": _contextvars.ContextVar, "_ABSENT": object()}
    for at, found in enumerate(parts):
        namespace[f"E{at}"], namespace[f"T{at}"] = found[-1], type(found[-1])
    conditions = "\n            and ".join(_by_name_code(found, at) for at, found in enumerate(parts))
    source = f"def check(L):\n    try:\n        return bool(\n            {conditions})\n    except Exception:\n        return False\n"
    exec(compile(source, "<checks by name>", "exec"), namespace)
    manager.root.add_lambda_guard(namespace["check"], [_BY_NAME], None)
    return [(f"{line.split(' ', 1)[0]}: {' '.join(_identity_parts(line))}", by_name_check(line, scope, artifact))
            for line in lines]


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


# Text whose parentheses pair, three deep: a guard source that calls `dict(type(...).__dict__)`.
_NESTED = r"(?:[^()]|\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\))+"


def _received(failed, f_locals, scope):
    """What the source a failed check names holds in this call, described ("model.act is
    torch._VariableFunctionsClass.tanh"); None where the failure is not a plain source's (torch's own
    words follow a tensor's or the global state's) or the source is not there. A set's member read by
    its place (`list(G['MODES'])[0]`, torch 2.14's `___set_getitem(G['MODES'], 0)`) says why its order
    may differ from capture's."""
    parts = _re.sub(rf"___set_getitem\(({_NESTED}), (\d+)\)", r"list(\1)[\2]", failed).split(" ")
    if len(parts) < 2 or parts[0] in ("TENSOR_MATCH", "GLOBAL_STATE", "SHAPE_ENV"):
        return None
    source = parts[1]
    setting = _re.fullmatch(_OVERRIDE_SLOT, source)
    if setting is not None:  # what a torch config override's slot stands for: the setting
        source = f"{setting.group(1)}.{setting.group(2)}"
    try:
        text = f"{source} is {_described(_walked(source, f_locals, scope))}"
    except Exception:  # a source that is not there, or not a plain one
        text = None
    for listed in _re.finditer(rf"\blist\(({_NESTED})\)((?:{_SOURCE_STEP})*)", " ".join(parts[1:])):
        try:  # how Dynamo reads a set's n-th member, in the failed check's source or what it compares with
            held = _walked(listed.group(1), f_locals, scope)
            member = _described(_walked(listed.group(2), f_locals, scope, list(held)))
        except Exception:
            continue
        if isinstance(held, (set, frozenset)):
            return (f"{text}; " if text and listed.group(0) != source else "") + \
                f"{listed.group(0)} is {member}; {listed.group(1)} is a set, " + _set_order(held)
    return text


def _set_order(held):
    """What orders a set's members, and the remedy: a string's hash follows the process's hash seed
    (an enum member hashes by its name), an object's default hash its address."""
    if all(isinstance(m, (str, bytes)) or isinstance(m, _enum.Enum) and type(m).__hash__ is _enum.Enum.__hash__
           for m in held):
        return ("whose order follows the process's hash seed (its members hash by a string): capture and serve "
                "under one fixed PYTHONHASHSEED, or make it a tuple and capture again")
    return ("whose order follows its members' hashes, which (an object's, by its address) differ between "
            "processes whatever the hash seed: make it a tuple and capture again")


def _walked(steps, f_locals, scope, value=None):
    """What a source holds (`steps` from `value`, or from its root where `value` is None: a local, a
    global, `type(...)` or `dict(...)` of one); raises where it is not such a source or is not there."""
    if value is None:
        call = _re.match(rf"(type|dict)\(({_NESTED})\)", steps)
        root = None if call else _re.match(_SOURCE_ROOT, steps)
        if call is not None:
            inner = _walked(call.group(2), f_locals, scope)
            value, steps = (type(inner) if call.group(1) == "type" else dict(inner)), steps[call.end():]
        elif root is not None:
            value = (scope if root.group(1) == "G" else f_locals)[root.group(2) or root.group(3)]
            steps = steps[root.end():]
        else:
            raise LookupError(steps)
    if not _re.fullmatch(f"(?:{_SOURCE_STEP})*", steps):
        raise LookupError(steps)
    for attr, index, key in _re.findall(_SOURCE_STEP, steps):
        value = getattr(value, attr) if attr else value[int(index)] if index else value[key]
    return value


def _described(value):
    """A short, safe description of a value a guard checked: a constant as a literal (a dtype or device
    as torch writes it), an enum member, a class or function by qualified name, a collection by its type and size,
    anything else by its type."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        text = repr(value)
    elif kind in (torch.dtype, torch.device):  # torch.float64, device(type='meta')
        text = repr(value)
    elif isinstance(value, _enum.Enum):
        text = f"{kind.__module__}.{kind.__qualname__}.{value.name}"
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
    its call ran under that changes how the tensor checks read dispatch keys (a miss on them names it);
    `by_name`: each by-name line's words and own check, for naming the one that failed."""

    def __init__(self, manager, scope, modes=(), by_name=()):
        self.manager = manager
        self.scope = scope
        self.modes = modes
        self.by_name = by_name

    def check(self, f_locals):
        return self.manager.check(f_locals)

    def explain(self, f_locals):
        failed = [part.strip() for part in self.manager.check_verbose(f_locals).verbose_code_parts if part.strip()]
        if failed and failed[0] == _BY_NAME:  # which line: each run alone
            failed[0] = next((words for words, check in self.by_name if not check(f_locals)), _BY_NAME)
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
    _fill_bound_globals(state, scope, artifact)
    _fill_named_locals(state, by_name)
    _drop_guards(state, policy_dropped)
    return state


def _fill_bound_globals(state, scope, artifact):
    """Bind the modules and ContextVars the capture wrote as placeholders in the saved global scope (a
    frame reading `flags.SCALE` binds `flags`) to the ones the serving frame's globals hold under those
    names: the state imports no module by name, and the values read through one are checked against
    the capture's by the variant's by-name lines."""
    global_scope = state.output_graph.global_scope
    for name, value in global_scope.items():
        if type(value).__name__ != "_Missing":
            continue
        reason = getattr(value, "_reason", None)
        kind = reason.split(" ", 1)[0] if isinstance(reason, str) else None
        found = scope.get(name)
        if isinstance(found, _types.ModuleType) or (kind == "contextvar" and isinstance(found, _contextvars.ContextVar)):
            global_scope[name] = found
            continue
        if kind in ("module", "contextvar"):
            _fail(artifact, f"its guards read {reason} through the global {name!r}, which module "
                            f"{scope.get('__name__')!r} does not bind to a {'module' if kind == 'module' else 'ContextVar'} here",
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
    by_name_checks = _add_by_name_checks(manager, by_name, scope, artifact) if by_name else []
    return _TorchGuards(manager, scope, modes, by_name_checks), global_state, builtins_key


def _builtins_dict(scope):
    """The dict Dynamo's bytecode reads builtins from (the module's __builtins__, a dict or a module)."""
    found = scope["__builtins__"]
    return found if isinstance(found, dict) else found.__dict__


def _seed_builtins(scope, key, artifact):
    builtins_dict = _builtins_dict(scope)
    if scope.setdefault(key, builtins_dict) is not builtins_dict:
        _fail(artifact, f"module binds {key!r} to something other than its builtins dict",
              "load the artifact in a fresh process")
