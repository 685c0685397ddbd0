"""A standalone variant's kept guards rendered as the Python that checks them in the serving process.

Each variant becomes one function `guards_F_V(L, G)` over the frame's bound arguments (L) and its
module's globals (G): the first kept guard that fails, or None when all hold. Tensors go through one
C++ `TensorGuards` call, global state through a C++ `GlobalStateGuard`, types and named objects are
compared with objects resolved by qualified name at load, constants as literals, shape-env relations
as the plain expressions Dynamo wrote. Guard sources are Dynamo's own (`L['x']._parameters['w']`,
`dict(type(L['m']).__dict__)['forward'].__closure__[0].cell_contents`, `list(dict.keys(G['REG']))[0]`).

Checks compare with what the source held when Dynamo built the guard (`guard_accounting.Seen`), not the
pickled guard state (read for tensors, shape guards, ambient state). A kept guard with no faithful
rendering raises `Unrenderable`: the capture is refused.
"""
from __future__ import annotations

import ast
import enum
import json
import re
import types
import weakref

import torch

from precompile.capturing.dynamo.config_settings import SETTING_KINDS, setting_source
from precompile.capturing.dynamo.guard_accounting import UNKEPT as _UNKEPT
from precompile.capturing.dynamo.guard_accounting import Seen, seen_key, slot_source, slot_text
from precompile.capturing.dynamo.guard_expressions import (
    PAIRED,
    Unrenderable,
    literal,
    names_in,
    reads_back,
    unliteral_check,
)
from precompile.capturing.dynamo.guard_origin import origin
from precompile.capturing.dynamo.key_lookups import KeyLookups
from precompile.capturing.dynamo.named_identity import CHECK, reference
from precompile.capturing.dynamo.tensor_keys import marking_guard_enforced, tensor_kind

# Guard types Dynamo's guard builder adds no check for: GLOBAL_STATE's C++ guard covers them.
_COVERED_BY_GLOBAL_STATE = frozenset({"GRAD_MODE", "DETERMINISTIC_ALGORITHMS", "FSDP_TRAINING_STATE"})
# Literal types an EQUALS_MATCH is rendered for (Dynamo's C++ check: same type, then ==).
_LITERAL_TYPES = (int, float, str, bytes, complex, tuple, list, frozenset, set)
_SOURCE_NAMES = frozenset({"L", "G"})
_SHAPE_NAMES = frozenset({"L", "G", "math", "___as_tensor"})
_SHAPE_CALLS = frozenset({"size", "stride", "storage_offset", "isnan", "___as_tensor", "item"})
_MARKING_NAMES = frozenset({"L", "G", "hasattr", "getattr", "set"})
_TENSOR_TYPES = {torch.Tensor: "torch:Tensor", torch.nn.Parameter: "torch.nn.parameter:Parameter"}
# A global Dynamo binds by id (OutputGraph.install_global_by_id: `<prefix>_<id>_c<compile id>`).
_MINTED_GLOBAL = re.compile(r"G\['(\w*_\d+_c\d+)'\]")
_BARE_LOCAL = re.compile(r"^(type\()?(?!type\()(?![LG]\[)([A-Za-z_]\w*)")
# What a rendered guard source may name and call beside L and G: the builtins Dynamo's own source text
# uses to reach a value (dict(type(x).__dict__)['f'], list(dict.keys(d))[0]), the serving process's.
_SOURCE_BUILTINS = frozenset({"dict", "type", "list", "object"})
# torch's global module hook tables: Dynamo checks their type only, yet a hook registered after capture runs in eager.
_GLOBAL_HOOKS = re.compile(r"\._global_(forward|forward_pre|backward|backward_pre)_hooks$")
# `get`: a ContextVar's value (torch 2.15's config module keeps a user's overrides in ContextVars).
_SOURCE_CALLS = frozenset({"dict", "type", "list", "keys", "get", "__getitem__", "__getattribute__"})
# torch 2.14's Dynamo reads a set's i-th member through a helper of its own, `___set_getitem(s, i)`, which
# is `list(s)[i]`: rendered, and evaluated, as that.
_SET_GETITEM = re.compile(rf"___set_getitem\(({PAIRED}), (\d+)\)")
_EVAL_BUILTINS = {"dict": dict, "type": type, "list": list, "object": object,
                  "___set_getitem": lambda held, index: list(held)[index]}
