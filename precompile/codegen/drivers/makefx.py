# Driver of a MakeFxTracer artifact (precompile/codegen/drivers/makefx.py, included verbatim).
# It checks a call against the captured calling convention, runs the captured graph on the
# runtime model's parameters and buffers, scatters parameter gradients like eager .backward(),
# and rebuilds fn's result. It also checks the Python values the trace read besides tensors
# (SPECIALIZED): torch's global state, attributes of the model, module globals.
import enum as _enum
import functools as _functools
import gc as _gc
import hashlib as _hashlib
import importlib as _importlib
import sys as _sys
import types as _types
import warnings as _warnings
from operator import contains as _contains
from operator import getitem as _getitem
from operator import is_ as _is

import torch
import torch.utils._pytree as _pytree
from torch._C._dynamo.guards import TensorGuards as _TensorGuards

try:
    from precompile.errors import CallMismatch, PrecompileWarning
except ImportError:  # served where only torch is installed: twins of the same names

    class PrecompileError(RuntimeError):
        pass

    class CallMismatch(PrecompileError):
        pass

    class PrecompileWarning(UserWarning):
        pass


def spelled(value):
    """The spelling a specialized value is recorded and compared by (None: not comparable). Two
    values that spell alike behave alike where a trace could have read them: 1, 1.0 and True differ;
    tuples, lists and dicts of such values spell by their items, in order, sets by their members (a
    subclass, a namedtuple or an attribute-style dict, also by its class; a namedtuple by its fields);
    a class by its qualified name, a function or a bound method by its qualified name and the values
    it closes over (a partial by its function and arguments); a numpy scalar by its type and value, a
    numpy array by its dtype, shape and values. A spelling over 256 characters is kept as its length
    and sha256 (python_code stays readable; the comparison stays exact)."""
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
    if isinstance(value, _enum.Enum):
        return f"{kind.__module__}.{kind.__qualname__}.{value.name}"
    if isinstance(value, type):
        return f"class {value.__module__}.{value.__qualname__}"
    if kind in (_types.FunctionType, _types.BuiltinFunctionType):
        return _function(value, depth)
    if kind is _types.MethodType:
        return "method " + _function(value.__func__, depth).removeprefix("function ")
    if kind is _functools.partial and depth <= 8:
        parts = [_spelled(value.func, depth + 1), *(_spelled(a, depth + 1) for a in value.args),
                 *(None if v is None else f"{k}={v}" for k, v in ((k, _spelled(a, depth + 1)) for k, a in value.keywords.items()))]
        return None if None in parts else f"partial({', '.join(parts)})"
    if kind.__module__ == "numpy" and hasattr(value, "item") and getattr(value, "shape", None) == ():
        return f"numpy.{kind.__name__}({value.item()!r})"
    if _is_numpy_array(value):
        return _numpy_array(value)
    if depth > 8:
        return None  # a list holding itself, or nesting deeper than one goes
    return _container(value, kind, depth)


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
        inner = _collection(value, base, depth)
    return None if inner is None else f"{kind.__module__}.{kind.__qualname__}({inner})"


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
    """A function by its qualified name; one defined inside another (a lambda, a closure) also by the
    line it starts on, since such names repeat, and by the values it closes over (nested as deep as a
    collection goes: a closure that names itself is spelled once)."""
    name = f"function {getattr(value, '__module__', None) or '?'}.{getattr(value, '__qualname__', None) or value.__name__}"
    code = getattr(value, "__code__", None)
    if code is None or "<" not in name:
        return name
    if depth > 8 or not isinstance(value, _types.FunctionType):
        return f"{name} (line {code.co_firstlineno})"
    labels = [*(f"{free}=" for free in code.co_freevars[:len(value.__closure__ or ())]),
              *("default " for _ in value.__defaults__ or ()), *(f"default {k}=" for k in value.__kwdefaults__ or {})]
    bound = []
    for label, held in zip(labels, _bound_values(value)):
        spelling = "unbound" if held is _ABSENT else _spelled(held, depth + 1)
        bound.append(f"{label}{spelling if spelling is not None else 'a ' + type(held).__name__}")
    return f"{name} (line {code.co_firstlineno})" + (f" closing over {', '.join(bound)}" if bound else "")


