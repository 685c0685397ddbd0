"""What an installed artifact's pickled guard state must read back as: the objects the guards read.

An installed artifact serves through torch's guard managers, rebuilt at load from the guard state
Dynamo pickled at capture (`GuardsStatePickler`): building each guard evaluates its source over the
unpickled locals. Two things stand between what the capture saw and what load rebuilds:

- Dynamo's pickler writes a module of a class defined inside a function as a bare `nn.Module` with
  that module's `__dict__` (it cannot name the class), even where the class says how to pickle its
  instances itself (`__reduce__`). A guard that reads through the module's type then reads
  `nn.Module`'s: kernels' `use_kernelized_func` (a hard dependency of transformers from 5.25.0)
  keeps such a module per attention layer, `_kernel_funcs['rotary_pos_emb']`, and Dynamo guards
  `dict(type(...).__dict__)['forward'].__closure__[0].cell_contents.__defaults__` on it, which
  rebuilt on a bare `nn.Module` is `None[0]`. `faithful_guard_pickling` lets such a class's own
  reduction write it, for the session's compiles.
- torch 2.15's pickler writes a function a guard reads that pickle cannot find by name (the
  function a decorator's wrapper closes over, a `<locals>` one) by value: its code object, rebuilt at
  load. Code in the opaque state is what load refuses (python_code is the only code an artifact
  runs), so for the session's compiles such a function is written as Dynamo's missing placeholder,
  as torch 2.11-2.14 leave it; load puts back from the serving process the ones a by-name identity
  check names, as it does on those torches.
- Dynamo's pickler writes a module the frame's globals bind (`flags`, for a frame reading
  `flags.SCALE`) by name, which unpickling imports: load's policy refuses any import of a module
  off its reviewed list, and an imported module holds the serving process's values, which torch
  rebuilds the guards through it with. Such a module is written as the missing placeholder, bound at
  load to the serving frame's own. Whatever else a guard reads through an object pickled by
  reference (a module, a class, a function) reads back as the serving process's: each such kept
  constant, length or type (and a torch config setting's override) gets a by-name line comparing it
  with the capture's (`pin_read_back_values`), so a library setting, a class attribute or a default
  changed before load misses instead of serving the code that baked in the old value.
- Whatever else unpickles as something else: `readback_problems` rebuilds each variant's guard
  state as load will and names each kept guard whose source reads back another type, or nothing,
  so the capture is refused at write time rather than the artifact at load.
"""
from __future__ import annotations

import ast
import contextlib
import contextvars
import importlib
import math
import pickle
import re
import sys
import types
from typing import Iterator

import msgspec
import torch

from precompile.artifact.metadata import DynamoFrame, VariantGuards
from precompile.artifact.pickle_policy import MODULE, classify
from precompile.capturing.dynamo.config_settings import SETTING_KINDS, setting_source
from precompile.capturing.dynamo.guard_accounting import UNKEPT, Seen, seen_key, slot_source, slot_text
from precompile.capturing.dynamo.guard_expressions import ordered_repr
from precompile.capturing.dynamo.named_identity import reference, walkable
from precompile.errors import CaptureRefused

# What evaluating a guard source may call (Dynamo's own source text: dict(type(x).__dict__)['f'], ...).
_EVAL_BUILTINS = {"dict": dict, "type": type, "list": list, "object": object}
# Guard kinds whose check is built from what the source held (its type, its length): the kinds the
# guard filter records a `Seen` for that do not compare a constant.
_ROOT = re.compile(r"\b([LG])\[")
_TYPED_KINDS = frozenset({"TYPE_MATCH", "SEQUENCE_LENGTH", "DICT_KEYS_MATCH", "HASATTR"})
# torch 2.15's reconstructors of a function pickled by value (from its code object and scope).
_BY_VALUE = frozenset({"_unpickle_fn_from_module", "_unpickle_fn_from_snapshot"})


