"""What a MakeFx trace read besides its tensors, noted while it runs, so the artifact can check it.

A make_fx trace runs fn's Python once and keeps only the tensor ops: every Python value that code
read along the way (a module's `self.scale`, `self.training`, `self.mode` behind an `if`, a module
global `FLAG`, a config object's flag) is frozen into the graph. `recording()` notes those reads
with a call-only `sys.settrace` hook (no line events; a trace function installed before, such as
coverage's, keeps running): on each call of a code object outside torch, precompile and the
standard library, it reads what that code loads, statically, from the frame's arguments:

- attribute chains rooted at an argument (`self.scale`, `self.config.use_cache`, `model.mode`) whose
  root is a module argument, one of its submodules, or a plain object reached from one, looked up
  as plain data (instance dicts and class attributes; a property is not run here: its own frame is
  noted when the trace runs it);
- the globals (`LOAD_GLOBAL`) and closure cells (`LOAD_DEREF`) it loads.

Only values `spelled` can compare are kept. Every loading instruction of a code object that ran
counts, taken branches or not: a check too many refuses a call only when that value changed.
"""
from __future__ import annotations

import contextlib
import dis
import enum
import gc
import sys
import types
from collections import Counter
from dataclasses import dataclass, field

import torch

from precompile.capturing.makefx.class_reads import note_calls, note_property
from precompile.capturing.makefx.code_origins import in_trace, skipped
from precompile.capturing.makefx.registries import global_spelling
from precompile.codegen.drivers.makefx_reads import spelled

_MAX_CHAIN = 8
"""How many attributes one chain is followed through (self.config.text_config.flag)."""
_MISSING = object()
_ABSENT = object()


@dataclass(frozen=True, order=True)
class Owner:
    """Where an object sits: the position (or keyword) of the module argument, the submodule's name,
    then the attributes of plain objects below it."""

    arg: int | str
    module: str
    chain: tuple[str, ...] = ()


@dataclass
class ReadLog:
    attributes: dict[tuple[Owner, str], str] = field(default_factory=dict)
    """(owner, attribute) -> the spelling of the value the first call that loaded it saw."""
    globals: dict[tuple[str, str], str] = field(default_factory=dict)
    """(module name, global name) -> the spelling of its value, for globals of the code that ran."""
    globals_of: dict[str, dict | types.ModuleType] = field(default_factory=dict)
    """module name -> its globals dict, or the module where its value is read by getattr (a
    torch.backends flag), to read the values again once the trace is done."""
    closures: dict[tuple[str, str], str] = field(default_factory=dict)
    """(function's qualified name, free variable) -> the spelling of the value its first call saw."""
    owners: dict[int, tuple[Owner, object]] = field(default_factory=dict)
    """id -> (owner, the object itself) of every object attributes were noted on."""
    state: set[str] = field(default_factory=set)
    """The global state (GLOBAL_STATE names) code the trace ran asks for: `torch.is_grad_enabled()`."""
    codes: dict[types.CodeType, str] = field(default_factory=dict)
    """Each code object the trace ran outside torch, precompile and the standard library -> the name of
    its frame's module: its source is hashed (capturing/inlined_files.ran_sources)."""


