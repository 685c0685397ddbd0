"""Settings a model keeps in config containers, functions and torch itself, each changed after
capture the way users change them, for the served-or-refused round trip
(tests/roundtrip/test_changed_after_capture.py): importable by the fresh processes it starts.

`KINDS` maps a kind to the change its serving process makes to a freshly built model (and, for the
patches of torch, to torch itself, undone by the function it returns)."""
from __future__ import annotations

import collections
import contextvars
import dataclasses
import enum
import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class AttrDict(dict):
    """A config read as attributes (`cfg.scale`), as many model repos keep theirs."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


Config = collections.namedtuple("Config", "scale shift")


@dataclasses.dataclass(slots=True)
class SlotConfig:
    scale: float = 2.0
    shift: float = 0.5


def make_act(k):
    def act(x):
        return x * k
    return act


def make_scaled(s):
    return lambda x, s=s: x * s  # the value bound as a default, not a cell


class Slotted:
    """A slotted object whose __getattr__ raises on any name it lacks, `__dict__` included."""

    __slots__ = ("_values",)

    def __init__(self, **values):
        self._values = values

    def __getattr__(self, name):
        return self._values[name]


class Scaler:
    """A setting kept as a callable object (`self.act = Scaler(0.5)`), its factor an attribute."""

    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return x * self.k


_SCALER_CALL = Scaler.__call__


class Shifter(Scaler):
    def __call__(self, x):
        return x + self.k


class PlainConfig:
    """A config as a plain object, read for a setting it may lack (`getattr(cfg, "extra", None)`)."""

    scale = 2.0


def hf_config():
    """A transformers config (its __getattribute__ renames names through attribute_map)."""
    import transformers

    return transformers.GPT2Config(n_layer=2)


class ReadsRegistry(nn.Module):
    def forward(self, x):
        return x * 2 if type(self) in OUTPUT_TYPES else x


OUTPUT_TYPES = {ReadsRegistry}
"""A library's registry of classes, filled as its modules import (transformers' _registered_model_output_types)."""


def scaled(x, k):
    return x * k


class PlainLinear(nn.Linear):
    """A subclass that inherits Linear's forward (kind "subclass_forward" patches it on this class)."""


class ModuleSettings:
    """A library's settings object, held in a module global (`SETTINGS.scale`, kind "module_settings";
    `SETTINGS.sub.scale`, kind "nested_settings"; `DEEP_SETTINGS.sub.sub.sub.sub.scale`, "deep_settings")."""

    def __init__(self, sub=True, depth=1):
        self.scale = 2.0
        self.sub = ModuleSettings(sub=depth > 1, depth=depth - 1) if sub else None


SETTINGS = ModuleSettings()
DEEP_SETTINGS = ModuleSettings(depth=4)
SCALE_VAR = contextvars.ContextVar("scale", default=2.0)  # a request-scoped setting (kind "context_var")


def scaled_by_default(x, k=2.0):
    """A module-level helper whose default the forward relies on (kind "global_default")."""
    return x * k


class Tuning:
    """A plain class whose attribute the forward reads through the class (`Tuning.FACTOR`, kind
    "global_class_value")."""

    FACTOR = 2.0


class Mode(enum.Enum):
    PLAIN = 1
    DOUBLED = 2