def _reduces_itself(cls: type) -> bool:
    """Whether a module class says how its instances pickle (`__reduce__`/`__reduce_ex__` of its own,
    not nn.Module's or object's)."""
    stop = (torch.nn.Module, object)
    return any("__reduce__" in vars(k) or "__reduce_ex__" in vars(k) for k in cls.__mro__ if k not in stop)


def _importable(func) -> bool:
    """Whether pickle can write `func` by reference: found again by its module and qualified name."""
    module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname:
        return False
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception:  # not there by that name: pickle could not write it either
        return False
    return found is func


def _own_reduction(obj) -> bool:
    """Whether `obj`'s own reduction rebuilds it through an importable callable (the real class
    comes back), rather than by the class, which pickle could not name."""
    if not _reduces_itself(type(obj)):
        return False
    try:
        reduced = obj.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
    except Exception:  # a reduction that fails is none
        return False
    return isinstance(reduced, tuple) and len(reduced) >= 2 and _importable(reduced[0])


def _bound_from_scope(state) -> dict[int, str]:
    """What of a guard state's global scope load binds from the serving frame's own globals instead
    of unpickling, by id, with the placeholder's reason: the modules it binds by name (`flags` for a
    frame that reads `flags.SCALE`) whose import load's policy does not review (any but torch's own,
    and of torch's the ones it calls dangerous: torch 2.15 guards a config read through
    `torch.utils._config_module`, whose `__getattr__` it inlines), and its ContextVars, which do not
    pickle (a frame that graph-breaks on `VAR.get()` guards VAR's type)."""
    scope = getattr(getattr(state, "output_graph", None), "global_scope", None)
    if not isinstance(scope, dict):
        return {}
    bound = {id(value): f"module {value.__name__}" for value in scope.values() if isinstance(value, types.ModuleType)
             and (value.__name__.split(".")[0] != "torch" or classify(value.__name__, MODULE) == "dangerous")}
    bound.update({id(value): f"contextvar {name}" for name, value in scope.items() if isinstance(value, contextvars.ContextVar)})
    return bound


@contextlib.contextmanager
def faithful_guard_pickling() -> Iterator[list[CaptureRefused]]:
    """For the duration: Dynamo's guard state pickler writes a module of a class defined in local
    scope by the class's own reduction, where it has one that rebuilds it by an importable name
    (Dynamo's pickler otherwise writes a bare nn.Module); a function it would rebuild from its code
    object as its missing placeholder; and a module the frame's globals bind (other than torch's), or a
    ContextVar, as the placeholder too, which load fills from the serving frame's globals (the driver's
    `_fill_bound_globals`), so the state imports no module by name. Patched on torch's class itself, so what the pickle names
    stays torch's (the inspect policy's reviewed names, a serving process without precompile). Yields
    the refusals of guard states that did not pickle (torch 2.15 bypasses such a frame instead of
    raising, so the capture names the cause from here)."""
    from precompile.torch_compat import GuardsStatePickler, GuardStateMissing

    original, original_dump = GuardsStatePickler.reducer_override, GuardsStatePickler.dump
    refused: list[CaptureRefused] = []

    def dump(self, obj):
        self.precompile_bound_from_scope = _bound_from_scope(obj)
        try:
            return original_dump(self, obj)
        except (TypeError, pickle.PicklingError, AttributeError) as exc:
            refused.append(CaptureRefused(_unpicklable_scope(obj, exc)))
            raise refused[-1] from exc

    def reducer_override(self, obj):
        bound = getattr(self, "precompile_bound_from_scope", {}).get(id(obj))
        if bound is not None and isinstance(obj, (types.ModuleType, contextvars.ContextVar)):
            return GuardStateMissing, (bound,)
        reduced = original(self, obj)
        if not isinstance(reduced, tuple) or not reduced:
            return reduced
        if isinstance(obj, torch.nn.Module) and reduced[0] == type(self)._unpickle_module and _own_reduction(obj):
            return NotImplemented  # pickle calls obj.__reduce_ex__: the class's own reduction
        if getattr(reduced[0], "__name__", None) in _BY_VALUE:
            return GuardStateMissing, ("function by value",)
        return reduced

    GuardsStatePickler.reducer_override, GuardsStatePickler.dump = reducer_override, dump
    try:
        yield refused
    finally:
        GuardsStatePickler.reducer_override, GuardsStatePickler.dump = original, original_dump