def _collection(value, kind, depth):
    if kind is dict:
        pairs = [(_spelled(key, depth + 1), _spelled(item, depth + 1)) for key, item in dict.items(value)]
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
    subclass too), a numpy array, a partial (its keywords are a dict), a local function whose cells or
    defaults hold values, or a tuple holding any of these."""
    return (isinstance(value, (list, dict, set, _functools.partial)) or _is_numpy_array(value)
            or (isinstance(value, _types.FunctionType) and bool(_bound_values(value)))
            or (isinstance(value, tuple) and any(map(_may_change, tuple.__iter__(value)))))


def _read_items(value):
    """The objects a value's spelling reads besides the value itself, in a list (a set's members as a
    set: their order is free); None where the values it reads are not objects (a numpy array)."""
    if isinstance(value, _types.FunctionType):
        return _bound_values(value)
    if isinstance(value, dict):
        return [*dict.keys(value), *dict.values(value)]
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
    """What a local function (a closure, a lambda) is spelled with besides its name: what its cells
    hold (_ABSENT for an empty one), then its defaults, which bind values as a closure does (`lambda t,
    s=s: t * s`). A cell set again (`nonlocal`) changes a closure without changing the function. A
    module-level function is spelled, and so compared, by its name alone: empty."""
    if "<" not in function.__qualname__:
        return []
    held = []
    for cell in function.__closure__ or ():
        try:
            held.append(cell.cell_contents)
        except ValueError:  # a cell not yet bound
            held.append(_ABSENT)
    return [*held, *(function.__defaults__ or ()), *(function.__kwdefaults__ or {}).values()]


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


def module_hooks(modules, positions):
    """The hooks a call of `modules` (the module arguments, at `positions`) would run, spelled: "none",
    or each hook by where it is registered, its kind and its function's qualified name."""
    found = [f"global {name.strip('_')[:-1].replace('_', ' ')} {_hook_name(hook)}"
             for name, table in _GLOBAL_HOOKS for hook in table.values()]
    for position, module in zip(positions, modules):
        for path, owner in module.named_modules(remove_duplicate=False):
            where = f"args[{position}]{'.' + path if path else ''}"
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


def specialized_source(record):
    """Where a SPECIALIZED value is read, as the user would spell it."""
    kind = record["kind"]
    if kind == "global_state":
        return f"torch global state {record['name']}"
    if kind == "attribute":
        return ".".join([f"args[{record['arg']}]", *([record["module"]] if record.get("module") else []),
                         *record.get("chain", ()), record["name"]])
    if kind == "global":
        return f"global {record['module']}.{record['name']}"
    return f"closure cell {record['name']} of {record['module']}"


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