class Model(nn.Module):
    SCALE = 0.5  # a class attribute the forward reads (kind "class_value")
    MODE = Mode.PLAIN  # an enum class attribute (kind "class_enum")

    @property
    def gain(self):  # a property the forward reads (kind "property"), replaced on the class
        return 2.0

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.lin = PlainLinear(4, 4) if kind == "subclass_forward" else nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.cfg = {"attrdict": AttrDict(scale=2.0), "namedtuple": Config(2.0, 0.5), "slots": SlotConfig(),
                    "array": np.array([2.0, 0.5]), "scalar": np.float64(2.0), "missing_config": PlainConfig(),
                    "hf_config": hf_config() if kind == "hf_config" else None}.get(kind)
        self.act = {"closure": make_act(0.5), "lambda": lambda x: x * 0.5, "defaults": make_scaled(0.5),
                    "partial": functools.partial(scaled, k=0.5), "callable": Scaler(0.5)}.get(kind)
        self.acts = (make_act(0.5),) if kind == "tuple_closure" else None
        self.flags = {"a"} if kind == "set" else None
        self.slotted = Slotted(scale=2.0) if kind == "slotted" else None

    def forward(self, x):
        y = self.lin(x)
        kind = self.kind
        if kind in ("attrdict", "namedtuple", "slots"):
            return y * self.cfg.scale
        if kind == "array":
            return y * float(self.cfg[0])
        if kind == "scalar":
            return y * float(self.cfg)
        if kind in ("closure", "lambda", "defaults", "partial", "callable"):
            return self.act(y)
        if kind == "tuple_closure":
            return self.acts[0](y)
        if kind == "set":
            return y * 3 if "b" in self.flags else y
        if kind == "class_value":
            return y * self.SCALE
        if kind == "missing":
            extra = getattr(self, "extra", None)
            return y if extra is None else y * extra
        if kind in ("missing_config", "hf_config"):
            extra = getattr(self.cfg, "extra", None)
            return y if extra is None else y * extra
        if kind == "slotted":
            return y * self.slotted.scale
        if kind == "module_settings":
            return y * SETTINGS.scale
        if kind == "global_class_value":
            return y * Tuning.FACTOR
        if kind == "global_default":
            return scaled_by_default(y)
        if kind == "nested_settings":
            return y * SETTINGS.sub.scale
        if kind == "deep_settings":
            return y * DEEP_SETTINGS.sub.sub.sub.sub.scale
        if kind == "class_enum":
            return y * 2 if self.MODE is Mode.DOUBLED else y
        if kind == "enum_value":
            return y * self.MODE.value
        if kind == "property":
            return y * self.gain
        if kind == "compiler_setting":
            return y * 2 if torch.compiler.config.job_id is None else y
        if kind == "private_compiler_setting":
            return y if torch._dynamo.config.verbose else y * 2
        if kind == "context_var":
            return y * SCALE_VAR.get()
        if kind == "gelu":
            return F.gelu(y)
        return self.norm(y)  # layernorm


def step(model, x):
    return model(x)


def _set_item(model):
    model.cfg["scale"] = 3.0


def _replace(model):
    model.cfg = model.cfg._replace(scale=3.0)


def _set_slot(model):
    model.cfg.scale = 3.0


def _set_element(model):
    model.cfg[0] = 3.0


def _new_scalar(model):
    model.cfg = np.float64(3.0)


def _swap_closure(model):
    model.act = make_act(2.0)


def _set_cell(model):
    model.act.__closure__[0].cell_contents = 2.0


def _swap_defaults(model):
    model.act = make_scaled(2.0)


def _set_slotted(model):
    model.slotted._values["scale"] = 3.0


def _instance_forward(model):
    model.norm.forward = lambda x: x * 5  # as accelerate's hooks replace a module's forward


def _patch_class_forward(model):
    original = Model.forward
    Model.forward = lambda self, x: self.lin(x) * 7
    return lambda: setattr(Model, "forward", original)


def _set_keyword(model):
    model.act.keywords["k"] = 2.0


def _set_tuple_cell(model):
    model.acts[0].__closure__[0].cell_contents = 2.0


def _set_module_setting(model):
    SETTINGS.scale = 3.0
    return lambda: setattr(SETTINGS, "scale", 2.0)


def _set_global_class_value(model):
    Tuning.FACTOR = 3.0
    return lambda: setattr(Tuning, "FACTOR", 2.0)


def _set_global_default(model):
    scaled_by_default.__defaults__ = (3.0,)
    return lambda: setattr(scaled_by_default, "__defaults__", (2.0,))


