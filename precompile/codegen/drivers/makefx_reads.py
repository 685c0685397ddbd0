# What the checks of a MakeFxTracer artifact's reads are made of (precompile/codegen/drivers/
# makefx_reads.py, included verbatim before the driver, which checks SPECIALIZED with them). The trace
# read Python values besides tensors: how such a value is spelled (recorded at capture, compared at
# serve), what of a value that may change in place (or, a ContextVar, under the same object) a later
# call compares instead of spelling it again, where each read value lives for later calls to read it
# again in C (_ReadPlan), torch's global state and the hooks the model's modules hold.
import contextvars as _contextvars
import enum as _enum
import functools as _functools
import hashlib as _hashlib
import inspect as _inspect
import sys as _sys
import types as _types
from operator import contains as _contains
from operator import getitem as _getitem
from operator import is_ as _is

import torch

if "code_tokens_sha256" not in globals():  # a module of its own; python_code holds driver-sources above
    from precompile.codegen.drivers.source_checks import code_tokens_sha256


def spelled(value):
    """The spelling a specialized value is recorded and compared by (None: not comparable). Two
    values that spell alike behave alike where a trace could have read them: 1, 1.0 and True differ;
    tuples, lists and dicts of such values spell by their items, in order, sets by their members (a
    subclass, a namedtuple or an attribute-style dict, also by its class; a namedtuple by its fields);
    a class by its qualified name, a function or a bound method by its qualified name and the values
    it closes over, a lambda or closure also by its code's text (a partial by its function and
    arguments); an enum member by its class, name and value; a numpy scalar by its type and value, a
    numpy array by its dtype, shape and values; a ContextVar by its name and the value it holds in
    the calling context. A spelling over 256 characters is kept as its length and sha256 (python_code
    stays readable; the comparison stays exact)."""
    text = _spelled(value, 0)
    if text is not None and len(text) > 256:
        return f"<{len(text)} characters, sha256 {_hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()}>"
    return text


def _spelled(value, depth):
    kind = type(value)
    if value is None or kind in (bool, float, str, torch.dtype, torch.device):
        return repr(value)
    if kind is int:
        return repr(value) if -(10**300) < value < 10**300 else hex(value)  # repr refuses 4,300+ digits
    if isinstance(value, _enum.Enum):  # by name and value: `FAST = 3` edited in the source is a change
        held = _spelled(value._value_, depth + 1) if depth <= 8 else None
        return f"{kind.__module__}.{kind.__qualname__}.{value.name}" + ("" if held is None else f" = {held}")
    if isinstance(value, type):
        return f"class {value.__module__}.{value.__qualname__}"
    if kind in (_types.FunctionType, _types.BuiltinFunctionType):
        return _function(_unpatched(value), depth)
    if kind is _types.MethodType:
        return "method " + _function(value.__func__, depth).removeprefix("function ")
    if depth > 8:
        return None  # a list holding itself, or nesting deeper than one goes
    if kind.__module__ == "numpy":
        return _numpy_value(value, kind)
    if kind is _functools.partial:
        return _partial(value, depth)
    if kind is _contextvars.ContextVar:
        return _context_var(value, depth)
    return _container(value, kind, depth)


def _unpatched(function):
    """A function torch.fx.wrap marked, as itself where torch.fx's stand-in for it (functools.wraps of it,
    in its module's globals while a trace runs) is what a read found: served, no trace patches it."""
    patches, code = _sys.modules.get("torch.fx._symbolic_trace"), getattr(function, "__code__", None)
    patched = patches is not None and code is not None and code.co_filename == patches.__file__
    return function.__wrapped__ if patched and hasattr(function, "__wrapped__") else function


def _partial(value, depth):
    parts = [_spelled(value.func, depth + 1), *(_spelled(a, depth + 1) for a in value.args),
             *(None if v is None else f"{k}={v}" for k, v in ((k, _spelled(a, depth + 1)) for k, a in value.keywords.items()))]
    return None if None in parts else f"partial({', '.join(parts)})"