@dataclass(frozen=True)
class _Loads:
    """What one code object loads: attribute chains rooted at an argument, globals, free variables."""

    chains: tuple[tuple[str, tuple[str, ...]], ...]
    globals: tuple[str, ...]
    free: tuple[str, ...]
    probes: tuple[tuple[int, str], ...] = ()
    """(offset, GLOBAL_STATE name) of each load of a STATE_PROBES function: noted when it runs."""
    optional: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Chains whose last name getattr or hasattr reads, a constant: an absence there is a value."""


# torch's functions that read global state a branch may depend on, by the GLOBAL_STATE name they read
# (the rest of it, default dtype, deterministic algorithms and autocast, is recorded whatever was read).
# They are noted where the load of one runs (the frame is traced by opcode), not where code merely
# names one: transformers' `self.gradient_checkpointing and torch.is_grad_enabled()` short-circuits.
STATE_PROBES = {"is_grad_enabled": "grad_mode", "is_inference_mode_enabled": "inference_mode"}


def _loads(code: types.CodeType) -> _Loads:
    """Roots are the frame's arguments and free variables (a comprehension's or a nested function's
    `self`), and globals (a module's attribute: `cfg.SCALE`); `getattr(chain, "name")` with a constant
    name reads as `chain.name` (`getattr(self.config, "flag", None)` as `self.config.flag`); a local stored once from a chain (`cfg = self.cfg`) reads as that
    chain (`cfg.flag` is `self.cfg.flag`)."""
    scan = _LoadScan(code)
    for index, instruction in enumerate(scan.instructions):
        scan.step(index, instruction)
    scan.close()
    return _Loads(tuple(sorted(scan.chains)), tuple(sorted(scan.globals)), tuple(sorted(scan.free)),
                  tuple(sorted(scan.probes)), tuple(sorted(scan.optional)))


class _LoadScan:
    """One pass over a code object's instructions, following the chain of attribute loads being read."""

    def __init__(self, code: types.CodeType) -> None:
        self.code = code
        self.roots = set(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]) | set(code.co_freevars)
        self.instructions = [i for i in dis.get_instructions(code) if i.opname not in ("EXTENDED_ARG", "CACHE")]
        self.stores = Counter(i.argval for i in self.instructions if i.opname in ("STORE_FAST", "DELETE_FAST"))
        self.aliases: dict[str, tuple[str, tuple[str, ...]]] = {}
        self.chains: set[tuple[str, tuple[str, ...]]] = set()
        self.globals: set[str] = set()
        self.free: set[str] = set()
        self.probes: set[tuple[int, str]] = set()
        self.optional: set[tuple[str, tuple[str, ...]]] = set()
        self.root: str | None = None
        self.path: list[str] = []
        self.by_getattr = False  # the chain being read is getattr's or hasattr's first argument

    def close(self) -> None:
        if self.root is not None and self.path:
            self.chains.add((self.root, tuple(self.path[:_MAX_CHAIN])))
        self.root, self.path, self.by_getattr = None, [], False

    def step(self, index: int, instruction) -> None:
        name, value = instruction.opname, instruction.argval
        if name in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL") and value in STATE_PROBES:
            self.probes.add((instruction.offset, STATE_PROBES[value]))
        if name in ("LOAD_ATTR", "LOAD_METHOD") and self.root is not None:
            self.path.append(value)
            return
        if name == "LOAD_CONST" and isinstance(value, str) and self.by_getattr and self.root is not None:
            read = (self.root, (*self.path, value)[:_MAX_CHAIN])
            self.chains.add(read)
            self.optional.add(read)
        if (name == "STORE_FAST" and self.root is not None and self.path and not self.root.startswith(_GLOBAL)
                and self.stores[value] == 1):
            self.aliases[value] = (self.root, tuple(self.path))
        self.close()
        if name.startswith("LOAD_FAST") or name == "LOAD_DEREF":
            self.local(index, instruction)
        elif name in ("LOAD_GLOBAL", "LOAD_NAME"):
            self.globals.add(value)
            self.root = f"{_GLOBAL}{value}"
        elif name == "LOAD_CLASSDEREF" and value in self.code.co_freevars:
            self.free.add(value)

    def local(self, index: int, instruction) -> None:
        local = instruction.argval[-1] if isinstance(instruction.argval, tuple) else instruction.argval
        if local in self.aliases:
            self.root, self.path = self.aliases[local][0], list(self.aliases[local][1])
        else:
            self.root = local if local in self.roots else None
        before = self.instructions[index - 1] if index else None
        self.by_getattr = (self.root is not None and before is not None and before.opname in ("LOAD_GLOBAL", "LOAD_NAME")
                           and before.argval in ("getattr", "hasattr"))
        if instruction.opname == "LOAD_DEREF" and instruction.argval in self.code.co_freevars:
            self.free.add(instruction.argval)


_GLOBAL = "global:"
"""How a chain rooted at a global names its root (`cfg.SCALE` where cfg is a module global)."""


def _followable(value: object) -> bool:
    """A plain Python object whose attributes code may read as settings (a config, a namespace, an
    object of a class with __slots__ such as a slotted dataclass, read as its slots hold them: not
    where its class reads attributes its own way). Decided without running code of the object's."""
    kind = type(value)
    try:
        object.__getattribute__(value, "__dict__")
        plain = True
    except AttributeError:
        plain = _slotted(kind) and kind.__getattribute__ is object.__getattribute__
    return (plain
            and not isinstance(value, (torch.Tensor, type, types.ModuleType, enum.Enum))
            and (not callable(value) or _calls_python(kind))
            and kind.__module__ != "builtins" and not kind.__module__.startswith("torch"))


