# What the rendered guards of a standalone Dynamo artifact check with (precompile/codegen/drivers/
# dynamo_guards.py, included verbatim before them). Everything here is torch's C++ guard machinery
# or plain Python: nothing imports torch._dynamo.
import math  # noqa: F401 - shape guards call math.isnan

import torch
import torch.utils._device as _device_module  # noqa: F401 - DEFAULT_DEVICE guards read CURRENT_DEVICE
from torch._C._dynamo.guards import GlobalStateGuard as _GlobalStateGuard
from torch._C._dynamo.guards import TensorGuards as _TensorGuards

if "dispatch_key_sets" not in globals():  # imported as a module of its own; python_code has the section above
    from precompile.codegen.drivers.dispatch_state import captured_under, dispatch_key_sets

# Shape guards on an unspecialized float compare it with itself read back through a tensor, with
# the function Dynamo's own shape guards name so.
___as_tensor = torch._as_tensor_fullprec

# The objects guards compare with by identity, by "module:qualname" reference; the driver resolves
# them at load (a reference that does not resolve refuses the load).
_by_name: dict = {}


def _inlineable_saved_tensors_hooks():
    """Whether the innermost saved-tensors hooks are a pair torch would inline (two GraphModules): the
    AUTOGRAD_SAVED_TENSORS_HOOKS guard of a capture that ran with none such holds while this is False."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(True)
    return bool(hooks) and all(isinstance(hook, torch.fx.GraphModule) for hook in hooks)


def _tensor_type(ref):
    return torch.nn.Parameter if ref == "torch.nn.parameter:Parameter" else torch.Tensor


def tensor_example(pytype, dtype, device, requires_grad, inference):
    """An empty tensor of a TENSOR_MATCH row's kind: a plain tensor, or an inference tensor (made in
    inference mode), whatever mode the thread that builds it is in. requires_grad is set inside that
    mode too: torch refuses it on an inference tensor outside inference mode (a model built under
    inference_mode has such parameters)."""
    with torch.inference_mode(inference):
        example = torch.empty(0, dtype=getattr(torch, dtype.removeprefix("torch.")), device=device)
        if pytype is torch.nn.Parameter:
            return torch.nn.Parameter(example, requires_grad=requires_grad)
        return example.requires_grad_(requires_grad)


class _TensorMatch:
    """Every TENSOR_MATCH of a variant as one C++ TensorGuards check: the Python type, dispatch keys,
    dtype, device, requires_grad, sizes and strides (None: a dynamic dim, any size) of each tensor, as
    captured. Rows: (source, type reference, dtype, device, requires_grad, sizes, strides).
    `inference`: the rows whose tensor was an inference tensor; `modes`: what the capture's call ran
    under that changes how torch reads dispatch keys ("inference_mode", "autocast:<device type>"),
    so a call matches as it did then, whatever mode the process that loads this file is in."""

    def __init__(self, rows, *, inference=(), modes=()):
        self.names = [row[0] for row in rows]
        self.modes, self.inference = modes, inference
        # TensorGuards reads only an example's type, dispatch keys, dtype, device and requires_grad (the
        # sizes and strides are given): rows alike share one example (a model's parameters, mostly).
        made = {}
        examples = []
        for index, (_, pytype, dtype, device, requires_grad, _, _) in enumerate(rows):
            kind = (_tensor_type(pytype), dtype, device, requires_grad, index in inference)
            if kind not in made:
                made[kind] = tensor_example(*kind)
            examples.append(made[kind])
        # torch's stub types each of these as one tensor's dims; TensorGuards takes a list per tensor.
        with torch._C._ForceDispatchKeyGuard(*dispatch_key_sets(modes)):
            self.guards = _TensorGuards(*examples, dynamic_dims_sizes=[list(row[5]) for row in rows],  # type: ignore[misc]
                                        dynamic_dims_strides=[list(row[6]) for row in rows])  # type: ignore[misc]

    def check(self, tensors):
        return self.guards.check(*tensors)

    def reason(self, tensors):
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            kinds = ", ".join(f"{name}: {type(t).__name__}" for name, t in zip(self.names, tensors))
            return f"TENSOR_MATCH: expected tensors ({kinds})"
        verbose = self.guards.check_verbose(*tensors, tensor_check_names=self.names)
        if "dispatch key set mismatch" in str(verbose):
            verbose = f"{verbose} {captured_under(self.modes)}"
            # The one cause a call's tensors show: one is (or is not) an inference tensor where the capture's was not.
            flipped = [(name, t.is_inference()) for index, (name, t) in enumerate(zip(self.names, tensors))
                       if t.is_inference() != (index in self.inference)]
            if flipped:
                name, now = flipped[0]
                verbose = (f"{verbose}; {name} is {'' if now else 'not '}an inference tensor, the captured one "
                           f"was {'not ' if now else ''}one")
        return f"TENSOR_MATCH: {verbose}"


class _GlobalState:
    """The GLOBAL_STATE guard: grad mode, autocast, default dtype, deterministic algorithms, torch
    function enablement and the rest, as captured (JSON), checked by torch's C++ GlobalStateGuard.
    It also pins torch.get_num_threads(); that one is kept at the serving process's current count
    (capture leaves the capturing process's out of the JSON), so serving with another thread count
    matches while everything else stays checked."""

    def __init__(self, captured):
        import json

        self.state = json.loads(captured)
        self.threads = None
        self.guard = _GlobalStateGuard()
        self.sync()

    def sync(self):
        import json

        self.threads = torch.get_num_threads()
        self.state["num_threads"] = self.threads
        self.guard.__setstate__(json.dumps(self.state))  # type: ignore[attr-defined]  # torch's stub omits the pickle protocol

    def check(self):
        if torch.get_num_threads() != self.threads:
            self.sync()
        return self.guard.check()

    def reason(self):
        return "GLOBAL_STATE changed: " + (self.guard.reason() or "").strip()