def _numpy_value(value, kind):
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        return f"numpy.{kind.__name__}({value.item()!r})"
    return _numpy_array(value) if _is_numpy_array(value) else None


def _context_var(value, depth):
    try:
        inner = _spelled(value.get(), depth + 1)  # in the calling context, its own default where unset
    except LookupError:
        inner = "unset"
    return None if inner is None else f"contextvar {value.name} holding {inner}"


_BASES: tuple = (tuple, list, dict, set, frozenset)


def _container(value, kind, depth):
    """A tuple, list, dict or set (or torch.Size) by its items; a subclass also by its class."""
    if kind in _BASES or kind is torch.Size:
        return None if len(value) > 10_000 else _collection(value, kind, depth)
    base = next((b for b in _BASES if isinstance(value, b)), None)
    if base is None or base.__len__(value) > 10_000:
        return None  # not a collection of settings
    # A subclass (a namedtuple, an attribute-style dict) by its class and items, read as its base class
    # reads them: no method of the subclass runs; a namedtuple's items by its fields.
    fields = getattr(kind, "_fields", None) if base is tuple else None
    if isinstance(fields, tuple) and len(fields) == tuple.__len__(value):
        items = [_spelled(item, depth + 1) for item in tuple.__iter__(value)]
        inner = None if None in items else ", ".join(f"{field}={item}" for field, item in zip(fields, items))
    else:
        inner = _collection(value, base, depth, _SET_ORDERED.get((kind.__module__, kind.__qualname__)))
    attributes = _own_attributes(value, depth) if inner is not None else []
    if inner is not None and attributes:  # attributes a subclass instance holds besides its items
        inner = None if any(a is None for _, a in attributes) else \
            inner + "; attributes " + ", ".join(f"{name}={held}" for name, held in attributes)
    return None if inner is None else f"{kind.__module__}.{kind.__qualname__}({inner})"


def _own_attributes(value, depth):
    """[(name, spelling)] of the attributes a dict subclass instance holds in its own __dict__ that do not
    spell as the item of the same key (diffusers' FrozenDict mirrors its items as attributes, and a model
    reads `config.flag`, the attribute: one set after capture differs from its item); [] otherwise."""
    held = _instance_dict(value) if isinstance(value, dict) and type(value) is not dict else None
    pairs = [(name, attribute, dict.get(value, name, _ABSENT)) for name, attribute in (held or {}).items()]
    spelled_pairs = [(name, _spelled(attribute, depth + 1), item) for name, attribute, item in pairs if item is not attribute]
    return [(name, spelling) for name, spelling, item in spelled_pairs
            if item is _ABSENT or spelling is None or spelling != _spelled(item, depth + 1)]


def _in_order(item):
    """A list of names made from a set, in sorted order (anything else as it is)."""
    return sorted(item) if type(item) is list and all(type(name) is str for name in item) else item


def _numpy_array(value):
    """A numpy array by dtype, shape and values (over 10,000 elements, its bytes' sha256); None for objects."""
    if value.dtype.hasobject:
        return None
    if value.size > 10_000:
        digest = _hashlib.sha256(value.tobytes()).hexdigest()
        return f"numpy.ndarray(dtype={value.dtype.str!r}, shape={tuple(value.shape)!r}, sha256 {digest})"
    return f"numpy.ndarray(dtype={value.dtype.str!r}, shape={tuple(value.shape)!r}, values={value.tolist()!r})"


def _is_numpy_array(value):
    kind = type(value)
    return kind.__module__ == "numpy" and kind.__name__ == "ndarray"