class _Specialized:
    """The Python values the trace read besides tensors, checked before each call. A full check
    finds where each lives and compares its spelling, naming what differs; until the model changes,
    later calls compare the values themselves with the ones the full check saw."""

    def __init__(self, records, module_positions):
        self.records = [r for r in records if r.get("checked", True) and r["name"] != REQUIRES_GRAD]
        self.module_positions = list(module_positions)
        self.state = [GLOBAL_STATE[r["name"]] for r in self.records if r["kind"] == "global_state" and r["name"] in GLOBAL_STATE]
        self.state_seen = None
        self.plan = None  # the _ReadPlan of the last full check
        self.seen: list = []  # the values it read
        self.contents = []  # (index into the values, the _Contents of one that may change in place)

    def unchanged(self):
        """Whether every checked value is still the very object the last full check saw (a list or
        dict, which may change in place: still spelled alike). A value set again, even to an equal
        one, takes the full check."""
        if self.plan is None or [get() for get in self.state] != self.state_seen:
            return False
        values = self.plan.values()
        return (values is not None and all(map(_is, values, self.seen)) and self.plan.still_absent()
                and all(contents.same(self.seen[i]) for i, contents in self.contents))

    def check(self, modules, fail):
        """Compare every checked value with its captured spelling; remember where they live."""
        places: list = []
        for record in self.records:
            where = specialized_source(record)
            if record["kind"] == "global_state" and record["name"] == MODULE_HOOKS:
                now = module_hooks(modules, self.module_positions)
                if now != record["value"]:
                    fail(f"the model's hooks are {now} but the artifact was captured with {record['value']} (the trace ran "
                         "those; a served call runs its graph, which calls no hook)",
                         "remove the hooks added since (handle.remove()) or register the captured ones, or capture again "
                         "with them (DynamoTracer guards on hooks)")
                continue
            if record["kind"] == "global_state":
                value = GLOBAL_STATE[record["name"]]()
            elif record["kind"] == "global":
                value = self.global_value(record, fail, places)
            else:
                owner = self.owner_of(record, modules, places)
                value = _ABSENT if owner is _ABSENT else getattr(owner, record["name"], _ABSENT)
                if owner is not _ABSENT:
                    places.append((owner, record["name"]))
            now = "missing" if value is _ABSENT else spelled(value) or f"a {type(value).__name__}"
            if now == record["value"]:
                continue
            if record["kind"] == "global_state":
                fail(f"{where} is {now} but the artifact was captured under {record['value']} (its graph is specialized "
                     "on it)", "serve it under the captured state (e.g. torch.no_grad() for grad_mode False), or capture again")
            fail(f"{where} is {now} but the artifact was captured with {record['value']} (the trace read it, so its "
                 "graph is specialized on that value)", "set it back, or capture again with this value")
        self.plan = _ReadPlan(places)
        self.seen = self.plan.values() or []
        self.contents = [(i, _Contents(value)) for i, value in enumerate(self.seen) if _may_change(value)]
        self.state_seen = [get() for get in self.state]

    def owner_of(self, record, modules, places):
        try:
            owner = modules[self.module_positions.index(record["arg"])]
            if record.get("module"):
                owner = owner.get_submodule(record["module"])
        except (ValueError, AttributeError):
            return _ABSENT
        for name in record.get("chain", ()):
            found = getattr(owner, name, _ABSENT)
            if found is _ABSENT:
                return _ABSENT
            places.append((owner, name))  # the object itself is checked too: a new config is checked in full
            owner = found
        return owner

    def global_value(self, record, fail, places):
        """A module's global, or a torch class's method (`LayerNorm.forward`), read on its class."""
        owner = self.module_of(record, fail)
        head, _, name = record["name"].rpartition(".")
        if head:
            places.append((owner, head))
            owner = getattr(owner, head, _ABSENT)
        places.append((owner, name))
        return getattr(owner, name, _ABSENT)

    @staticmethod
    def module_of(record, fail):
        name = record["module"]
        module = _sys.modules.get(name)
        if module is None:
            try:
                module = _importlib.import_module(name)
            except Exception as exc:  # any failure of the user's module to import
                fail(f"cannot check {specialized_source(record)} (captured {record['value']}): importing {name} failed "
                     f"({type(exc).__name__}: {exc})", "make that module importable where the artifact serves")
        return module


def _dtype(name):
    return getattr(torch, name.removeprefix("torch."))