def _set_compiler_setting(model):
    torch.compiler.config.job_id = "another job"
    return lambda: setattr(torch.compiler.config, "job_id", None)


def _set_private_compiler_setting(model):
    torch._dynamo.config.verbose = True
    return lambda: setattr(torch._dynamo.config, "verbose", False)


def _set_context_var(model):
    token = SCALE_VAR.set(3.0)
    return lambda: SCALE_VAR.reset(token)


def _set_nested_setting(model):
    SETTINGS.sub.scale = 3.0
    return lambda: setattr(SETTINGS.sub, "scale", 2.0)


def _set_deep_setting(model):
    DEEP_SETTINGS.sub.sub.sub.sub.scale = 3.0
    return lambda: setattr(DEEP_SETTINGS.sub.sub.sub.sub, "scale", 2.0)


def _set_class_enum(model):
    Model.MODE = Mode.DOUBLED
    return lambda: setattr(Model, "MODE", Mode.PLAIN)


def _edit_enum_value(model):
    """As if `PLAIN = 1` were edited to `PLAIN = 3` in the source and the module imported again."""
    global Mode
    original, Mode = Mode, enum.Enum("Mode", {"PLAIN": 3, "DOUBLED": 2}, module=__name__, qualname="Mode")
    Model.MODE = Mode.PLAIN

    def undo():
        global Mode
        Mode = original
        Model.MODE = Mode.PLAIN
    return undo


def _double_linear_output(module, args, output):
    return output * 2 if isinstance(module, nn.Linear) else None


def _register_global_hook(model):
    return torch.nn.modules.module.register_module_forward_hook(_double_linear_output).remove


def _replace_property(model):
    original = Model.gain
    Model.gain = property(lambda self: 3.0)
    return lambda: setattr(Model, "gain", original)


def _add_member(model):
    model.flags.add("b")


def _set_class_value(model):
    Model.SCALE = 2.0
    return lambda: setattr(Model, "SCALE", 0.5)


def _set_instance_value(model):
    model.SCALE = 2.0


def _add_missing(model):
    model.extra = 3.0


class Doubled(Model):
    def forward(self, x):
        return super().forward(x) * 2


def _add_missing_setting(model):
    model.cfg.extra = 3.0


def _give_config_class_getattr(model):
    PlainConfig.__getattr__ = lambda self, name: 3.0  # every name it lacks now reads 3.0
    return lambda: delattr(PlainConfig, "__getattr__")


def _rename_missing_setting(model):
    renames = type(model.cfg).attribute_map
    renames["extra"] = "n_layer"  # cfg.extra now reads n_layer (2)
    return lambda: renames.pop("extra")


def _set_callable_attribute(model):
    model.act.k = 2.0


def _swap_callable_class(model):
    model.act = Shifter(0.5)


def _patch_callable_call(model):
    Scaler.__call__ = lambda self, x: x * self.k * 3
    return lambda: setattr(Scaler, "__call__", _SCALER_CALL)


def _swap_class(model):
    model.__class__ = Doubled


def _patch_linear_call(model):
    original = nn.Linear.__call__
    nn.Linear.__call__ = lambda self, x: original(self, x) * 3  # as a profiling or quantization shim does
    return lambda: delattr(nn.Linear, "__call__")


def _patch_subclass_forward(model):
    PlainLinear.forward = lambda self, x: F.linear(x, self.weight, self.bias) * 3
    return lambda: delattr(PlainLinear, "forward")


def _swap_lambda(model):
    model.act = lambda x: x * 2.0


def _patch_gelu(model):
    original = F.gelu
    F.gelu = lambda x, approximate="none": x * 3
    return lambda: setattr(F, "gelu", original)


def _patch_layer_norm(model):
    original = nn.LayerNorm.forward
    nn.LayerNorm.forward = lambda self, x: x * 5
    return lambda: setattr(nn.LayerNorm, "forward", original)