def _unpicklable_scope(state, exc: Exception) -> str:
    """Why a frame's guard state did not pickle, naming the globals and locals its guards read that do
    not (an open file, a lock), each found by pickling it alone (modules and tensors, which Dynamo's
    pickler writes its own way, are not tried)."""
    graph = getattr(state, "output_graph", None)
    names = []
    for where, scope in (("global", getattr(graph, "global_scope", None)), ("local", getattr(graph, "local_scope", None))):
        for name, value in (scope or {}).items():
            if name.startswith("__") or isinstance(value, (types.ModuleType, contextvars.ContextVar, torch.nn.Module, torch.Tensor)):
                continue
            try:
                pickle.dumps(value)
            except Exception as alone:  # its own failure, the same as the state's, names it
                if str(alone) == str(exc):
                    names.append(f"the {where} {name!r} (a {type(value).__module__}.{type(value).__qualname__})")
    read = f"its guards read {', '.join(names)}, which" if names else "it holds an object that"
    return (f"Dynamo's guards for a frame of the call cannot be written into the artifact: {read} cannot be pickled "
            f"({type(exc).__name__}: {exc}); branch on a plain value instead (a bool or a setting, not the object "
            "itself), or capture with tracer=precompile.MakeFxTracer()")


def _local(name: str) -> bool:
    """Whether a guard source is rooted in the frame's locals (`L['self'].x`, `type(L['m'])`, ...)."""
    found = _ROOT.search(name)
    return found is not None and found.group(1) == "L"


def _read_back(name: str, state) -> object:
    og = state.output_graph
    return eval(name, {"__builtins__": _EVAL_BUILTINS}, {"L": og.local_scope, "G": og.global_scope})  # Dynamo's source text over its own saved scopes


def readback_problems(state, seen: dict, policy: frozenset) -> list[str]:
    """Each kept guard on a local source (torch rebuilds it from the pickled locals; a global source
    reads the serving module's own globals) whose source reads back, from the unpickled guard state
    `state`, as another type than the capture's live object held (`seen`: the guard filter's record),
    or reads back nothing. One line per guard: its slot, what the capture saw and what load would."""
    problems: dict[str, str] = {}
    for guard in state.output_graph.guards:
        kind = guard.create_fn_name()
        slot = slot_text((kind, slot_source(guard.name)))
        if kind not in _TYPED_KINDS or slot in policy or not _local(guard.name) or slot in problems:
            continue
        saw: Seen | None = seen.get(seen_key(guard))
        if saw is None:
            continue
        try:
            value = _read_back(guard.name, state)
        except Exception as exc:  # the guard cannot be built at load: torch raises the same
            problems[slot] = f"{slot}: the capture saw a {saw.type.__qualname__}; the pickled guard state reads back nothing ({type(exc).__name__}: {exc})"
            continue
        if type(value).__name__ == "_Missing":
            continue  # Dynamo pruned it from the state: torch's builder does not read it either
        if type(value) is not saw.type and getattr(value, "pytype", None) is not saw.type:
            problems[slot] = (f"{slot}: the capture saw a {saw.type.__module__}.{saw.type.__qualname__}; the pickled "
                              f"guard state reads back a {type(value).__module__}.{type(value).__qualname__}")
    return list(problems.values())


def _unbuildable(state, code) -> list[str]:
    """torch's own build of a variant's guard manager from the rebuilt state, as load builds it: what
    stops it, if anything (a numpy value Dynamo turned into a tensor, `___from_numpy(G['lib'].X)`,
    has its tensor check saved as a placeholder torch cannot build it from)."""
    from precompile.torch_compat import SerializedCode, dynamo_config, load_guard_manager

    try:
        with dynamo_config.patch(skip_nnmodule_hook_guards=False):
            load_guard_manager(state, SerializedCode.to_code_object(code.python_code), sys.modules[code.python_module].__dict__)
    except Exception as exc:  # whatever torch's build raises, load would raise it too
        return [f"torch cannot build its guards from the saved state ({type(exc).__name__}: {str(exc)[:300]})"]
    return []