def _calls_python(kind: type) -> bool:
    """Whether calling an object of `kind` runs a Python __call__ its class defines (`self.act =
    Scaler(0.5)`): its reads of self are the object's settings, as a module's are."""
    call = next((vars(klass)["__call__"] for klass in kind.__mro__ if "__call__" in vars(klass)), None)
    return isinstance(call, types.FunctionType)


def _slotted(kind: type) -> bool:
    return any(isinstance(member, types.MemberDescriptorType) for klass in kind.__mro__ for member in vars(klass).values())


ABSENT = "missing"
"""The spelling of an attribute obj does not have, as a served call's check spells it."""


def plain_attribute(obj: object, name: str) -> object:
    """obj.name where it is plain data (the instance's dict, a module's submodule, a class attribute
    that is no descriptor, or a method of a class outside torch, bound to obj); _MISSING otherwise,
    _ABSENT where obj plainly has no such attribute. Runs no code of obj's."""
    if name == "__class__":
        return type(obj)
    instance = _instance_dict(obj)
    if instance is None:
        return _MISSING
    for klass in type(obj).__mro__:
        found = klass.__dict__.get(name, _MISSING)
        if found is not _MISSING:
            if isinstance(found, types.MemberDescriptorType):  # a slot: plain data, read without code of obj's
                return _slot_value(obj, found, instance, name)
            if hasattr(type(found), "__set__") or hasattr(type(found), "__delete__"):
                return _MISSING  # a property or another data descriptor: its own frame is noted if it runs
            break
    if name in instance:
        return instance[name]
    if isinstance(obj, torch.nn.Module) and name in instance.get("_modules", {}):
        return instance["_modules"][name]
    if found is _MISSING:
        return _ABSENT if _plainly_absent(obj, instance, name) else _MISSING
    if isinstance(found, types.FunctionType) and not (found.__module__ or "torch").startswith("torch"):
        return types.MethodType(found, obj)  # replaced on the instance or its class, another function runs
    if hasattr(type(found), "__get__"):
        return _MISSING  # a torch method, a classmethod or another descriptor
    return found


def _instance_dict(obj: object) -> dict | None:
    """obj's instance dict; {} for an object of a class with __slots__ alone (its values are in the
    slots); None for one whose attributes live elsewhere (a C extension's)."""
    try:
        return object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return {} if _slotted(type(obj)) else None


def _slot_value(obj: object, slot, instance: dict, name: str) -> object:
    try:
        return slot.__get__(obj, type(obj))
    except AttributeError:  # a slot never set
        return _ABSENT if _plainly_absent(obj, instance, name) else _MISSING


def _plainly_absent(obj: object, instance: dict, name: str) -> bool:
    """Whether reading obj.name fails without running code of obj's: no __getattr__ but nn.Module's,
    and for a module, no parameter, buffer or submodule of that name."""
    hook = getattr(type(obj), "__getattr__", None)
    if hook is not None and hook is not torch.nn.Module.__getattr__:
        return False
    return not any(name in instance.get(table, {}) for table in ("_parameters", "_buffers", "_modules"))


def attribute_spelling(obj: object, name: str) -> str | None:
    """The spelling of obj.name as noted at capture (ABSENT where it plainly is not there)."""
    value = plain_attribute(obj, name)
    return ABSENT if value is _ABSENT else None if value is _MISSING else spelled(value)


