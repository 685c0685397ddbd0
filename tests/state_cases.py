"""Functions and a module whose result depends on Python state besides their arguments: module
attributes, globals, a closure, torch's global state (tests/capturing/test_makefx_reads.py, the
differential suite). An importable module, so a fresh process reads the same globals by name."""
from __future__ import annotations

import enum

import torch

import state_settings as settings_module

G = torch.ones(3)  # a global tensor: a MakeFx artifact must not bake it
FLAG = True
K = 3
DTYPE = torch.float32


class Mode(enum.Enum):
    A = "a"
    B = "b"


class Settings:
    """A plain object hanging off the module, as a transformers config does."""

    def __init__(self) -> None:
        self.shift = 0.25
        self.use_shift = True


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.0)
        self.scale = 1.0
        self.mode = "a"
        self.kind = Mode.A
        self.repeats = 1
        self.settings = Settings()
        self.table = torch.arange(4.0)  # a plain tensor attribute, not a registered buffer

    def forward(self, x):
        y = self.drop(self.lin(x)) * self.scale
        if self.mode == "a" and FLAG:
            y = y + K
        if self.kind is Mode.B:
            y = -y
        for _ in range(self.repeats):
            y = y.tanh()
        if self.settings.use_shift:
            y = y + self.settings.shift
        return y.to(DTYPE)


def step(model, x):
    return model(x)


def adds_global(x):
    return x + G


def adds_fresh(x):
    return x + torch.tensor([1.0, 2.0, 3.0])


def reads_table(model, x):
    return model(x) + model.table


def make_closure(k):
    def closed(model, x):
        return model(x) * k

    return closed


def closes_over_tensor(t):
    def closed(x):
        return x + t

    return closed


class Counter(torch.nn.Module):
    """Counts its calls in a Python attribute the forward reads: state the call itself changes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * self.calls


class Table(torch.nn.Module):
    """Reads a dict and a list attribute, which can change in place."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = {"a": 2.0}
        self.offsets = [1.0]

    def forward(self, x):
        return x * self.weights["a"] + self.offsets[0]


class ViaGetattr(torch.nn.Module):
    """Reads its setting with getattr and a constant name."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = 2.0

    def forward(self, x):
        return x * getattr(self, "gain", 1.0)


class ViaComprehension(torch.nn.Module):
    """Reads its setting inside a comprehension, whose code sees `self` as a free variable."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = 2.0

    def forward(self, x):
        return torch.stack([x * self.gain for _ in range(2)]).sum(0)


class ViaModule(torch.nn.Module):
    """Reads an attribute of an imported module, and runs a submodule that reads nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.act = torch.nn.Tanh()

    def forward(self, x):
        return self.act(x) * settings_module.SCALE


class Odd(torch.nn.Module):
    """Values of kinds a spelling must survive: a list holding itself, an int of thousands of digits."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = [1.0]
        self.loop.append(self.loop)
        self.huge = 10**5000
        self.order = {"a": 1.0, "b": 2.0}

    def forward(self, x):
        return x * len(self.loop) + (self.huge % 7) + torch.tensor(list(self.order.values()))[0]


class Knobs:
    """Settings a model keeps on a plain object and its forward reads through a local alias."""

    def __init__(self) -> None:
        self.flag = True
        self.act = torch.relu


class Aliased(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.knobs = Knobs()

    def forward(self, x):
        knobs = self.knobs
        y = self.lin(x)
        if knobs.flag:
            y = y + 1
        if getattr(knobs, "boost", None):  # a setting the config may lack, read through the alias
            y = y * 2
        return knobs.act(y)


class AsksGradMode(torch.nn.Module):
    """Frozen (no parameter requires grad), so only its branch depends on grad mode."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4).requires_grad_(False)

    def forward(self, x):
        y = self.lin(x)
        return y * 2 if torch.is_grad_enabled() else y


class AsksInferenceMode(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return y * 2 if torch.is_inference_mode_enabled() else y


def reads_modes(model, x):
    """A branch on membership in a set attribute."""
    y = model.lin(x)
    return y * 2 if "a" in model.modes else y


class CallsHelper(torch.nn.Module):
    """Calls a method of its own: one replaced on the instance after capture changes what runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def helper(self, y):
        return y + 1

    def forward(self, x):
        return self.helper(self.lin(x))


class OptionalExtra(torch.nn.Module):
    """Reads an attribute it may lack (`getattr(self, "extra", None)`): absent at capture, set after."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        extra = getattr(self, "extra", None)
        return y if extra is None else y * extra


class AsksBackendFlag(torch.nn.Module):
    """Branches on a torch.backends flag, as code choosing a fast path does."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return y * 2 if torch.backends.mkldnn.enabled else y


class Activated(torch.nn.Module):
    """Keeps its activation as a setting: swapping it for another function changes what runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.act = torch.relu

    def forward(self, x):
        return self.act(self.lin(x))