def refuse_unfaithful_guard_state(entry, frames: list[DynamoFrame], guards: list[VariantGuards], seen: dict) -> None:
    """An installed artifact's guards are rebuilt at load from the guard state Dynamo pickled: refuse,
    at write time, a variant whose kept guards read back from that state as other objects than the
    capture's (`seen`: GuardLedger.seen), naming each, rather than an artifact that cannot load or
    never serves."""
    from precompile.codegen.drivers.dynamo_checks import rebuilt_guards_state

    listed = {(v.frame, v.variant): v for v in guards}
    problems = []
    for index, (code, frame) in enumerate(zip(entry.codes, frames)):
        if frame.runs_as_python:
            continue
        for variant, guarded in enumerate(code.guarded_codes):
            meta = listed.get((frame.qualname, variant))
            policy = frozenset(meta.policy_dropped) if meta is not None else frozenset()
            state = rebuilt_guards_state(guarded.guards_state, meta.by_name if meta is not None else (), policy,
                                         sys.modules[code.python_module].__dict__)
            found = readback_problems(state, seen.get((frame.qualname, variant)) or {}, policy) or _unbuildable(state, code)
            problems += [f"frame {index} ({frame.qualname}), variant {variant}: {line}" for line in found]
    if problems:
        raise CaptureRefused(
            "the capture is served installed, through torch's guards rebuilt at load from the guard state Dynamo "
            f"pickled, and these kept guards would read back other objects than the capture's: {problems}; drop them "
            "with DynamoTracer(guard_filter_fn=...) (then unchecked), make the objects they read picklable by name "
            "(a class at module level, or one whose __reduce__ rebuilds it by an importable name), or capture with "
            "MakeFxTracer"
        )


# Kept guards that compare what their source held with a constant, or its length.
_CONSTANT_KINDS = frozenset({"CONSTANT_MATCH", "EQUALS_MATCH"})
_START = re.compile(r"([LG])\['([^'\]]+)'\]")
_STEP = r"\.(\w+)|\[(\d+)\]|\['([^'\]]+)'\]"
# Objects Dynamo's pickler writes by reference: unpickled in a serving process, they are its own, with
# the values they hold there (a module's globals, a class's attributes, a function's defaults).
_BY_REFERENCE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def _step(value, attr: str, item: str, key: str):
    return getattr(value, attr) if attr else value[int(item)] if item else value[key]


def _walk(name: str, state) -> tuple[bool, object]:
    """(whether the guard source `name` reads its value through an object pickled by reference, the
    value it reads back), walked over the rebuilt guard state; (False, None) for a source that is no
    walk the driver can check or does not read back. torch rebuilds such a guard (`G['flags'].SCALE`,
    `type(L['self']).__dict__['SCALE']`, `G['helper'].__defaults__[0]`) at load from the serving
    process's object, so it compares with the value there."""
    of_type = name.startswith("type(")
    walked, after = name[5:].split(")", 1) if of_type else (name, "")
    start = _START.match(walked)
    rest = walked[start.end():] if start else ""
    if start is None or not re.fullmatch(f"(?:{_STEP})*", rest + after):
        return False, None
    og = state.output_graph
    value = (og.local_scope if start.group(1) == "L" else og.global_scope).get(start.group(2))
    through = of_type
    try:
        for part, steps in enumerate((rest, after)):
            for attr, item, key in re.findall(_STEP, steps):
                through = through or isinstance(value, _BY_REFERENCE)
                value = _step(value, attr, item, key)
            value = type(value) if part == 0 and of_type else value
    except Exception:  # a source that does not read back: readback_problems' concern
        return False, None
    return through, value