def _shape_text(shape):
    return "(" + ", ".join("*" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _one_line(spec):
    return " ".join(str(spec).split())


def _state_slots(modules):
    """(kind, name, owning module, key, tensor) of every parameter then buffer, as named_parameters /
    named_buffers(remove_duplicate=False) list them; names get an `m{i}.` prefix for several modules."""
    prefix = len(modules) > 1
    for kind, attribute in (("param", "_parameters"), ("buffer", "_buffers")):
        for slot, module in enumerate(modules):
            for path, owner in module.named_modules(remove_duplicate=False):
                for key, tensor in getattr(owner, attribute).items():
                    if tensor is None:
                        continue
                    name = f"{path}.{key}" if path else key
                    yield kind, (f"m{slot}.{name}" if prefix else name), owner, key, tensor


def collect_params_and_buffers(modules):
    """Parameters then buffers of `modules`, each tensor once under its first name (tied weights)."""
    seen = set()
    params: list = []
    buffers: list = []
    for kind, name, _, _, tensor in _state_slots(modules):
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        (params if kind == "param" else buffers).append((name, tensor))
    return params, buffers


class _StatePlan:
    """Where each parameter and buffer of a validated model lives, to fetch them again cheaply.

    `gather` returns the tensors in the captured order, or None when the model's structure may have
    changed (a submodule replaced, a tensor added, removed or untied, a hook registered or removed):
    the caller then re-validates.
    """

    def __init__(self, modules):
        self.modules = list(modules)
        self.owners = []  # (module, children ids, number of params, number of buffers)
        for module in self.modules:
            for _, owner in module.named_modules(remove_duplicate=False):
                self.owners.append((owner, tuple(map(id, owner._modules.values())),
                                    len(owner._parameters), len(owner._buffers), _hook_ids(owner)))
        self.global_hooks = [tuple(table) for _, table in _GLOBAL_HOOKS]
        first: dict = {}
        self.fetch: list = []  # (owner dict, key) of each distinct tensor
        self.ties = []  # (owner dict, key, index into fetch) of each repeat of a tied tensor
        for _, _, owner, key, tensor in _state_slots(self.modules):
            table = owner._parameters if key in owner._parameters else owner._buffers
            if id(tensor) in first:
                self.ties.append((table, key, first[id(tensor)]))
            else:
                first[id(tensor)] = len(self.fetch)
                self.fetch.append((table, key))

    def gather(self, modules):
        if len(modules) != len(self.modules) or any(a is not b for a, b in zip(modules, self.modules)):
            return None
        for owner, children, n_params, n_buffers, hook_ids in self.owners:
            if (len(owner._parameters) != n_params or len(owner._buffers) != n_buffers
                    or tuple(map(id, owner._modules.values())) != children or _hook_ids(owner) != hook_ids):
                return None
        if [tuple(table) for _, table in _GLOBAL_HOOKS] != self.global_hooks:
            return None
        try:
            tensors = [table[key] for table, key in self.fetch]
            if any(table[key] is not tensors[index] for table, key, index in self.ties):
                return None
        except KeyError:
            return None
        if any(t is None for t in tensors):
            return None
        return tensors


class _TensorCheck:
    __slots__ = ("path", "shape", "dims", "dtype", "device", "stride")

    def __init__(self, path, shape, dtype, device, stride=None):
        self.path = path
        self.shape = tuple(shape)
        self.dims = None if None not in shape else tuple(i for i, d in enumerate(shape) if d is not None)
        self.dtype = _dtype(dtype)
        self.device = torch.device(device)
        # Strides matter only where a dim has more than one element and a fixed size.
        self.stride = None if stride is None else tuple(
            (i, s) for i, (s, d) in enumerate(zip(stride, shape)) if s is not None and d is not None and d > 1
        )

    def problem(self, value):
        if not isinstance(value, torch.Tensor):
            return f"expected a tensor, got {type(value).__name__}"
        if self.dims is None:
            if value.shape != self.shape:
                return f"expected shape {_shape_text(self.shape)}, got {_shape_text(tuple(value.shape))}"
        elif value.dim() != len(self.shape) or any(value.shape[i] != self.shape[i] for i in self.dims):
            return f"expected shape {_shape_text(self.shape)} (* = any size), got {_shape_text(tuple(value.shape))}"
        if value.dtype != self.dtype:
            return f"expected dtype {self.dtype}, got {value.dtype}"
        if value.device != self.device:
            return f"expected device {self.device}, got {value.device}"
        if self.stride:
            actual = value.stride()
            if any(actual[i] != s for i, s in self.stride):
                return (f"expected the captured memory layout (strides {_shape_text(tuple(s for _, s in self.stride))} "
                        f"on dims {[i for i, _ in self.stride]}), got strides {_shape_text(actual)}")
        return None


def build_forward(metadata, run_graph, artifact="this artifact", autograd_graph=None, no_autograd=None):
    """The served `forward(*args)` of an artifact whose metadata literals are in `metadata`.

    `run_graph(*params, *buffers, *tensor_inputs)` runs the captured graph and returns its flat
    outputs: fn's tensor results, then the gradients of GRAD_PARAM_INDICES. `autograd_graph`, called
    alike, runs it as ATen ops autograd records, for a forward's calls that autograd would record
    (run_graph itself for the eager backend; None: such calls are refused). `no_autograd`: (why
    there is none, whether eager's result carries autograd in any grad mode, fn turning grad on).
    """
    return _ServedForward(metadata, run_graph, artifact, autograd_graph, no_autograd)


class _ServedForward:
    """One artifact's forward: checks a call against the calling convention, runs the graph, and
    rebuilds fn's result. The first call that passes every check (in Python, naming what differs)
    leaves a C++ check of exactly those tensors' metadata that later calls pass through instead."""

    def __init__(self, metadata, run_graph, artifact, autograd_graph=None, no_autograd=None):
        self.run_graph = run_graph
        self.autograd_graph = autograd_graph
        self.no_autograd = no_autograd or ("it keeps no ATen graph to record them", False)
        self.warned_autograd = False
        self.capturing = False  # set on the capture's own served forward
        self.requires_grad = next((r["value"] for r in metadata.get("SPECIALIZED", ())
                                   if r["kind"] == "global_state" and r["name"] == REQUIRES_GRAD), None)
        self.artifact = artifact
        self.num_args = metadata["NUM_POSITIONAL_ARGS"]
        self.module_positions = tuple(metadata["MODULE_POSITIONS"])
        self.expected_names = [p["name"] for p in metadata["PARAMS"]] + [b["name"] for b in metadata["BUFFERS"]]
        self.state_checks = [_TensorCheck(t["name"], t["shape"], t["dtype"], t["device"], t.get("stride"))
                             for t in (*metadata["PARAMS"], *metadata["BUFFERS"])]
        self.in_spec = _pytree.treespec_loads(metadata["IN_SPEC"])
        # The inputs are a dict of the positional args by position, then the keywords by name.
        self.keywords = tuple(key for key in self.in_spec.context if isinstance(key, str))
        self.keyword_set = frozenset(self.keywords)
        self.out_spec = _pytree.treespec_loads(metadata["OUT_SPEC"])
        # A tensor input's check, or (path, value) of a non-tensor input baked into the graph.
        self.input_checks = [
            _TensorCheck(leaf["path"], leaf["shape"], leaf["dtype"], leaf["device"], leaf.get("stride"))
            if leaf["kind"] == "tensor" else (leaf["path"], leaf["value"])
            for leaf in metadata["INPUTS"]
        ]
        self.tensor_checks = [c for c in self.input_checks if isinstance(c, _TensorCheck)]
        self.outputs = [leaf if leaf["kind"] == "constant" else None for leaf in metadata["OUTPUTS"]]
        self.grad_indices = tuple(metadata["GRAD_PARAM_INDICES"])
        # Dims marked with mark_unbacked: (tensor input index, dim, its spec, path), checked on every call
        # since a size is free there only within its bounds and equal to the dims sharing its symbol.
        self.unbacked = [(index, dim, spec, leaf["path"])
                         for index, leaf in enumerate(leaf for leaf in metadata["INPUTS"] if leaf["kind"] == "tensor")
                         for dim, spec in (leaf.get("unbacked") or {}).items()]
        self.dynamic_sizes = [list(c.shape) for c in (*self.state_checks, *self.tensor_checks)]
        self.specialized = _Specialized(metadata.get("SPECIALIZED", ()), self.module_positions)
        self.trusted = None  # (the model's _StatePlan, the C++ guards) of the last call that passed every check

    def fail(self, message, remedy):
        raise CallMismatch(f"{self.artifact}: {message}; {remedy}")

    def __call__(self, *args, **kwargs):
        modules, tensors = self.arguments(args, kwargs)
        state_tensors = None
        if self.trusted is not None:
            plan, guards = self.trusted
            state_tensors = plan.gather(modules)
            if state_tensors is not None and not (guards.check(*state_tensors, *tensors) and self.specialized.unchanged()):
                state_tensors = None
        if state_tensors is None:
            # First call, a changed model or a mismatch: check everything, then trust it again. The
            # checks build long-lived objects, a few per parameter and no cycle: as during load, the
            # cyclic collector waits rather than pay, in the middle of the first call, the full pass
            # over torch's objects that the process's import and model build have run up.
            collecting = _gc.isenabled()
            _gc.disable()
            try:
                state_tensors = self.validate(modules, tensors)
            finally:
                if collecting:
                    _gc.enable()
        if self.unbacked:
            self.check_unbacked(tensors)
        return self.run(state_tensors, tensors)

    def arguments(self, args, kwargs):
        """The model arguments and the tensor inputs of a call, its structure and constants checked."""
        if kwargs.keys() != self.keyword_set:
            missing = [name for name in self.keywords if name not in kwargs]
            extra = [name for name in kwargs if name not in self.keywords]
            self.fail(f"got keyword arguments {list(kwargs)} but the artifact was captured with {list(self.keywords)} "
                      f"(missing {missing}, unexpected {extra})", "pass the captured call's keyword arguments, by name")
        if len(args) != self.num_args:
            self.fail(f"expected {self.num_args} positional arguments, got {len(args)}", "call it with the captured call's arguments")
        modules = []
        for position in self.module_positions:
            if not isinstance(args[position], torch.nn.Module):
                self.fail(f"argument {position} must be an nn.Module (the captured call passed one there), got {type(args[position]).__name__}",
                          "pass the model in the same position")
            modules.append(args[position])
        leaves, spec = _pytree.tree_flatten({**{i: a for i, a in enumerate(args) if i not in self.module_positions},
                                             **{name: kwargs[name] for name in self.keywords}})
        if spec != self.in_spec:
            self.fail(f"the inputs have structure {_one_line(spec)} but the artifact was captured with {_one_line(self.in_spec)}",
                      "pass inputs with the captured structure")
        tensors = []
        for check, value in zip(self.input_checks, leaves):
            if isinstance(check, tuple):
                if type(value) is not type(check[1]) or value != check[1]:  # a tensor or array compares elementwise
                    self.fail(f"input {check[0]} is {value!r} but the artifact was captured with {check[1]!r} (non-tensor inputs are baked into the graph)",
                              "pass the captured value, or capture again with this one")
                continue
            if not isinstance(value, torch.Tensor):
                self.fail(f"input {check.path}: expected a tensor, got {type(value).__name__}", "pass a tensor there")
            tensors.append(value)
        return modules, tensors

    def validate(self, modules, tensors):
        """The full checks, in Python: a CallMismatch that names the tensor and the difference. Returns
        the model's parameters and buffers in the captured order, and keeps the checks' C++ twin."""
        for check, value in zip(self.tensor_checks, tensors):
            problem = check.problem(value)
            if problem is not None:
                self.fail(f"input {check.path}: {problem}", "pass an input like the captured one, or capture again with this one")
        params, buffers = collect_params_and_buffers(modules)
        state = params + buffers
        names = [name for name, _ in state]
        if names != self.expected_names:
            missing = [n for n in self.expected_names if n not in names]
            extra = [n for n in names if n not in self.expected_names]
            self.fail(f"the model's parameters and buffers {names} differ from the captured {self.expected_names} (missing {missing}, unexpected {extra})",
                      "pass a model with the captured structure")
        for check, (_, tensor) in zip(self.state_checks, state):
            problem = check.problem(tensor)
            if problem is not None:
                self.fail(f"model tensor {check.path}: {problem}", "pass a model with the captured structure")
        self.specialized.check(modules, self.fail)
        state_tensors = [t for _, t in state]
        if self.requires_grad is not None:
            now = spelled(tuple(t.requires_grad for t in (*state_tensors, *tensors)))
            if now != self.requires_grad:
                self.fail(f"the tensors' requires_grad are {now} (parameters, buffers, then inputs) but the artifact was "
                          f"captured with {self.requires_grad} (fn's code read requires_grad, so its graph is specialized "
                          "on it)", "set requires_grad back, or capture again with these")
        flat_tensors = [*state_tensors, *tensors]
        # The C++ check of exactly these tensors' metadata, with the dims that may vary left free.
        strides = [list(t.stride()) if c.stride is not None else [None] * t.dim()
                   for c, t in zip((*self.state_checks, *self.tensor_checks), flat_tensors)]
        # torch's stub types each of these as one tensor's dims; TensorGuards takes a list per tensor.
        guards = _TensorGuards(*flat_tensors, dynamic_dims_sizes=self.dynamic_sizes,  # type: ignore[arg-type]
                               dynamic_dims_strides=strides)  # type: ignore[arg-type]
        self.trusted = (_StatePlan(modules), guards)
        return state_tensors

    def check_unbacked(self, tensors):
        sizes: dict = {}
        for index, dim, spec, path in self.unbacked:
            size = tensors[index].shape[dim]
            low, high = spec.get("min"), spec.get("max")
            if (low is not None and size < low) or (high is not None and size > high):
                self.fail(f"input {path} has size {size} in dim {dim}, outside the mark_unbacked bounds [{low}, {high}]",
                          "pass a size within the bounds it was captured with")
            other = sizes.setdefault(spec["symbol"], (size, path, dim))
            if other[0] != size:
                self.fail(f"input {path} has size {size} in dim {dim} but {other[1]} has {other[0]} in dim {other[2]}; "
                          f"they were marked with shape_id {spec.get('shape_id')!r}, so the artifact assumes they are equal",
                          "pass inputs whose marked dims agree")

    def run(self, state_tensors, tensors):
        """Run the graph, scatter the parameter gradients it computed as eager .backward() would, and
        rebuild fn's result. A forward's call that autograd would record (grad mode on and a tensor it
        takes requiring grad) runs as ATen ops autograd records, so its results carry autograd as
        eager's do."""
        if not self.grad_indices and (torch.is_grad_enabled() or (self.no_autograd[1] and not torch.is_inference_mode_enabled())) and (
                any(t.requires_grad for t in tensors) or any(t.requires_grad for t in state_tensors)):
            graph = self.recording_autograd()
            if graph is not None:
                results = iter(graph(*state_tensors, *tensors))
                return _pytree.tree_unflatten([next(results) if leaf is None else leaf["value"] for leaf in self.outputs],
                                              self.out_spec)
        with torch.no_grad():
            flat = self.run_graph(*state_tensors, *tensors)
            n_results = len(flat) - len(self.grad_indices)
            for index, grad in zip(self.grad_indices, flat[n_results:]):
                param = state_tensors[index]
                if param.grad is None:
                    param.grad = grad
                else:
                    param.grad += grad
        results = iter(flat[:n_results])
        out_leaves = [next(results) if leaf is None else leaf["value"] for leaf in self.outputs]
        return _pytree.tree_unflatten(out_leaves, self.out_spec)

    def recording_autograd(self):
        """The graph that runs a call autograd records; the first such call of a compiled artifact says
        it runs at eager speed."""
        if self.autograd_graph is None and self.capturing:
            _warnings.warn(f"{self.artifact}: the capture's result carries no autograd, and a served call that autograd "
                           f"records will be refused: {self.no_autograd[0]}", PrecompileWarning, stacklevel=5)
            return None
        if self.autograd_graph is None:
            self.fail("this call would record autograd (a parameter, buffer or input requires grad, under grad mode or "
                      f"where fn turns it on), but the artifact cannot record it as eager does: {self.no_autograd[0]}",
                      "call it under torch.inference_mode() (or torch.no_grad(), where fn does not turn grad on), or turn "
                      "requires_grad off; for gradients through it, capture with DynamoTracer")
        if self.autograd_graph is not self.run_graph and not self.warned_autograd:
            self.warned_autograd = True
            _warnings.warn(
                f"{self.artifact}: this call records autograd (grad mode is on and a parameter or input requires grad), so "
                "it runs the captured ATen graph, whose results carry autograd as eager's do, at eager speed; call it "
                "under torch.inference_mode() or torch.no_grad() to run the compiled kernels",
                PrecompileWarning, stacklevel=4)
        return self.autograd_graph