def _function(value, depth=0):
    """A function by its qualified name and its defaults; one defined inside another (a lambda, a
    closure) also by its code's text, since such names repeat, and by the values it closes over
    (nested as deep as a collection goes: a closure that names itself is spelled once)."""
    name = f"function {getattr(value, '__module__', None) or '?'}.{getattr(value, '__qualname__', None) or value.__name__}"
    code = getattr(value, "__code__", None)
    if code is None or "<" not in name and not (isinstance(value, _types.FunctionType) and _bound_values(value)):
        return name
    if "<" in name:
        name = f"{name} ({_code_text(code)})"
    if depth > 8 or not isinstance(value, _types.FunctionType):
        return name
    labels = [*(f"{free}=" for free in code.co_freevars[:len(value.__closure__ or ())]),
              *("default " for _ in value.__defaults__ or ()), *(f"default {k}=" for k in value.__kwdefaults__ or {})]
    bound = []
    for label, held in zip(labels, _bound_values(value)):
        spelling = "unbound" if held is _ABSENT else _spelled(held, depth + 1)
        bound.append(f"{label}{spelling if spelling is not None else 'a ' + type(held).__name__}")
    return name + (f" closing over {', '.join(bound)}" if bound else "")


def _code_text(code):
    """A code object by the sha256 of the tokens its source lines hold (driver-sources'
    `code_tokens_sha256`): moved (lines added above it) or with only a comment or spacing changed, it
    is the same code; edited, another. By those lines as written where they do not tokenize alone,
    by the line it starts on where no source is readable."""
    try:
        lines, _ = _inspect.getsourcelines(code)
    except (OSError, TypeError):
        return f"line {code.co_firstlineno}"
    text = "".join(lines)
    tokens = code_tokens_sha256(text)
    return "code " + (tokens or _hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest())[:12]


# Items a library keeps in the order of a set, which the process's string hash seed decides: diffusers'
# config (FrozenDict) lists the arguments left at their defaults as list(set(...) - set(...))
# (register_to_config), read by nothing a model computes. Spelled sorted, so every process spells alike.
_SET_ORDERED = {("diffusers.configuration_utils", "FrozenDict"): "_use_default_values"}


def _collection(value, kind, depth, set_ordered=None):
    if kind is dict:
        pairs = [(_spelled(key, depth + 1), _spelled(_in_order(item) if key == set_ordered else item, depth + 1))
                 for key, item in dict.items(value)]
        if any(key is None or item is None for key, item in pairs):
            return None
        return "{" + ", ".join(f"{key}: {item}" for key, item in pairs) + "}"
    items = [_spelled(item, depth + 1) for item in kind.__iter__(value)]
    if None in items:
        return None
    if kind in (set, frozenset):  # by its members, in an order of their own
        return f"{kind.__name__}({{{', '.join(sorted(items))}}})"
    inner = ", ".join(items)
    if kind is list:
        return f"[{inner}]"
    if kind is torch.Size:
        return f"torch.Size([{inner}])"
    return f"({inner},)" if len(items) == 1 else f"({inner})"


def _may_change(value):
    """Whether a value's spelling may change while it stays the same object: a list, dict or set (a
    subclass too), a numpy array, a partial (its keywords are a dict), a ContextVar (set again), a
    local function whose cells or defaults hold values, or a tuple holding any of these."""
    return (isinstance(value, (list, dict, set, _functools.partial, _contextvars.ContextVar)) or _is_numpy_array(value)
            or (isinstance(value, _types.FunctionType) and bool(_bound_values(value)))
            or (isinstance(value, tuple) and any(map(_may_change, tuple.__iter__(value)))))


def _read_items(value):
    """The objects a value's spelling reads besides the value itself, in a list (a set's members as a
    set: their order is free); None where the values it reads are not objects (a numpy array, a
    ContextVar's value in the calling context): spelled again."""
    if isinstance(value, _types.FunctionType):
        return _bound_values(value)
    if isinstance(value, dict):  # a subclass's own attributes too (`_own_attributes`)
        held = _instance_dict(value) if type(value) is not dict else None
        return [*dict.keys(value), *dict.values(value), *(held.keys() if held else ()), *(held.values() if held else ())]
    if isinstance(value, (set, frozenset)):
        return set((set if isinstance(value, set) else frozenset).__iter__(value))  # type: ignore[arg-type]
    if isinstance(value, list):
        return list(list.__iter__(value))
    if isinstance(value, tuple):
        return list(tuple.__iter__(value))
    if isinstance(value, _functools.partial):
        return [value.func, *value.args, *value.keywords, *value.keywords.values()]
    return None


