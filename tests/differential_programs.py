"""Generated programs for the differential suite (tests/roundtrip/test_differential_state.py): small
modules whose forward reads Python state of every kind a trace can specialize on, the state changes
to make after capture, and what serving each case must come to.

A program is a JSON-able spec: which state its forward reads (module attributes of each kind, a
config object, config containers (an attribute-style dict, a namedtuple, a slotted dataclass),
globals, a global tensor, a buffer it updates in place, BatchNorm's training flag, a closure cell, a
lambda and a closure kept as attributes, a torch function and a torch layer's forward that a change
patches, a setting read by getattr off a config object, a callable object's attribute, parameters that
require grad or not) with their initial values, and the grad mode it is
captured under. `source(spec)`
renders it as an importable module; `apply(change, ...)` makes one change after capture, to the
eager and the served side alike; `verdict(...)` is the property: the served result equals eager's,
or the call is refused (CallMismatch, or capture refused it), never a silently different result.
"""
from __future__ import annotations

import textwrap

from hypothesis import strategies as st

FEATURES = ("a_float", "a_int", "a_bool", "a_str", "a_enum", "a_dtype", "a_dict", "a_list", "a_act", "cfg", "bn",
            "g_num", "g_flag", "g_int", "g_tensor", "buffer", "closure", "opt", "method", "hook",
            "attrdict", "ntuple", "slotcfg", "lam", "mkact", "torchfn", "layerfwd", "reqgrad", "cfgopt", "callobj")

ADDED = ("opt", "method", "hook", "lam", "torchfn", "layerfwd", "cfgopt")
"""State a change adds or replaces where the capture found another: an attribute read by getattr with
a default (on the model or on its config object), a method replaced on the instance, a forward hook, a lambda defined elsewhere, a torch
function or a torch layer's forward patched; their drawn value is only what the change sets."""

VALUES = {
    "a_float": st.sampled_from([0.5, 1.5, -2.0, 2, True]),  # an int or bool where a float was read
    "a_int": st.sampled_from([1, 2, 3, 2.0]),
    "a_bool": st.booleans(),
    "a_str": st.sampled_from(["up", "down"]),
    "a_enum": st.sampled_from(["A", "B"]),
    "a_dtype": st.sampled_from(["float32", "float64", "bfloat16"]),
    "a_dict": st.sampled_from([2.0, 3.0, 0.5]),
    "a_list": st.sampled_from([1.0, -1.0, 4.0]),
    "a_act": st.sampled_from(["relu", "tanh", "sigmoid"]),
    "opt": st.sampled_from([2.0, 0.5]),
    "method": st.sampled_from([2.0, 3.0]),
    "hook": st.sampled_from([2.0, -1.0]),
    "cfg": st.sampled_from([1.5, 0.25, 1]),
    "bn": st.booleans(),
    "g_num": st.sampled_from([2.5, 0.5, 1.0, 1]),
    "g_flag": st.booleans(),
    "g_int": st.sampled_from([1, 3, 5]),
    "g_tensor": st.sampled_from([0.5, 1.0, -3.0]),
    "buffer": st.sampled_from([0.0, 2.0, 7.0]),
    "closure": st.sampled_from([2.0, 3.0, 0.5]),
    "attrdict": st.sampled_from([1.5, 0.25, 1]),
    "ntuple": st.sampled_from([1.5, 0.25, 1]),
    "slotcfg": st.sampled_from([1.5, 0.25, 1]),
    "lam": st.sampled_from([2.0, 0.5]),
    "mkact": st.sampled_from([2.0, 0.5]),
    "torchfn": st.sampled_from([2.0, -1.0]),
    "layerfwd": st.sampled_from([2.0, -1.0]),
    "reqgrad": st.booleans(),
    "cfgopt": st.sampled_from([2.0, 0.5]),
    "callobj": st.sampled_from([2.0, 0.5, 1.5]),
}


@st.composite
def programs(draw, lead: str | None = None):
    """`lead`: a feature every program drawn has (the suite turns it through FEATURES, so each kind is
    drawn whatever hypothesis' draws favour: they favour the first of a list)."""
    others = [feature for feature in FEATURES if feature != lead]
    features = [*([lead] if lead else []),
                *draw(st.lists(st.sampled_from(others), min_size=0 if lead else 1, max_size=4, unique=True))]
    return {
        "features": sorted(features),
        "values": {name: draw(VALUES[name]) for name in sorted(features)},
        "grad": draw(st.booleans()),
    }