def _operand(value: object) -> str | None:
    """How a by-name line states a pinned value: a literal, `float('inf')` (or '-inf', 'nan'),
    `torch.device('cuda:0')`, `frozenset({...})`; None where none does (the driver's `_pinned_operand`
    reads them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if type(value) is frozenset:
        inner = _operand(set(value)) if value else ""
        return None if inner is None else f"frozenset({inner})"
    text = ordered_repr(value)  # a set's members sorted: the same line under any hash seed
    try:
        same = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):  # an object's repr
        return None
    return text if type(same) is type(value) and same == value else None


def _pinned(kind: str, name: str, saw: Seen | None, state) -> str | None:
    """The by-name line pinning one kept guard to what the capture saw, where torch would rebuild it at
    load through an object pickled by reference; None where it would not, or no line states the value."""
    setting = setting_source(name) if kind in SETTING_KINDS else None
    if setting is not None:  # a torch config's override: the setting, as the capture resolved it
        through, value = _walk(setting, state)
        operand = _operand(value) if through else None
        return None if operand is None else f"EQUALS_MATCH {setting} == {operand}"
    if saw is None or kind not in _CONSTANT_KINDS and kind not in ("SEQUENCE_LENGTH", "TYPE_MATCH"):
        return None
    source = walkable(name)
    of_get = source.endswith(".get()")  # a ContextVar's value (torch 2.15)
    through, value = _walk(source[:-6] if of_get else source, state)
    if not through or of_get and (kind not in _CONSTANT_KINDS or not isinstance(value, contextvars.ContextVar)):
        return None
    if kind == "SEQUENCE_LENGTH":
        return None if saw.length is None else f"{kind} len({source}) == {saw.length}"
    if kind == "TYPE_MATCH":  # the driver walks one type(...): a class attribute's type is left to torch's check
        ref = None if source.startswith("type(") else reference(saw.type)
        return None if ref is None else f"{kind} type({source}) is {ref}"
    captured = saw.value if saw.value is not UNKEPT or not isinstance(value, torch.device) else value
    if isinstance(captured, torch.dtype):
        return f"{kind} {source} is torch:{str(captured).removeprefix('torch.')}"
    operand = None if captured is UNKEPT else _operand(captured)
    return None if operand is None else f"{kind} {source} == {operand}"


def pin_read_back_values(entry, frames: list[DynamoFrame], guards: list[VariantGuards], seen: dict) -> list[VariantGuards]:
    """An installed artifact's variants, each with a by-name line per kept guard that torch rebuilds
    at load through an object pickled by reference (a module, a class, a function): a value read
    through a module (`EQUALS_MATCH G['flags'].SCALE == 2.0`), a class attribute, a function's default,
    such a sequence's length, a torch config setting. Rebuilt from the serving process's object, the
    guard compares with the value there, so a setting changed before load would serve the captured
    code, which baked the capture's value in; the line compares with the capture's value on every
    call (`seen`: GuardLedger.seen), so such a call misses as torch.compile would recompile."""
    from precompile.codegen.drivers.dynamo_checks import by_name_check, rebuilt_guards_state

    listed = {(v.frame, v.variant): v for v in guards}
    for code, frame in zip(entry.codes, frames):
        if frame.runs_as_python:
            continue
        scope = sys.modules[code.python_module].__dict__
        for variant, guarded in enumerate(code.guarded_codes):
            meta = listed.get((frame.qualname, variant))
            if meta is None:
                continue
            policy = frozenset(meta.policy_dropped)
            state = rebuilt_guards_state(guarded.guards_state, meta.by_name, policy, scope)
            held = seen.get((frame.qualname, variant)) or {}
            lines = set(meta.by_name)
            for guard in state.output_graph.guards:
                kind = guard.create_fn_name()
                line = None if slot_text((kind, slot_source(guard.name))) in policy else _pinned(
                    kind, guard.name, held.get(seen_key(guard)), state)
                # Checked as load will, on the capture's own state: a line that fails there would miss every call.
                if line is not None and by_name_check(line, scope, "the capture")(state.output_graph.local_scope):
                    lines.add(line)
            listed[(frame.qualname, variant)] = msgspec.structs.replace(meta, by_name=tuple(sorted(lines)))
    return [listed[(v.frame, v.variant)] for v in guards]
