"""What a MakeFx trace sees of autograd that its ATen graph does not keep.

The graph is ATen ops; served where autograd records a call, they record it as if fn were those ops
alone. That is eager's autograd unless fn's own code shapes it: a region that records nothing
(`torch.no_grad()`, `inference_mode()`, an autograd.Function's forward, whose `backward` the graph
never holds) over a tensor that requires grad, grad turned on inside a call that runs without it,
a hook on a tensor, `detach_()`, `requires_grad_()`, `torch.autograd.grad`. `watching()` notes the
first such use while fn runs, and whether fn reads a tensor's `requires_grad` (a branch on it is
specialized by the trace like any other Python value)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from precompile.torch_compat import pytree

# Tensor methods that shape autograd without an ATen op the graph keeps.
_AUTOGRAD_CALLS = {"register_hook": "registers a hook on a tensor", "register_post_accumulate_grad_hook": "registers a hook on a tensor",
                   "retain_grad": "retains a tensor's grad", "requires_grad_": "sets requires_grad on a tensor",
                   "detach_": "detaches a tensor in place", "grad": "calls torch.autograd.grad"}


@dataclass
class AutogradSeen:
    unfaithful: str | None = None
    """Why autograd through the graph would differ from eager's (the first use seen), or None."""
    in_any_mode: bool = False
    """The use turns grad on inside a call that runs without it: eager's result then carries autograd
    whatever grad mode a call comes in, the graph's never does."""
    reads_requires_grad: bool = False


class _Watch(TorchFunctionMode):
    def __init__(self, seen: AutogradSeen, ambient: bool) -> None:
        super().__init__()
        self.seen, self.ambient = seen, ambient

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__" and getattr(getattr(func, "__self__", None), "__name__", "") == "requires_grad":
            self.seen.reads_requires_grad = True
        elif self.seen.unfaithful is None:
            self._note(func, name, args, kwargs)
        return func(*args, **kwargs)

    def _note(self, func, name, args, kwargs) -> None:
        if name in _AUTOGRAD_CALLS and (func is torch.autograd.grad or name != "grad"):
            self.seen.unfaithful = f"fn {_AUTOGRAD_CALLS[name]} ({name})"
            return
        enabled = torch.is_grad_enabled()
        if enabled == self.ambient:
            return
        tensors = [leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
        if not any(t.requires_grad for t in tensors):
            return
        if enabled:
            self.seen.unfaithful = f"fn turns grad mode on inside (torch.enable_grad) around {name}, on a tensor that requires grad"
            self.seen.in_any_mode = True
        else:
            self.seen.unfaithful = (f"fn runs {name} where autograd records nothing (torch.no_grad, inference_mode or an "
                                    "autograd.Function's forward) on a tensor that requires grad")


@contextlib.contextmanager
def watching():
    """Note, while fn runs inside, what its code does to autograd that the graph will not keep."""
    seen = AutogradSeen()
    with _Watch(seen, torch.is_grad_enabled()):
        yield seen