@st.composite
def changes(draw, program):
    """One change after capture: a read value set to another (maybe equal) value, a list or dict
    changed in place, grad mode or default dtype flipped, or nothing."""
    kinds = [f for f in program["features"]] + ["grad", "default_dtype", "none"]
    kind = draw(st.sampled_from(kinds))
    if kind in ("grad", "none"):
        return {"what": kind, "value": not program["grad"] if kind == "grad" else None}
    if kind == "default_dtype":
        return {"what": kind, "value": "float64"}
    return {"what": kind, "value": draw(VALUES[kind])}


def changes_nothing(change: dict, spec: dict) -> bool:
    """A change that sets a value to what it was (same type too): the call must serve, not be refused."""
    if change["what"] == "none":
        return True
    if change["what"] in ("grad", "default_dtype", *ADDED):
        return False
    before = spec["values"][change["what"]]
    return type(before) is type(change["value"]) and before == change["value"]


def source(spec: dict) -> str:
    """The program as a module: build() makes the model (seeded), step(model, x) is fn, and a
    closure program has make_closure(k) instead."""
    f, v = set(spec["features"]), spec["values"]
    init, body = [], ["y = self.lin(x)"]
    if "bn" in f:
        init.append("self.bn = torch.nn.BatchNorm1d(4)")
        init.append(f"self.bn.train({v['bn']!r})")
        body.append("y = self.bn(y)")
    lines = {
        "a_float": ("self.a_float = {!r}", "y = y * self.a_float"),
        "a_int": ("self.a_int = {!r}", "y = y + self.a_int"),
        "a_bool": ("self.a_bool = {!r}", "if self.a_bool:\n    y = y.relu()"),
        "a_str": ("self.a_str = {!r}", "if self.a_str == 'up':\n    y = y + 1.0"),
        "a_enum": ("self.a_enum = Mode.{}", "if self.a_enum is Mode.B:\n    y = -y"),
        "a_dict": ("self.a_dict = {{'k': {!r}}}", "y = y * self.a_dict['k']"),
        "a_list": ("self.a_list = [{!r}]", "y = y + self.a_list[0]"),
        "a_act": ("self.a_act = torch.{}", "y = self.a_act(y)"),
        "opt": (None, "extra = getattr(self, 'extra', None)\nif extra is not None:\n    y = y * extra"),
        "attrdict": ("self.attrdict = AttrDict(gain={!r})", "y = y * self.attrdict.gain"),
        "ntuple": ("self.ntuple = Gains({!r})", "y = y * self.ntuple.gain"),
        "slotcfg": ("self.slotcfg = SlotConfig({!r})", "y = y * self.slotcfg.gain"),
        "lam": ("self.lam = lambda t: t * {!r}", "y = self.lam(y)"),
        "mkact": ("self.mkact = make_act({!r})", "y = self.mkact(y)"),
        "torchfn": (None, "y = torch.nn.functional.silu(y)"),
        "layerfwd": ("self.soft = torch.nn.Softsign()", "y = self.soft(y)"),
        "reqgrad": ("self.requires_grad_({!r})", None),
        "cfgopt": (None, "extra = getattr(self.cfgopt, 'extra', None)\nif extra is not None:\n    y = y * extra"),
        "callobj": ("self.callobj = Scale({!r})", "y = self.callobj(y)"),
        "method": (None, "y = self.helper(y)"),
        "cfg": ("self.cfg = Config({!r})", "y = y * self.cfg.gain"),
        "g_num": (None, "y = y * G_NUM"),
        "g_flag": (None, "if G_FLAG:\n    y = y - 0.5"),
        "g_int": (None, "y = y + G_INT"),
        "g_tensor": (None, "y = y + G_TENSOR"),
        "buffer": ("self.register_buffer('count', torch.full((), {!r}))", "self.count.add_(1.0)\ny = y + self.count"),
        "a_dtype": ("self.a_dtype = torch.{}", None),
    }
    if "cfgopt" in f:
        init.append("self.cfgopt = Config(1.0)")
    for name in sorted(f & set(lines)):
        setup, use = lines[name]
        if setup:
            init.append(setup.format(v[name]))
        if use:
            body.extend(use.splitlines())
    if "a_dtype" in f:
        body.append("y = y.to(self.a_dtype)")
    body.append("return y")
    module_globals = [
        f"G_NUM = {v.get('g_num', 1.0)!r}",
        f"G_FLAG = {v.get('g_flag', True)!r}",
        f"G_INT = {v.get('g_int', 1)!r}",
        f"G_TENSOR = torch.full((4,), {v.get('g_tensor', 0.0)!r})",
    ]
    fn = (f"def make_closure(k):\n    def closed(model, x):\n        return model(x) * k\n    return closed\n"
          if "closure" in f else "def step(model, x):\n    return model(x)\n")
    return "\n".join([
        "import collections", "import dataclasses", "import enum", "import torch", "",
        "class Mode(enum.Enum):", "    A = 'a'", "    B = 'b'", "",
        "class Config:", "    def __init__(self, gain):", "        self.gain = gain", "",
        "class AttrDict(dict):", "    def __getattr__(self, name):", "        return self[name]", "",
        "class Scale:", "    def __init__(self, k):", "        self.k = k", "",
        "    def __call__(self, t):", "        return t * self.k", "",
        "Gains = collections.namedtuple('Gains', 'gain')", "",
        "@dataclasses.dataclass(slots=True)", "class SlotConfig:", "    gain: float", "",
        "def make_act(k):", "    def act(t):", "        return t * k", "    return act", "",
        *module_globals, "",
        "class M(torch.nn.Module):",
        "    def __init__(self):", "        super().__init__()", "        self.lin = torch.nn.Linear(4, 4)",
        textwrap.indent("\n".join(init), " " * 8) if init else "",
        "    def helper(self, y):", "        return y + 1.0", "",
        "    def forward(self, x):", textwrap.indent("\n".join(body), " " * 8), "",
        "def build():", "    torch.manual_seed(0)", "    return M()", "",
        fn,
    ]) + "\n"


