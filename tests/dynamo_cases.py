"""Module-level functions for DynamoTracer tests: an importable module, as the tracer requires."""
from __future__ import annotations

import torch

SCALE = 2.0


def break_and_scale(model, x, scale=2.0):
    y = model(x)
    torch._dynamo.graph_break()
    return (y * scale).sin()


def uses_global(x):
    return x * SCALE + 1


def names_its_type(model, x):
    """What transformers' infer_framework_from_repr does: `type()` of a tensor fn computed, which has
    Dynamo install the torch module as a global named by its id (`_<id>_c<n>`) and guard on it."""
    y = model(x)
    return y * 2 if "torch" in repr(type(y)) else y


def keyword_step(x, *, bias=None, alpha=1.0):
    out = x.cos() * alpha
    return out if bias is None else out + bias


def train_step(model, x):
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss.detach()


def adds_a_constant(x):
    return x + torch.tensor([1.0, 2.0])


LIMITS = {"k": 3}


def tail_in_python(x):
    y = x.sin()
    torch._dynamo.graph_break()
    return y, LIMITS["k"] + 1  # nothing here for Dynamo to compile


def break_on_item(model, x):
    y = model(x)
    scale = float(y.abs().sum().item() > 0) + 1.0  # .item() breaks the graph; nothing here names torch._dynamo
    return (y * scale).sin()


def calls_model(model, x):
    return model(x)


def transformer_train_step(model, x):
    from precompile.examples.transformer import run

    loss = run(model, x).pow(2).mean()
    loss.backward()
    return loss.detach()


def train_with_break(model, x):
    """Training across a graph break, with an output that takes no gradient (argmax)."""
    hidden = model[0](x).relu()
    torch._dynamo.graph_break()
    out = model[2](hidden)
    loss = out.pow(2).mean()
    picked = out.argmax(-1)
    loss.backward()
    return loss.detach(), picked


def weight_and_its_transpose(w, x):
    """A training graph returning a view of an input that requires grad: AOTAutograd regenerates it."""
    return (w * x).sum(), w.t()


def raises_its_own(x):
    y = x * 2
    raise ValueError(f"fn's own error on a tensor of shape {tuple(y.shape)}")


def rnn_step(rnn, x):
    """An nn.LSTM (or GRU) called directly: Dynamo gives up on it unless torch._dynamo.config.allow_rnn."""
    return rnn(x)[0]


class BuildsOnFirstCall(torch.nn.Module):
    """Sets state on its first call, as timm's convit (rel_indices) and transformers' rwkv
    (layers_are_rescaled) do."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.ready = False

    def forward(self, x):
        if not self.ready:
            self.ready = True
            self.scale = 2.0
        return self.linear(x) * self.scale


def call(model, x):
    return model(x)


def builds_on_first_call() -> BuildsOnFirstCall:
    torch.manual_seed(0)
    return BuildsOnFirstCall()


class NoGradPositions(torch.nn.Module):
    """A layer whose forward is decorated with @torch.no_grad() (transformers' sinusoidal position
    embeddings): the function Dynamo inlines closes over a bound method, whose class it guards."""

    @torch.no_grad()
    def forward(self, x):
        return torch.arange(x.shape[-1], dtype=x.dtype).expand_as(x)


class WithNoGradPositions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.positions = NoGradPositions()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x + self.positions(x))


def with_no_grad_positions() -> WithNoGradPositions:
    torch.manual_seed(0)
    return WithNoGradPositions()


# Keyed by dtype, as diffusers' _DTYPE_UNSUPPORTED_DEVICES is: Dynamo's guard on the value read by key
# writes the key as its repr (`..._UNSUPPORTED[torch.float64]`).
UNSUPPORTED = {torch.float64: frozenset({"mps", "npu"}), torch.int64: frozenset({"mps", "npu"})}


def positions_in_float64(x):
    """diffusers' rotary embedding: float64 positions, unless UNSUPPORTED says the device lacks it."""
    unsupported = UNSUPPORTED.get(torch.float64)
    dtype = torch.float32 if unsupported and x.device.type in unsupported else torch.float64
    return (x + torch.arange(x.shape[-1], dtype=dtype)).sin()


SUPPORTED_ARGS = {"sdpa": {"query", "key", "value", "attn_mask", "dropout_p", "scale", "enable_gqa"}}
"""diffusers' _AttentionBackendRegistry._supported_arg_names: a backend's argument names, a set of str."""


def drops_unsupported(x, **kwargs):
    """What diffusers' attention dispatch does: the keywords the backend does not take are dropped."""
    removed = set(kwargs) - set(SUPPORTED_ARGS["sdpa"])
    return x * (len(kwargs) - len(removed))


class CountsCalls(torch.nn.Module):
    """A forward that changes state its own guards check: a counter it reads and bumps."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * self.calls


from contextvars import ContextVar  # noqa: E402  (here, not above: the goldens name this module's earlier lines)


class Settings:
    """Settings a library keeps per context, reached through a class (torch 2.15's config module keeps
    a user's overrides in ContextVars reached through the module)."""

    scale = ContextVar("scale", default=None)


def branches_on_a_context_var(x):
    """Reads a ContextVar while traced: Dynamo guards what `Settings.scale.get()` held."""
    return x + 1 if Settings.scale.get() is not None else x * 2


def reads_a_compiler_setting(x):
    """Reads a torch.compiler setting while traced (torch 2.15's Dynamo inlines the config module's
    __getattr__ and guards the override it reads, as it does for functional collectives' read)."""
    return x * 2 if torch.compiler.config.job_id is None else x + 1


import enum  # noqa: E402  (here, not above: the goldens name this module's earlier lines)


class Kind(enum.Enum):
    RED = "red"
    BLUE = "blue"


KINDS = {Kind.RED, Kind.BLUE}


def tests_membership_in_an_enum_set(x):
    """Tests membership in a set of enum members: Dynamo reads the set by position, in the order the
    process's string hash seed gives it (an enum member hashes by its name)."""
    return x * 2 if Kind.RED in KINDS else x


class Palette:
    KINDS = {Kind.RED, Kind.BLUE}  # a class attribute: Dynamo reads it as dict(type(palette).__dict__)['KINDS']


def tests_membership_in_a_class_attribute_set(palette, x):
    return x * 2 if Kind.RED in palette.KINDS else x