class _FrameHook:
    """The call-only trace function: notes what each user code object loads, then lets the frame
    run untraced (or hands it to the trace function that was installed before)."""

    def __init__(self, log: ReadLog, previous) -> None:
        self.log = log
        self.previous = previous
        self.loads: dict[types.CodeType, _Loads | None] = {}

    def __call__(self, frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code in self.loads:
                loads = self.loads[code]
            else:
                loads = self.loads[code] = None if skipped(code.co_filename) else _loads(code)
            if loads is not None and in_trace(frame.f_back):
                self.log.codes.setdefault(code, frame.f_globals.get("__name__", "__main__"))
                self.note(frame, loads)
                if loads.probes:
                    return self.probing(frame, dict(loads.probes), self.previous(frame, event, arg) if self.previous else None)
        return self.previous(frame, event, arg) if self.previous is not None else None

    def probing(self, frame, probes: dict[int, str], inner):
        """A local trace function for a frame that loads a state probe: notes the probe when its load
        runs (opcode events, in this frame alone), handing every other event to `inner`, the local
        trace function installed before (coverage's)."""
        frame.f_trace_opcodes = True
        state = self.log.state

        def local(frame, event, arg):
            nonlocal inner
            if event == "opcode":
                probe = probes.get(frame.f_lasti)
                if probe is not None:
                    state.add(probe)
            elif inner is not None:
                inner = inner(frame, event, arg)
            return local
        return local

    def note(self, frame, loads) -> None:
        log = self.log
        if loads.chains:
            local = frame.f_locals
            for root, path in loads.chains:
                if root.startswith(_GLOBAL):
                    self.note_global_chain(frame.f_globals, root[len(_GLOBAL):], path)
                else:
                    self.note_chain(local.get(root, _MISSING), path, (root, path) in loads.optional)
        if loads.globals:
            module = frame.f_globals.get("__name__", "?")
            log.globals_of.setdefault(module, frame.f_globals)
            for name in loads.globals:
                value = frame.f_globals.get(name, _MISSING)
                spelling = None if value is _MISSING or (module, name) in log.globals else global_spelling(value)
                if spelling is not None:
                    log.globals[module, name] = spelling
        if loads.free:
            local = frame.f_locals
            where = frame.f_code.co_qualname if hasattr(frame.f_code, "co_qualname") else frame.f_code.co_name
            for name in loads.free:
                value = local.get(name, _MISSING)
                key = (f"{frame.f_globals.get('__name__', '?')}.{where}", name)
                spelling = None if value is _MISSING or key in log.closures else spelled(value)
                if spelling is not None:
                    log.closures[key] = spelling

    def note_global_chain(self, scope: dict, root: str, path: tuple[str, ...]) -> None:
        """A chain rooted at a global of the frame's module (`scope`): a module's (`cfg.SCALE`,
        `flags.CFG.sub.scale`), or a class's or settings object's of this module (`Local.SCALE`)."""
        value = scope.get(root, _MISSING)
        if isinstance(value, types.ModuleType):
            self.note_module_attribute(value, path)
        elif "__name__" in scope and not skipped(scope.get("__file__") or "<"):
            self.note_object_attributes(scope["__name__"], scope, root, value, path)

    def note_object_attributes(self, module: str, scope: dict, name: str, obj: object, path: tuple[str, ...]) -> None:
        """`name.a.b`, `name` a global of `module` holding a class or a settings object, followed through
        classes and settings objects as plain data: each value checked as the global `name.a.b` (a
        patched class attribute or config field is eager's, not the served graph's)."""
        for attribute in path[:_MAX_CHAIN]:
            user_class = isinstance(obj, type) and not skipped(getattr(sys.modules.get(obj.__module__), "__file__", None) or "<")
            value = getattr(obj, attribute, _MISSING) if user_class else plain_attribute(obj, attribute) if _followable(obj) else _MISSING
            if value is _MISSING or value is _ABSENT or isinstance(value, (types.FunctionType, types.MethodType)):
                return
            name, spelling = f"{name}.{attribute}", spelled(value)
            if spelling is not None:
                self.log.globals.setdefault((module, name), spelling)
                self.log.globals_of.setdefault(module, scope)
                if not isinstance(value, type):
                    return
            obj = value

    def note_module_attribute(self, module: object, path: tuple[str, ...]) -> None:
        """`cfg.SCALE` where cfg is a module: its global, and what a class or settings object there
        holds; `torch.backends.mkldnn.enabled`: a flag of torch's backends."""
        if module is torch and path[0] == "backends":
            module, path = torch.backends, path[1:]
        if isinstance(module, types.ModuleType) and module.__name__.startswith("torch.backends"):
            self.note_backend_flag(module, path)
            return
        if isinstance(module, types.ModuleType) and (module.__name__ == "torch" or module.__name__.startswith("torch.")):
            self.note_torch_function(module, path)
            return
        if not isinstance(module, types.ModuleType) or skipped(getattr(module, "__file__", None) or "<"):
            return
        name = path[0]
        key = (module.__name__, name)
        value = vars(module).get(name, _MISSING)
        spelling = None if value is _MISSING or key in self.log.globals else global_spelling(value)
        if spelling is not None:
            self.log.globals[key] = spelling
            self.log.globals_of.setdefault(module.__name__, vars(module))
        if value is not _MISSING and len(path) > 1:
            self.note_object_attributes(module.__name__, vars(module), name, value, path[1:])

    def note_backend_flag(self, module: types.ModuleType, path: tuple[str, ...]) -> None:
        """A flag of a torch.backends module (torch's own property over its C state), read as the
        served call's check reads it: by getattr on the module sys.modules holds under that name."""
        for name in path:
            value = getattr(module, name, _MISSING)
            if isinstance(value, types.ModuleType) and value.__name__.startswith("torch.backends."):
                module = value
                continue
            key = (module.__name__, name)
            if (value is None or type(value) in (bool, int, float, str)) and key not in self.log.globals:
                self.log.globals[key] = str(spelled(value))
                self.log.globals_of.setdefault(module.__name__, module)
            return

    def note_torch_function(self, module: types.ModuleType, path: tuple[str, ...]) -> None:
        """A public function of torch the code loads from its module (`F.gelu`, `torch.relu`,
        `torch.nn.functional.silu`): patched after capture (`F.gelu = ...`), eager calls the patch
        while the served graph holds what the trace called, so its spelling is checked; and a setting
        of a torch config module, a private one's too (`torch.compiler.config.job_id`,
        `torch._dynamo.config.cache_size_limit`), read as the served call reads it."""
        private = False
        for name in path:
            if name in STATE_PROBES or module.__name__.startswith("torch.distributed"):
                # the state probes, wrapped while the trace runs (recording()); and collectives, remapped
                # to traceable ones while it runs (serve/ranks.py)
                return
            value = vars(module).get(name, _MISSING)
            if isinstance(value, types.ModuleType):
                module, private = value, private or name.startswith("_")  # torch._dynamo.config: its settings count
                continue
            if value is _MISSING and isinstance(vars(module).get("_config"), dict):  # a config module's setting
                setting = getattr(module, name, _MISSING)
                spelling = None if setting is _MISSING or (module.__name__, name) in self.log.globals else spelled(setting)
                if spelling is not None and (setting is None or type(setting) in (bool, int, float, str)):
                    self.log.globals[module.__name__, name] = spelling
                    self.log.globals_of.setdefault(module.__name__, module)
                return
            if private or name.startswith("_"):  # torch's private machinery (torch._C, F._in_projection)
                return
            if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)) and (module.__name__, name) not in self.log.globals:
                spelling = spelled(value)
                if spelling is not None:
                    self.log.globals[module.__name__, name] = spelling
                    self.log.globals_of.setdefault(module.__name__, vars(module))
            return

    def note_chain(self, obj: object, path: tuple[str, ...], optional: bool = False) -> None:
        """`optional`: the chain is one attribute read by getattr or hasattr, so its absence is noted."""
        log = self.log
        for name in path:
            known = log.owners.get(id(obj))
            if known is None or known[1] is not obj:
                return
            owner = known[0]
            value = plain_attribute(obj, name)
            if value is _ABSENT and optional:
                log.attributes.setdefault((owner, name), ABSENT)
            if value is _MISSING or value is _ABSENT:
                note_property((log.globals, log.globals_of), type(obj), name)
                return
            spelling = spelled(value)
            if spelling is not None:
                log.attributes.setdefault((owner, name), spelling)  # as first read: a list or dict may change after
                return
            if isinstance(value, torch.nn.Module):
                obj = value  # a submodule: its own owner is known
                continue
            if not _followable(value):
                return
            if id(value) not in log.owners:
                followed = Owner(owner.arg, owner.module, (*owner.chain, name))
                log.owners[id(value)] = (followed, value)
                if callable(value):  # what it is decides what a call runs, as for a module
                    log.attributes[followed, "__class__"] = str(spelled(type(value)))
                    note_calls((log.globals, log.globals_of), type(value))
            obj = value


@contextlib.contextmanager
def recording(modules: dict[int | str, torch.nn.Module]):
    """Note what the code run inside loads; `modules` maps each module argument's position (or
    keyword) to it."""
    log = ReadLog()
    for position, module in modules.items():
        for name, submodule in module.named_modules(remove_duplicate=False):
            if id(submodule) not in log.owners:
                log.owners[id(submodule)] = (Owner(position, name), submodule)
                # What each submodule is: a module replaced by one of another class (Tanh by Sigmoid)
                # changes what runs while every parameter and attribute read may stay the same.
                log.attributes[Owner(position, name), "__class__"] = str(spelled(type(submodule)))
                note_calls((log.globals, log.globals_of), type(submodule))
    previous = sys.gettrace()
    # The cyclic collector's callbacks (a profiler's, hypothesis') would run inside the trace's frames.
    collecting = gc.isenabled()
    gc.disable()
    sys.settrace(_FrameHook(log, previous))
    try:
        yield log
    finally:
        sys.settrace(previous)
        if collecting:
            gc.enable()