def _equal_is_same(item):
    """Whether any object equal to `item` spells as it does: a str, or an object compared by identity."""
    kind = type(item)
    return kind is str or kind.__eq__ is object.__eq__


class _Contents:
    """What the spelling of a value that may change in place reads, held for a later call to compare in
    C instead of spelling the value again: its items (a dict's keys and values, a local function's cells
    and defaults), by equality where that tells as much as identity (strs, classes, functions), else by
    identity; and in turn the contents of each item that may change in place. A numpy array, whose
    values change under the same object, is spelled again."""

    __slots__ = ("items", "by_equality", "ids", "nested", "spelling")

    def __init__(self, value, depth=0):
        self.items = _read_items(value)
        self.spelling = spelled(value) if self.items is None else None
        self.by_equality = self.items is not None and all(map(_equal_is_same, self.items))
        self.ids = set(map(id, self.items)) if isinstance(self.items, set) else None
        self.nested = [(item, _Contents(item, depth + 1)) for item in (self.items or ()) if depth <= 8 and _may_change(item)]

    def same(self, value):
        """Whether `value` (the very object seen before) still spells as it did."""
        if self.items is None:
            return spelled(value) == self.spelling
        if isinstance(self.items, set):  # compared as the set it is (a copy would cost as much again)
            base = set if isinstance(value, set) else frozenset
            unchanged = base.__eq__(value, self.items) if self.by_equality else set(map(id, base.__iter__(value))) == self.ids
            return unchanged and all(contents.same(item) for item, contents in self.nested)
        now = _read_items(value)
        if self.by_equality:
            unchanged = now == self.items
        else:
            unchanged = len(now) == len(self.items) and all(map(_is, now, self.items))
        # The very items held: their own contents are compared on them.
        return unchanged and all(contents.same(item) for item, contents in self.nested)


def _bound_values(function):
    """What a function is spelled with besides its name: a local one's (a closure, a lambda) cells
    (_ABSENT for an empty one), then any function's defaults, which bind values as a closure does
    (`lambda t, s=s: t * s`; `def scaled(x, s=2.0)`, whose `__defaults__` a caller may set again; not
    torch's own functions'). A cell set again (`nonlocal`) changes a closure without changing the function."""
    defaults = [*(function.__defaults__ or ()), *(function.__kwdefaults__ or {}).values()]
    if "<" not in function.__qualname__:
        return [] if (function.__module__ or "torch").split(".")[0] == "torch" else defaults
    held = []
    for cell in function.__closure__ or ():
        try:
            held.append(cell.cell_contents)
        except ValueError:  # a cell not yet bound
            held.append(_ABSENT)
    return [*held, *defaults]


def _instance_dict(owner):
    """owner's instance dict, read without its class's __getattr__ (which may raise anything); None
    where it has none (a slotted object)."""
    try:
        return object.__getattribute__(owner, "__dict__")
    except (AttributeError, TypeError):
        return None


def _plainly_there(owner, name):
    """Whether getattr(owner, name) reads owner's instance dict: the value is the very object stored
    there under that name (a transformers config, whose __getattribute__ maps some names to others,
    maps none of these), and no data descriptor of the class could take the read over."""
    instance = _instance_dict(owner)
    if instance is None:
        return False
    if name not in instance or instance[name] is not getattr(owner, name, _ABSENT):
        return False
    return not any(hasattr(type(klass.__dict__[name]), "__set__") for klass in type(owner).__mro__ if name in klass.__dict__)


def _class_is_type(owner):
    """Whether owner.__class__ reads type(owner): no class of it but object defines __class__."""
    return getattr(owner, "__class__", None) is type(owner) and not any(
        "__class__" in klass.__dict__ for klass in type(owner).__mro__[:-1])