# Dtype keys as Dynamo's source text writes them (diffusers' `_DTYPE_UNSUPPORTED_DEVICES[torch.float64]`).
_TORCH_DTYPES = frozenset(f"torch.{name}" for name, value in vars(torch).items() if isinstance(value, torch.dtype))

def rename_sources(text: str, renames: dict[str, str]) -> str:
    for old, new in renames.items():
        text = text.replace(f"G['{old}']", f"G['{new}']")
    return text


class _Variant:
    """Collects one variant's checks in order, then writes its function."""

    def __init__(self, frame: int, variant: int, state, renames: dict[str, str], seen: dict | None = None,
                 module_globals: dict | None = None, lookups: KeyLookups | None = None) -> None:
        self.prefix = f"{frame}_{variant}"
        self.state, self.module_globals = state, module_globals or {}
        self.renames, self.seen = renames, seen or {}
        self.lookups = lookups or KeyLookups()
        self.lines: list[tuple[str, str]] = []  # (label, condition that must hold)
        self.origins: dict[str, str] = {}  # label: where the user's code made the guard (guard_origin)
        self.notes: list[tuple[str, str]] = []  # (label, why it adds no check)
        self.tensors: list[tuple] = []
        self.inference: list[int] = []  # the rows whose tensor was an inference tensor
        self.modes: tuple[str, ...] | None = None  # what the tensors' dispatch keys were read under
        self.tensor_sources: list[str] = []
        self.aliasing: list[str] = []
        self.marking: list[tuple[str, str]] = []
        self.global_state: str | None = None
        self.references: set = set()

    # -- resolving what the capture saw ---------------------------------------------------------
    def source(self, guard, label: str) -> str:
        return self.expression(guard.name, label)

    def expression(self, name: str, label: str) -> str:
        if name.endswith("()") and self.holds_weak_reference(name[:-2]):
            # Dynamo's WeakRefCallSource (an RNN's _flat_weight_refs[0]()): the referent, where the
            # source still holds a weak reference.
            held = self.expression(name[:-2], label)
            return f"({held}() if type({held}) is {self.named(weakref.ref, label)} else None)"
        text = _MINTED_GLOBAL.sub(lambda match: self.minted_module(match, label), self.renamed(name))
        names_in(text, _SOURCE_NAMES | _SOURCE_BUILTINS | {"_by_name"}, _SOURCE_CALLS, label, _TORCH_DTYPES)
        return text

    def renamed(self, text: str) -> str:
        """Dynamo's source text as the artifact reads it: dicts by key (key_lookups), its globals renamed."""
        return rename_sources(_SET_GETITEM.sub(r"list(\1)[\2]", self.lookups.text(text)), self.renames)

    def minted_module(self, match: re.Match, label: str) -> str:
        """A module Dynamo bound under a name minted from its id (G['_<id>_c0']), which no other process
        binds, by name: from the saved scope (torch 2.13), else the frame module's live globals (2.12, 2.14)."""
        name, scope = match.group(1), self.state.output_graph.global_scope
        value = scope[name] if name in scope else self.module_globals.get(name)
        if not isinstance(value, types.ModuleType):
            raise Unrenderable(f"{label}: it reads {match.group(0)}, a global Dynamo bound by id, which no other "
                               "process binds")
        return self.named(value, label)

    def saw(self, guard) -> Seen | None:
        """What the guard's source held when Dynamo built it (the live object), where the filter saw it."""
        return self.seen.get(seen_key(guard))

    def holds_weak_reference(self, name: str) -> bool:
        try:
            return type(self.evaluate(name, name)) is weakref.ref
        except Unrenderable:
            return False

    def value(self, guard, label: str):
        return self.evaluate(guard.name, label)

    def evaluate(self, name: str, label: str):
        og = self.state.output_graph
        scopes = {"L": og.local_scope, "G": og.global_scope}
        try:
            return eval(name, {"__builtins__": _EVAL_BUILTINS, "torch": torch}, scopes)  # Dynamo's own source text over its own saved scopes
        except Exception as exc:  # the saved scope lacks it: no value to render
            raise Unrenderable(f"{label}: the saved guard state holds no value for it ({type(exc).__name__})") from None

    def named(self, obj, label: str) -> str:
        ref = reference(obj)
        if ref is None:
            raise Unrenderable(f"{label}: {obj!r} has no module and qualified name another process can resolve")
        self.references.add(ref)
        return f"_by_name[{ref!r}]"

    def spelled(self, value, label: str) -> str:
        """An expression equal to `value`: a literal, a class, function or enum member by name, or a
        tuple or frozenset of those (in a stable order: a frozenset's items sorted by their spelling)."""
        if type(value) in (tuple, frozenset):
            items = [self.spelled(item, label) for item in value]
            if type(value) is tuple:
                return "(" + "".join(f"{item}, " for item in items) + ")"
            return "frozenset({" + ", ".join(sorted(items)) + "})" if items else "frozenset()"
        if isinstance(value, (type, enum.Enum)) or callable(value):
            return self.named(value, label)
        return literal(value, label)

    @staticmethod
    def keyword(guard, name: str):
        return (getattr(guard.create_fn, "keywords", None) or {}).get(name)

    # -- one guard ------------------------------------------------------------------------------
    def add(self, guard) -> None:
        kind = guard.create_fn_name()
        label = slot_text(self.lookups.slot((kind, slot_source(guard.name))))
        owner = self.lookups.key_guard(kind, guard.name)
        if owner is not None:  # a key position read by key: the key is in the dict, by dict's own lookup
            key = self.lookups.keys[guard.name]
            self.lines.append((f"{label} ({key})", f"dict.__contains__({self.expression(owner, label)}, {key})"))
        elif kind in _COVERED_BY_GLOBAL_STATE:
            self.notes.append((label, "checked by GLOBAL_STATE (torch adds no check of its own)"))
        elif kind in _RENDERERS:
            before = len(self.lines)
            if not self.config_setting(guard, label, kind):
                getattr(self, _RENDERERS[kind])(guard, label, kind)
            made_at = origin(guard)
            if made_at is not None:
                for added, _ in self.lines[before:]:
                    self.origins.setdefault(added, made_at)
        else:
            raise Unrenderable(f"{label}: no exact rendering of a {kind} guard here")

    def global_state_guard(self, guard, label: str, kind: str) -> None:
        # The capturing process's thread count is left out: the driver checks the rest at the serving
        # process's own count (_GlobalState), so it is no part of what the artifact checks.
        state = json.loads(self.state.output_graph.global_state_guard.__getstate__())
        state.pop("num_threads", None)
        self.global_state = json.dumps(state, sort_keys=True, separators=(",", ":"))

    def torch_function_state(self, guard, label: str, kind: str) -> None:
        if self.state.output_graph.torch_function_mode_stack:
            raise Unrenderable(f"{label}: the capture ran under torch function modes (a `with torch.device(...)` "
                               "block, say), whose identity torch checks")
        self.lines.append((label, "torch._C._len_torch_function_stack() == 0"))

    def default_device(self, guard, label: str, kind: str) -> None:
        if self.state.output_graph.current_device is not None:
            raise Unrenderable(f"{label}: the capture ran under a default device")
        self.lines.append((label, "_device_module.CURRENT_DEVICE is None"))

    def type_match(self, guard, label: str, kind: str) -> None:
        seen = self.saw(guard)
        if seen is not None:
            pytype = seen.type
        else:
            from precompile.torch_compat import FakeTensor

            value = self.value(guard, label)
            fake_type = getattr(value, "pytype", None) if isinstance(value, FakeTensor) else None
            pytype = fake_type or type(value)
        source = self.source(guard, label)
        self.lines.append((label, f"type({source}) is {self.named(pytype, label)}"))
        if _GLOBAL_HOOKS.search(guard.name):  # what the table holds: as at capture (no hook, as a rule)
            self.lines.append((f"GLOBAL_HOOKS {guard.name}", f"len({source}) == {len(self.value(guard, label))}"))

    def fake_script_type_match(self, guard, label: str, kind: str) -> None:
        """TYPE_MATCH on a source that is an opaque script object (a ProcessGroup, say): torch's check
        unwraps a FakeScriptObject (only seen while tracing) to the real object it stands for."""
        seen = self.saw(guard)
        if seen is None:
            raise Unrenderable(f"{label}: the capture recorded no value for it")
        if not hasattr(getattr(torch._library, "fake_class_registry", None), "FakeScriptObject"):
            raise Unrenderable(f"{label}: this torch has no FakeScriptObject to unwrap")
        source, fake = self.source(guard, label), "torch._library.fake_class_registry.FakeScriptObject"
        self.lines.append((label, f"type({source}.real_obj if isinstance({source}, {fake}) else {source}) is "
                                  f"{self.named(seen.type, label)}"))

    def opaque_object_guard(self, guard, label: str, kind: str) -> None:
        """OPAQUE_OBJ_GUARD_FN_MATCH compares what the guard_fn registered for an opaque object's type
        returns; with none registered (a ProcessGroup) torch adds no check."""
        seen = self.saw(guard)
        if seen is None:
            raise Unrenderable(f"{label}: the capture recorded no value for it")
        from torch._library.opaque_object import get_opaque_obj_info

        info = get_opaque_obj_info(seen.type)
        if info is not None and info.guard_fn is not None:
            raise Unrenderable(f"{label}: {seen.type.__qualname__} registers a guard_fn, whose values are not rendered here")
        self.notes.append((label, f"skipped by torch (no guard_fn registered for {seen.type.__qualname__})"))

    def constant_guard(self, guard, label: str, kind: str) -> None:
        seen = self.saw(guard)
        if seen is not None and seen.value is _UNKEPT:
            raise Unrenderable(f"{label}: a {seen.type.__name__} value is not rendered as a literal here")
        self.constant(guard, label, seen.value if seen is not None else self.value(guard, label), kind)

    def not_present_in_generic_dict(self, guard, label: str, kind: str) -> None:
        attr = self.keyword(guard, "attr")
        if not isinstance(attr, str):
            raise Unrenderable(f"{label}: the guard names no attribute")
        self.lines.append((f"{label} ({attr})", f"{attr!r} not in {self.source(guard, label)}.__dict__"))

    def dict_contains(self, guard, label: str, kind: str) -> None:
        """DICT_CONTAINS / DICT_NOT_CONTAINS: whether the dict holds a key, by dict's own lookup (a
        subclass's __contains__ is not called, as torch's check calls none)."""
        key = self.keyword(guard, "key")
        # A key that is a class (pytree's SUPPORTED_NODES is keyed by node types) is named, resolved at load.
        text = f"dict.__contains__({self.source(guard, label)}, {self.spelled(key, label)})"
        self.contains_line(guard, label, kind, key, text)

    def set_contains(self, guard, label: str, kind: str) -> None:
        """SET_CONTAINS / SET_NOT_CONTAINS: whether the set holds an item, by the set type's own lookup."""
        key = self.keyword(guard, "key")
        held = self.value(guard, label)
        if type(held) not in (set, frozenset):
            raise Unrenderable(f"{label}: the guarded value is a {type(held).__name__}, not a set")
        text = f"{type(held).__name__}.__contains__({self.source(guard, label)}, {self.spelled(key, label)})"
        self.contains_line(guard, label, kind, key, text)

    def contains_line(self, guard, label: str, kind: str, key, text: str) -> None:
        """The key's presence, or its absence for a NOT_CONTAINS guard (torch 2.11's: an `invert` keyword)."""
        inverted = not kind.endswith("NOT_CONTAINS") and bool(self.keyword(guard, "invert"))
        absent = inverted or kind.endswith("NOT_CONTAINS")
        self.lines.append((f"{label} ({'not ' if inverted else ''}{key!r})", f"not {text}" if absent else text))

    def duplicate_input(self, guard, label: str, kind: str) -> None:
        other = self.keyword(guard, "source_b")
        if other is None:
            raise Unrenderable(f"{label}: the guard names no second source")
        if not guard.code_list:  # torch skips it for optimizer and skip-guard sources
            self.notes.append((label, "skipped by torch (a source it does not guard)"))
            return
        text = self.expression(other.name, label)
        self.lines.append((f"{label} is {self.lookups.text(slot_source(other.name))}", f"{text} is {self.source(guard, label)}"))

    def sequence_length(self, guard, label: str, kind: str) -> None:
        seen = self.saw(guard)
        if seen is None:
            value = self.value(guard, label)
            seen = Seen(type(value), length=len(value))
        if seen.length is None:
            raise Unrenderable(f"{label}: a {seen.type.__name__} has no length")
        source = self.source(guard, label)
        if not issubclass(seen.type, dict):
            self.lines.append((label, f"type({source}) is {self.named(seen.type, label)}"))
        self.lines.append((label, f"len({source}) == {seen.length}"))

    def saved_tensors_hooks(self, guard, label: str, kind: str) -> None:
        """Torch checks the ids of the saved-tensors hooks it would inline (a GraphModule pair);
        with none such at capture, that none are inlineable now."""
        if not any(part.rstrip().endswith("ids == None") for part in guard.code_list or ()):
            raise Unrenderable(f"{label}: the capture ran under inlineable saved-tensors hooks, which torch checks by id")
        if not hasattr(torch._C._autograd, "_top_saved_tensors_default_hooks"):
            raise Unrenderable(f"{label}: this torch has no saved-tensors hooks query")
        self.lines.append((label, "not _inlineable_saved_tensors_hooks()"))

    def has_attribute(self, guard, label: str, kind: str = "HASATTR") -> None:
        """hasattr(base, attr), or its negation, as the capture saw it."""
        attr = self.keyword(guard, "attr")
        base = guard.name
        if attr is None:  # torch 2.11 and 2.12: the guard's source is the attribute, on its base
            source = guard.originating_source
            while type(source).__name__ == "NNModuleSource":
                source = source.base
            if type(source).__name__ == "CodeSource":
                self.notes.append((label, "skipped by torch (a function always has __code__)"))
                return
            attr, owner = getattr(source, "member", None), getattr(source, "base", None)
            if owner is None or not isinstance(attr, str):
                raise Unrenderable(f"{label}: the guard names no attribute on a base")
            base = owner.name if isinstance(owner.name, str) else owner.name()
            present = hasattr(self.evaluate(base, label), attr)
        else:
            seen = self.saw(guard)
            present = bool(seen.has_attribute) if seen is not None else hasattr(self.evaluate(base, label), attr)
        text = self.expression(base, label)
        self.lines.append((f"{label} ({attr})", f"{'' if present else 'not '}hasattr({text}, {attr!r})"))

    def config_setting(self, guard, label: str, kind: str) -> bool:
        """A guard on a torch config's override, checked as the setting it resolves to (config_settings)."""
        setting = setting_source(guard.name) if kind in SETTING_KINDS else None
        if setting is None:
            return False
        try:
            self.constant(guard, label, self.evaluate(setting, label), "CONSTANT_MATCH", self.expression(setting, label))
        except Unrenderable:  # checked as Dynamo wrote it
            return False
        return True

    def constant(self, guard, label: str, value, kind: str, source: str | None = None) -> None:
        source = source or self.source(guard, label)
        if kind == "CONSTANT_MATCH" and (value is None or type(value) is bool):
            self.lines.append((label, f"{source} is {value!r}"))
            return
        check = unliteral_check(source, value)
        if check is not None:
            self.lines.append((label, check))
            return
        if type(value) in (tuple, frozenset) and not reads_back(value):
            # A collection of classes and functions (torch's pytree keeps BUILTIN_TYPES so): each by name.
            self.lines.append((label, f"type({source}) is {type(value).__name__} and {source} == {self.spelled(value, label)}"))
            return
        if type(value) not in _LITERAL_TYPES:
            raise Unrenderable(f"{label}: a {type(value).__name__} value is not rendered as a literal here")
        if type(value) is complex and value != value:
            raise Unrenderable(f"{label}: a complex NaN")
        self.lines.append((label, f"type({source}) is {type(value).__name__} and {source} == {literal(value, label)}"))

    def dict_keys(self, guard, label: str, kind: str = "DICT_KEYS_MATCH") -> None:
        """Dynamo's DICT_KEYS_MATCH: the dict's length, then its keys, in order where the capture relied
        on their order (guard_on_key_order), else as a set (each key looked up)."""
        seen = self.saw(guard)
        if seen is None:
            value = self.value(guard, label)
            seen = Seen(type(value), keys=tuple(dict.keys(value)) if isinstance(value, dict) else None)
        if seen.keys is None:
            raise Unrenderable(f"{label}: the guarded value is a {seen.type.__name__}, not a dict")
        source = self.source(guard, label)
        keys = list(seen.keys)
        for key in keys:
            if type(key) not in (str, int):
                raise Unrenderable(f"{label}: a {type(key).__name__} key")
        self.lines.append((label, f"len({source}) == {len(keys)}"))
        ordered = {s.name for s in self.state.output_graph.guard_on_key_order}
        if guard.name in ordered:
            self.lines.append((f"{label} (in order)", f"list(dict.keys({source})) == {literal(keys, label)}"))
        else:
            for key in keys:
                literal(key, label)
            members = "{" + ", ".join(sorted(map(repr, keys))) + "}" if keys else "set()"
            self.lines.append((label, f"dict.keys({source}) == {members}"))

    def shape_env(self, guard, label: str, kind: str = "SHAPE_ENV") -> None:
        parts = self.state.shape_code_parts
        if parts is None:
            raise Unrenderable(f"{label}: the saved state holds no shape-guard expressions (torch would rebuild them)")
        for expr in dict.fromkeys(parts.python_code_parts.exprs):
            text = self.renamed(expr)
            names_in(text, _SHAPE_NAMES, _SHAPE_CALLS, label)
            self.lines.append((f"{label}: {self.lookups.text(slot_source(expr))}", text))

    def tensor(self, guard, label: str, kind: str = "TENSOR_MATCH") -> None:
        from precompile.torch_compat import dynamo_config, is_from_unspecialized_builtin_nn_module_source

        value = self.value(guard, label)
        source = self.source(guard, label)
        pytype: type = getattr(value, "pytype", None) or type(value)
        if pytype not in _TENSOR_TYPES:
            raise Unrenderable(f"{label}: a {pytype.__qualname__} (only plain tensors and parameters are rendered)")
        seen = self.saw(guard)
        inference, self.modes = tensor_kind(label, value, pytype, seen.dispatch if seen is not None else None, self.modes)
        if inference:
            self.inference.append(len(self.tensors))
        sizes_strides = self.state.output_graph.input_source_to_sizes_strides.get(guard.originating_source)
        if sizes_strides is None:
            raise Unrenderable(f"{label}: the saved state holds no sizes and strides for it")
        sizes, strides = tuple(sizes_strides["size"]), tuple(sizes_strides["stride"])
        if not all(d is None or type(d) is int for d in (*sizes, *strides)):
            raise Unrenderable(f"{label}: symbolic sizes or strides {sizes} {strides}")
        self.tensors.append((self.lookups.text(slot_source(guard.name)), _TENSOR_TYPES[pytype], str(value.dtype), str(value.device),
                             bool(value.requires_grad), sizes, strides))
        self.tensor_sources.append(source)
        skip_params = dynamo_config.skip_no_tensor_aliasing_guards_on_parameters
        unspecialized = is_from_unspecialized_builtin_nn_module_source(guard.originating_source)
        if not (skip_params and (pytype is torch.nn.Parameter or unspecialized)):
            self.aliasing.append(source)
        parts = [self.renamed(part) for part in dict.fromkeys(guard.code_list or ())
                 if part.startswith(("hasattr(", "((getattr("))]
        if parts and not marking_guard_enforced():
            self.notes.append((label, "dimension markings (mark_dynamic and the like): this torch's guard manager lets "
                                      "any markings pass, so they are not checked here either"))
            return
        for part in parts:
            names_in(part, _MARKING_NAMES, frozenset({"hasattr", "getattr", "issubset", "set"}), label)
        if parts:
            self.marking.append((f"{label}: dimension markings (mark_dynamic and the like)", " and ".join(parts)))

    def identity_line(self, line: str) -> None:
        """One identity guard the artifact checks by name (`source is module:qualname`) or, on an
        immutable constant, by value (`source == literal`: its type, then equality)."""
        kind, rest = line.split(" ", 1)
        match = CHECK.fullmatch(rest)
        if match is None:
            raise Unrenderable(f"{line}: not a by-name or by-value check")
        source, operator, operand = match.groups()
        # A bare root is a local, as the by-name line keeps it (named_identity.SOURCE).
        text = self.expression(_BARE_LOCAL.sub(lambda m: f"{m.group(1) or ''}L[{m.group(2)!r}]", source), line)
        label = f"{kind} {slot_source(source)} {operator} {operand}"
        if operator == "is":
            self.references.add(operand)
            self.lines.append((label, f"{text} is _by_name[{operand!r}]"))
            return
        value = ast.literal_eval(operand)
        if value is None or type(value) is bool:
            self.lines.append((label, f"{text} is {value!r}"))
        else:
            self.lines.append((label, f"type({text}) is {type(value).__name__} and {text} == {literal(value, line)}"))