def apply_to_model(change: dict, model) -> None:
    """The part of a change made to each side's own model."""
    import sys
    import types

    import torch

    what, value = change["what"], change["value"]
    if what in ("a_float", "a_int", "a_bool", "a_str"):
        setattr(model, what, value)
    elif what == "a_enum":
        model.a_enum = type(model.a_enum)[value]
    elif what in ("a_dtype", "a_act"):
        setattr(model, what, getattr(torch, value))
    elif what == "opt":
        model.extra = value
    elif what == "method":
        model.helper = types.MethodType(lambda self, y, k=value: y * k, model)
    elif what == "hook":
        model.lin.register_forward_hook(lambda module, inputs, output, k=value: output * k)
    elif what == "a_dict":
        model.a_dict["k"] = value
    elif what == "a_list":
        model.a_list[0] = value
    elif what == "cfg":
        model.cfg.gain = value
    elif what == "attrdict":
        model.attrdict["gain"] = value
    elif what == "ntuple":
        model.ntuple = model.ntuple._replace(gain=value)
    elif what == "cfgopt":
        model.cfgopt.extra = value
    elif what == "callobj":
        model.callobj.k = value
    elif what == "slotcfg":
        model.slotcfg.gain = value
    elif what == "lam":
        model.lam = lambda t, k=value: t * k
    elif what == "mkact":
        model.mkact = sys.modules[type(model).__module__].make_act(value)
    elif what == "reqgrad":
        model.requires_grad_(value)
    elif what == "bn":
        model.bn.train(value)
    elif what == "buffer":
        with torch.no_grad():
            model.count.fill_(value)


def apply_to_module(change: dict, module) -> None:
    """The part of a change made to the program's module, which both sides share."""
    what, value = change["what"], change["value"]
    if what in ("g_num", "g_flag", "g_int"):
        setattr(module, what.upper(), value)
    elif what == "g_tensor":
        module.G_TENSOR.fill_(value)  # in place: the same tensor object, other values


def apply_to_torch(change: dict):
    """The part of a change made to torch itself, which both sides share: a torch function or a torch
    layer's forward patched. Returns what undoes it (None where the change patches nothing)."""
    import torch

    what, value = change["what"], change["value"]
    if what == "torchfn":
        owner, name, patch = torch.nn.functional, "silu", (lambda t, inplace=False, k=value: t * k)
    elif what == "layerfwd":
        owner, name, patch = torch.nn.Softsign, "forward", (lambda self, t, k=value: t * k)
    else:
        return None
    original = vars(owner)[name]
    setattr(owner, name, patch)
    return lambda: setattr(owner, name, original)