def _class_dicts(owner, name):
    """Where getattr(owner, name) finds what a full check read, when not in owner's instance dict, as
    (holder, name) pairs the next calls read instead, a holder a dict or a class for its dict (binding a method anew makes a new object each time;
    nn.Module's __getattr__ raises a new error for a missing name): owner's instance dict, which lacks
    it, and the dicts of its classes up to the one defining a method or a plain value (no descriptor);
    for a name an nn.Module lacks, every class dict and its parameters, buffers and submodules, which
    lack it too. Empty where getattr must read it."""
    instance = _instance_dict(owner)
    if instance is None or name in instance:
        return []
    watched = [(instance, name)]
    for klass in type(owner).__mro__:
        found = klass.__dict__.get(name, _ABSENT)
        watched.append((klass, name))
        if found is _ABSENT:
            continue
        if isinstance(found, _types.FunctionType):
            return watched
        plain = not hasattr(type(found), "__get__") and getattr(owner, name, _ABSENT) is found
        return watched if plain else []
    lookup = _lookup_kept_missing(owner, instance, name)
    return [] if lookup is None else watched + lookup


# A transformers config's __getattribute__ (PreTrainedConfig in transformers 5, PretrainedConfig before):
# a name in attribute_map reads the one it maps to, any other reads as object's lookup would.
_RENAMING_LOOKUPS = {("transformers.configuration_utils", f"{c}.__getattribute__") for c in ("PreTrainedConfig", "PretrainedConfig")}


def _lookup_kept_missing(owner, instance, name):
    """What else keeps a name owner lacks (in its instance and class dicts) missing, by how its class
    looks names up, as (holder, name) pairs: every class's __getattr__ and __getattribute__ entries
    (their functions, or their absence), and for nn.Module's __getattr__ its parameters, buffers and
    submodules, for a transformers config's __getattribute__ the attribute_map it renames through;
    None for a lookup only running it tells (getattr must read the name)."""
    klasses = type(owner).__mro__[:-1]
    hooks = [(klass, hook) for klass in klasses for hook in ("__getattr__", "__getattribute__")]
    get, get_missing = type(owner).__getattribute__, getattr(type(owner), "__getattr__", None)
    if get is object.__getattribute__ and get_missing is None:
        return hooks
    if get is object.__getattribute__ and get_missing is torch.nn.Module.__getattr__:
        tables = [instance.get(table) for table in ("_parameters", "_buffers", "_modules")]
        return hooks + [(table, name) for table in tables] if all(type(t) is dict for t in tables) else None
    if get_missing is None and (getattr(get, "__module__", None), getattr(get, "__qualname__", None)) in _RENAMING_LOOKUPS:
        held = next((klass for klass in klasses if "attribute_map" in klass.__dict__), None)
        renames = instance.get("attribute_map", held and held.__dict__["attribute_map"])
        if type(renames) is not dict or name in renames:
            return None
        where = [(instance, "attribute_map"), (renames, name)]
        return hooks + where + ([(held, "attribute_map")] if held is not None else [])
    return None


def _autocast(device):
    return lambda: torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else False


# torch's global state a trace is specialized on, by the name SPECIALIZED records it under.
GLOBAL_STATE = {
    "grad_mode": torch.is_grad_enabled,
    "inference_mode": torch.is_inference_mode_enabled,
    "default_dtype": torch.get_default_dtype,
    "deterministic_algorithms": torch.are_deterministic_algorithms_enabled,
    "autocast_cpu": _autocast("cpu"),
    "autocast_cuda": _autocast("cuda"),
}

_ABSENT = object()
REQUIRES_GRAD = "requires_grad"
"""The SPECIALIZED global-state record of each graph input's requires_grad (parameters, buffers, then
tensor inputs), where fn's code read one: a branch on it is fixed by the trace."""
MODULE_HOOKS = "module_hooks"
"""The SPECIALIZED global-state record of the hooks the model's modules (and nn.Module's global hook
tables) held at capture, and of any forward set on a module instance: the trace ran them, the served
graph holds what they did and calls none."""
_HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


# nn.Module's global hook tables: module-level dicts, registered into and removed from in place.
_GLOBAL_HOOKS = [(name, getattr(torch.nn.modules.module, "_global" + name, {})) for name in _HOOK_TABLES]