# kind -> (the change, the tracers it is served by in the test): every change alters eager's result.
KINDS = {
    "attrdict": (_set_item, ("makefx", "dynamo")),
    "namedtuple": (_replace, ("makefx", "dynamo")),
    "slots": (_set_slot, ("makefx", "dynamo")),
    "array": (_set_element, ("makefx",)),
    "scalar": (_new_scalar, ("makefx",)),
    "closure": (_swap_closure, ("makefx", "dynamo")),
    "closure_cell": (_set_cell, ("makefx", "dynamo")),
    "lambda": (_swap_lambda, ("makefx", "dynamo")),
    "defaults": (_swap_defaults, ("makefx", "dynamo")),
    "slotted": (_set_slotted, ("makefx",)),
    "instance_forward": (_instance_forward, ("makefx", "dynamo")),
    "class_forward": (_patch_class_forward, ("makefx", "dynamo")),
    "gelu": (_patch_gelu, ("makefx", "dynamo")),
    "layernorm": (_patch_layer_norm, ("makefx", "dynamo")),
    "partial": (_set_keyword, ("makefx",)),
    "tuple_closure": (_set_tuple_cell, ("makefx",)),
    "set": (_add_member, ("makefx",)),
    "class_value": (_set_class_value, ("makefx", "dynamo")),
    "instance_value": (_set_instance_value, ("makefx",)),
    "missing": (_add_missing, ("makefx",)),
    "class_swap": (_swap_class, ("makefx",)),
    "missing_setting": (_add_missing_setting, ("makefx", "dynamo")),
    "config_getattr": (_give_config_class_getattr, ("makefx", "dynamo")),
    "hf_missing_setting": (_add_missing_setting, ("makefx", "dynamo")),
    "hf_renamed": (_rename_missing_setting, ("makefx", "dynamo")),
    "callable": (_set_callable_attribute, ("makefx", "dynamo")),
    "callable_class": (_swap_callable_class, ("makefx", "dynamo")),
    "callable_call": (_patch_callable_call, ("makefx", "dynamo")),
    "linear_call": (_patch_linear_call, ("makefx", "dynamo")),
    "subclass_forward": (_patch_subclass_forward, ("makefx", "dynamo")),
    "module_settings": (_set_module_setting, ("makefx", "dynamo")),
    "global_class_value": (_set_global_class_value, ("makefx", "dynamo")),
    "global_default": (_set_global_default, ("makefx", "dynamo")),
    "compiler_setting": (_set_compiler_setting, ("makefx", "dynamo")),
    "private_compiler_setting": (_set_private_compiler_setting, ("makefx", "dynamo")),
    "context_var": (_set_context_var, ("makefx", "dynamo")),
    "nested_settings": (_set_nested_setting, ("makefx", "dynamo")),
    "deep_settings": (_set_deep_setting, ("makefx", "dynamo")),
    "class_enum": (_set_class_enum, ("makefx", "dynamo")),
    "enum_value": (_edit_enum_value, ("makefx", "dynamo")),
    "global_hook": (_register_global_hook, ("makefx", "dynamo")),
    "property": (_replace_property, ("makefx", "dynamo")),
}


def model_kind(kind: str) -> str:
    """The Model kind a change kind is made on."""
    return {"closure_cell": "closure", "instance_forward": "layernorm", "class_forward": "layernorm",
            "instance_value": "class_value", "class_swap": "layernorm", "linear_call": "layernorm",
            "missing_setting": "missing_config", "config_getattr": "missing_config", "hf_missing_setting": "hf_config",
            "hf_renamed": "hf_config", "callable_class": "callable", "callable_call": "callable",
            "global_hook": "layernorm"}.get(kind, kind)


def build(kind: str, seed: int = 0):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Model(model_kind(kind)), torch.randn(2, 4)