# Guard type -> the _Variant method that renders it (GRAD_MODE and the like: see _COVERED_BY_GLOBAL_STATE).
_RENDERERS = {
    "GLOBAL_STATE": "global_state_guard",
    "TORCH_FUNCTION_STATE": "torch_function_state",
    "DEFAULT_DEVICE": "default_device",
    "SHAPE_ENV": "shape_env",
    "TENSOR_MATCH": "tensor",
    "TYPE_MATCH": "type_match",
    "FAKE_SCRIPT_TYPE_MATCH": "fake_script_type_match",
    "OPAQUE_OBJ_GUARD_FN_MATCH": "opaque_object_guard",
    "CONSTANT_MATCH": "constant_guard",
    "EQUALS_MATCH": "constant_guard",
    "NOT_PRESENT_IN_GENERIC_DICT": "not_present_in_generic_dict",
    "DICT_CONTAINS": "dict_contains",
    "DICT_NOT_CONTAINS": "dict_contains",
    "SET_CONTAINS": "set_contains",
    "SET_NOT_CONTAINS": "set_contains",
    "DUPLICATE_INPUT": "duplicate_input",
    "DICT_KEYS_MATCH": "dict_keys",
    "HASATTR": "has_attribute",
    "SEQUENCE_LENGTH": "sequence_length",
    "EMPTY_NN_MODULE_HOOKS_DICT": "sequence_length",  # a module's hook table: empty, as at capture (session.py)
    "AUTOGRAD_SAVED_TENSORS_HOOKS": "saved_tensors_hooks",
}