def _hook_name(hook):
    return f"{getattr(hook, '__module__', None) or '?'}.{getattr(hook, '__qualname__', None) or type(hook).__name__}"


def argument_spelling(slot):
    """A module argument as fn's caller spells it: `args[0]` by position, `kwargs['model']` by keyword."""
    return f"kwargs[{slot!r}]" if isinstance(slot, str) else f"args[{slot}]"


def specialized_source(record):
    """Where a SPECIALIZED value is read, as the user would spell it."""
    kind = record["kind"]
    if kind == "global_state":
        return f"torch global state {record['name']}"
    if kind == "attribute":
        return ".".join([argument_spelling(record.get("keyword") or record["arg"]), *([record["module"]] if record.get("module") else []),
                         *record.get("chain", ()), record["name"]])
    if kind == "global":
        return f"global {record['module']}.{record['name']}"
    return f"closure cell {record['name']} of {record['module']}"


def module_hooks(modules, slots):
    """The hooks a call of `modules` (the module arguments, at `slots`: positions, then keywords) would
    run, spelled: "none", or each hook by where it is registered, its kind and its function's qualified name."""
    found = [f"global {name.strip('_')[:-1].replace('_', ' ')} {_hook_name(hook)}"
             for name, table in _GLOBAL_HOOKS for hook in table.values()]
    for slot, module in zip(slots, modules):
        for path, owner in module.named_modules(remove_duplicate=False):
            where = f"{argument_spelling(slot)}{'.' + path if path else ''}"
            for name in _HOOK_TABLES:
                found += [f"{where} {name.strip('_')[:-1].replace('_', ' ')} {_hook_name(hook)}"
                          for hook in getattr(owner, name, {}).values()]
            forward = (_instance_dict(owner) or {}).get("forward")
            if forward is not None:  # set on the instance (accelerate's hooks do so): it runs instead of its class's
                found.append(f"{where} forward {_hook_name(forward)}")
    return "; ".join(found) or "none"


def _hook_ids(owner):
    """The handle ids of `owner`'s hooks (ids only grow, so a hook replaced by another changes them),
    and the id of a forward set on the instance."""
    ids = ()
    for name in _HOOK_TABLES:
        table = getattr(owner, name, None)
        if table:
            ids += tuple(table)
    forward = owner.__dict__.get("forward")
    return ids if forward is None else (*ids, id(forward))


class _ReadPlan:
    """Where the values a full check read live, for later calls to read them again in C: an entry of an
    instance dict (or of a class dict, for a method: the dicts before the defining class must stay
    without it), an object's class by type() where nothing overrides __class__, else by getattr."""

    def __init__(self, places):
        self.dicts: list = []
        self.keys: list = []
        self.absent_dicts: list = []  # (with absent_keys) entries that must stay absent
        self.absent_keys: list = []
        self.typed: list = []
        self.owners: list = []
        self.names: list = []
        entries: dict = {}  # (id of a holder, key) watched, holding the holder so its id stays its own
        for owner, name in places:
            if _plainly_there(owner, name):
                self.dicts.append(_instance_dict(owner))
                self.keys.append(name)
            elif name == "__class__" and _class_is_type(owner):
                self.typed.append(owner)
            elif watched := _class_dicts(owner, name):
                for holder, key in watched:
                    if (id(holder), key) in entries:  # a class many owners share: watched once
                        continue
                    entries[id(holder), key] = holder
                    where = holder.__dict__ if isinstance(holder, type) else holder
                    (self.dicts if key in where else self.absent_dicts).append(where)
                    (self.keys if key in where else self.absent_keys).append(key)
            else:
                self.owners.append(owner)
                self.names.append(name)
        self.defaults = [_ABSENT] * len(self.owners)

    def values(self):
        """The values read now, in a fixed order; None where a dict no longer holds one."""
        try:
            return [*map(_getitem, self.dicts, self.keys), *map(type, self.typed),
                    *map(getattr, self.owners, self.names, self.defaults)]
        except KeyError:
            return None

    def still_absent(self):
        return not any(map(_contains, self.absent_dicts, self.absent_keys))
