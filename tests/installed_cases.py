"""Models whose graph breaks sit inside a child module, for installed-mode tests: an importable
module, since an installed artifact finds each frame again by module and qualified name."""
from __future__ import annotations

import math

import torch

import installed_settings as settings

FLAG = True


class PrintingChild(torch.nn.Module):
    """Its forward graph-breaks on a print, as ordinary model code does."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.linear(x)
        print("child saw", tuple(y.shape))
        return torch.relu(y) * 2


class DisabledHelperChild(torch.nn.Module):
    """Calls a torch.compiler.disable'd method: Dynamo runs it eagerly and graph-breaks around it."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    @torch.compiler.disable
    def clamp_eagerly(self, y):
        return y.clamp(-1.0, 1.0)

    def forward(self, x):
        return self.clamp_eagerly(self.linear(x)).tanh()


class Parent(torch.nn.Module):
    def __init__(self, child: torch.nn.Module):
        super().__init__()
        self.pre = torch.nn.Linear(8, 8)
        self.child = child

    def forward(self, x):
        return self.child(self.pre(x).sin()) + 1


class Holder(Parent):
    """Another parent class: two installed artifacts cannot share a frame in one process."""

    def forward(self, x):
        return self.child(self.pre(x).cos()) - 1


def make(kind: str) -> Parent:
    torch.manual_seed(0)
    return Parent(PrintingChild()) if kind == "print" else Holder(DisabledHelperChild())


def run(model, x):
    return model(x)


def run_holder(model, x):
    return model(x)


def train(model, x):
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss.detach()


def flagged(x, scale):
    return x * scale + 1 if FLAG else x


class BreakingMLP(torch.nn.Module):
    """Wraps a transformers layer's MLP and graph-breaks inside it (a print, as debugging code does)."""

    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        out = self.mlp(x)
        print("mlp", tuple(out.shape))
        return out


def tiny_llama():
    """A two-layer Llama built from a tiny config (nothing downloaded), its first layer's MLP breaking."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    model = LlamaForCausalLM(config).eval()
    model.model.layers[0].mlp = BreakingMLP(model.model.layers[0].mlp)
    return model


def llama_logits(model, ids):
    return model(input_ids=ids, use_cache=False).logits


def scaled(x, factor=2.0):
    return x * factor


def _function_module(func, reduces_itself: bool):
    """A module class made inside a function that wraps `func`, as kernels' use_kernel_forward_from_hub
    makes one per function (transformers 5.25's Llama keeps one per attention layer); with
    `reduces_itself`, its __reduce__ rebuilds an instance by an importable name, as kernels' does."""

    class FunctionModule(torch.nn.Module):
        def forward(self, *args):
            return func(*args)

        if reduces_itself:
            def __reduce__(self):
                return rebuild_function_module, (func.__name__,), self.__dict__.copy()

    return FunctionModule


PicklingFunctionModule = _function_module(scaled, reduces_itself=True)
BareFunctionModule = _function_module(scaled, reduces_itself=False)


def rebuild_function_module(name):
    assert name == "scaled"
    return PicklingFunctionModule()


class FunctionModuleChild(torch.nn.Module):
    """Keeps a function module in a plain dict attribute (not a submodule), as kernels'
    use_kernelized_func does (`_kernel_funcs`), calls it, and graph-breaks on a print."""

    def __init__(self, function_module):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.__dict__["_funcs"] = {"scaled": function_module}

    def forward(self, x):
        y = self._funcs["scaled"](self.linear(x))
        print("child saw", tuple(y.shape))
        return torch.relu(y)


def make_function_module(reduces_itself: bool) -> Parent:
    torch.manual_seed(0)
    module = PicklingFunctionModule() if reduces_itself else BareFunctionModule()
    return Parent(FunctionModuleChild(module))


class TypeCheckingChild(torch.nn.Module):
    """Graph-breaks, then asks `type(y) is torch.Tensor` (as longformer's attention does): Dynamo binds
    the torch module under a global named by its id in this process (`_<id>_c<n>`) and guards
    `G['_<id>_c<n>'].Tensor`."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.linear(x)
        print("child saw", tuple(y.shape))
        return y * 2 if type(y) is torch.Tensor else y


def make_type_checking() -> Parent:
    torch.manual_seed(0)
    return Parent(TypeCheckingChild())


def breaks_under_autocast(model, x):
    """A graph break inside an autocast block: the code Dynamo builds to re-enter the block holds
    torch.bfloat16 as a constant, which marshal cannot write."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(x)
        print("under autocast", tuple(y.shape))
        return model(y.float()) + 1


def shifted(y, by=0.5):
    return y + by


class SettingBase(torch.nn.Module):
    OFFSET = 1.0


class LibrarySettingChild(SettingBase):
    """Reads, around a graph break, what torch's pickled guard state holds by reference: a library's
    settings through its module (`settings.SCALE`, a bool, a dtype, a list's length, an infinite
    float), the standard library's `math.pi`, a class attribute its base class holds (`self.OFFSET`:
    Dynamo reads `type(self).__mro__[1].__dict__`) and a function's default (`shifted`'s `by`)."""

    def forward(self, x):
        y = x.to(settings.DTYPE) * settings.SCALE
        for weight in settings.WEIGHTS:
            y = y * weight
        print("child saw", tuple(y.shape))
        y = shifted(y.clamp(max=settings.LIMIT)) + self.OFFSET
        return y + math.pi if settings.FAST_PATH else y - 1


def make_library_setting() -> Parent:
    torch.manual_seed(0)
    return Parent(LibrarySettingChild())


class NumpySettingChild(torch.nn.Module):
    """Reads a numpy scalar a library keeps (`settings.NPF`, set by the test) around a graph break:
    Dynamo turns it into a tensor and saves that tensor's check in a form torch cannot build again."""

    def forward(self, x):
        y = x * float(settings.NPF)
        print("child saw", tuple(y.shape))
        return y
