# Driver of a MakeFxTracer artifact (precompile/codegen/drivers/makefx.py, included verbatim).
# It checks a call against the captured calling convention, runs the captured graph on the
# runtime model's parameters and buffers, scatters parameter gradients like eager .backward(),
# and rebuilds fn's result.
import gc as _gc

import torch
import torch.utils._pytree as _pytree
from torch._C._dynamo.guards import TensorGuards as _TensorGuards

try:
    from precompile.errors import CallMismatch
except ImportError:  # served where only torch is installed: twins of the same names

    class PrecompileError(RuntimeError):
        pass

    class CallMismatch(PrecompileError):
        pass


def _dtype(name):
    return getattr(torch, name.removeprefix("torch."))


def _shape_text(shape):
    return "(" + ", ".join("*" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _one_line(spec):
    return " ".join(str(spec).split())


def _state_slots(modules):
    """(kind, name, owning module, key, tensor) of every parameter then buffer, as named_parameters /
    named_buffers(remove_duplicate=False) list them; names get an `m{i}.` prefix for several modules."""
    prefix = len(modules) > 1
    for kind, attribute in (("param", "_parameters"), ("buffer", "_buffers")):
        for slot, module in enumerate(modules):
            for path, owner in module.named_modules(remove_duplicate=False):
                for key, tensor in getattr(owner, attribute).items():
                    if tensor is None:
                        continue
                    name = f"{path}.{key}" if path else key
                    yield kind, (f"m{slot}.{name}" if prefix else name), owner, key, tensor


def collect_params_and_buffers(modules):
    """Parameters then buffers of `modules`, each tensor once under its first name (tied weights)."""
    seen = set()
    params: list = []
    buffers: list = []
    for kind, name, _, _, tensor in _state_slots(modules):
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        (params if kind == "param" else buffers).append((name, tensor))
    return params, buffers


class _StatePlan:
    """Where each parameter and buffer of a validated model lives, to fetch them again cheaply.

    `gather` returns the tensors in the captured order, or None when the model's structure may have
    changed (a submodule replaced, a tensor added, removed or untied): the caller then re-validates.
    """

    def __init__(self, modules):
        self.modules = list(modules)
        self.owners = []  # (module, children ids, number of params, number of buffers)
        for module in self.modules:
            for _, owner in module.named_modules(remove_duplicate=False):
                self.owners.append((owner, tuple(map(id, owner._modules.values())),
                                    len(owner._parameters), len(owner._buffers)))
        first: dict = {}
        self.fetch: list = []  # (owner dict, key) of each distinct tensor
        self.ties = []  # (owner dict, key, index into fetch) of each repeat of a tied tensor
        for _, _, owner, key, tensor in _state_slots(self.modules):
            table = owner._parameters if key in owner._parameters else owner._buffers
            if id(tensor) in first:
                self.ties.append((table, key, first[id(tensor)]))
            else:
                first[id(tensor)] = len(self.fetch)
                self.fetch.append((table, key))

    def gather(self, modules):
        if len(modules) != len(self.modules) or any(a is not b for a, b in zip(modules, self.modules)):
            return None
        for owner, children, n_params, n_buffers in self.owners:
            if (len(owner._parameters) != n_params or len(owner._buffers) != n_buffers
                    or tuple(map(id, owner._modules.values())) != children):
                return None
        try:
            tensors = [table[key] for table, key in self.fetch]
            if any(table[key] is not tensors[index] for table, key, index in self.ties):
                return None
        except KeyError:
            return None
        if any(t is None for t in tensors):
            return None
        return tensors


class _TensorCheck:
    __slots__ = ("path", "shape", "dims", "dtype", "device", "stride")

    def __init__(self, path, shape, dtype, device, stride=None):
        self.path = path
        self.shape = tuple(shape)
        self.dims = None if None not in shape else tuple(i for i, d in enumerate(shape) if d is not None)
        self.dtype = _dtype(dtype)
        self.device = torch.device(device)
        # Strides matter only where a dim has more than one element and a fixed size.
        self.stride = None if stride is None else tuple(
            (i, s) for i, (s, d) in enumerate(zip(stride, shape)) if s is not None and d is not None and d > 1
        )

    def problem(self, value):
        if not isinstance(value, torch.Tensor):
            return f"expected a tensor, got {type(value).__name__}"
        if self.dims is None:
            if value.shape != self.shape:
                return f"expected shape {_shape_text(self.shape)}, got {_shape_text(tuple(value.shape))}"
        elif value.dim() != len(self.shape) or any(value.shape[i] != self.shape[i] for i in self.dims):
            return f"expected shape {_shape_text(self.shape)} (* = any size), got {_shape_text(tuple(value.shape))}"
        if value.dtype != self.dtype:
            return f"expected dtype {self.dtype}, got {value.dtype}"
        if value.device != self.device:
            return f"expected device {self.device}, got {value.device}"
        if self.stride:
            actual = value.stride()
            if any(actual[i] != s for i, s in self.stride):
                return (f"expected the captured memory layout (strides {_shape_text(tuple(s for _, s in self.stride))} "
                        f"on dims {[i for i, _ in self.stride]}), got strides {_shape_text(actual)}")
        return None


def build_forward(metadata, run_graph, artifact="this artifact"):
    """The served `forward(*args)` of an artifact whose metadata literals are in `metadata`.

    `run_graph(*params, *buffers, *tensor_inputs)` runs the captured graph and returns its flat
    outputs: fn's tensor results, then the gradients of GRAD_PARAM_INDICES.
    """
    return _ServedForward(metadata, run_graph, artifact)


class _ServedForward:
    """One artifact's forward: checks a call against the calling convention, runs the graph, and
    rebuilds fn's result. The first call that passes every check (in Python, naming what differs)
    leaves a C++ check of exactly those tensors' metadata that later calls pass through instead."""

    def __init__(self, metadata, run_graph, artifact):
        self.run_graph = run_graph
        self.artifact = artifact
        self.num_args = metadata["NUM_POSITIONAL_ARGS"]
        self.module_positions = tuple(metadata["MODULE_POSITIONS"])
        self.expected_names = [p["name"] for p in metadata["PARAMS"]] + [b["name"] for b in metadata["BUFFERS"]]
        self.state_checks = [_TensorCheck(t["name"], t["shape"], t["dtype"], t["device"], t.get("stride"))
                             for t in (*metadata["PARAMS"], *metadata["BUFFERS"])]
        self.in_spec = _pytree.treespec_loads(metadata["IN_SPEC"])
        self.out_spec = _pytree.treespec_loads(metadata["OUT_SPEC"])
        # A tensor input's check, or (path, value) of a non-tensor input baked into the graph.
        self.input_checks = [
            _TensorCheck(leaf["path"], leaf["shape"], leaf["dtype"], leaf["device"], leaf.get("stride"))
            if leaf["kind"] == "tensor" else (leaf["path"], leaf["value"])
            for leaf in metadata["INPUTS"]
        ]
        self.tensor_checks = [c for c in self.input_checks if isinstance(c, _TensorCheck)]
        self.outputs = [leaf if leaf["kind"] == "constant" else None for leaf in metadata["OUTPUTS"]]
        self.grad_indices = tuple(metadata["GRAD_PARAM_INDICES"])
        # Dims marked with mark_unbacked: (tensor input index, dim, its spec, path), checked on every call
        # since a size is free there only within its bounds and equal to the dims sharing its symbol.
        self.unbacked = [(index, dim, spec, leaf["path"])
                         for index, leaf in enumerate(leaf for leaf in metadata["INPUTS"] if leaf["kind"] == "tensor")
                         for dim, spec in (leaf.get("unbacked") or {}).items()]
        self.dynamic_sizes = [list(c.shape) for c in (*self.state_checks, *self.tensor_checks)]
        self.trusted = None  # (the model's _StatePlan, the C++ guards) of the last call that passed every check

    def fail(self, message, remedy):
        raise CallMismatch(f"{self.artifact}: {message}; {remedy}")

    def __call__(self, *args, **kwargs):
        modules, tensors = self.arguments(args, kwargs)
        state_tensors = None
        if self.trusted is not None:
            plan, guards = self.trusted
            state_tensors = plan.gather(modules)
            if state_tensors is not None and not guards.check(*state_tensors, *tensors):
                state_tensors = None
        if state_tensors is None:
            # First call, a changed model or a mismatch: check everything, then trust it again. The
            # checks build long-lived objects, a few per parameter and no cycle: as during load, the
            # cyclic collector waits rather than pay, in the middle of the first call, the full pass
            # over torch's objects that the process's import and model build have run up.
            collecting = _gc.isenabled()
            _gc.disable()
            try:
                state_tensors = self.validate(modules, tensors)
            finally:
                if collecting:
                    _gc.enable()
        if self.unbacked:
            self.check_unbacked(tensors)
        return self.run(state_tensors, tensors)

    def arguments(self, args, kwargs):
        """The model arguments and the tensor inputs of a call, its structure and constants checked."""
        if kwargs:
            self.fail(f"got keyword arguments {sorted(kwargs)}, but a MakeFxTracer artifact takes positional arguments only",
                      "pass them positionally, as in the captured call")
        if len(args) != self.num_args:
            self.fail(f"expected {self.num_args} positional arguments, got {len(args)}", "call it with the captured call's arguments")
        modules = []
        for position in self.module_positions:
            if not isinstance(args[position], torch.nn.Module):
                self.fail(f"argument {position} must be an nn.Module (the captured call passed one there), got {type(args[position]).__name__}",
                          "pass the model in the same position")
            modules.append(args[position])
        leaves, spec = _pytree.tree_flatten({i: a for i, a in enumerate(args) if i not in self.module_positions})
        if spec != self.in_spec:
            self.fail(f"the inputs have structure {_one_line(spec)} but the artifact was captured with {_one_line(self.in_spec)}",
                      "pass inputs with the captured structure")
        tensors = []
        for check, value in zip(self.input_checks, leaves):
            if isinstance(check, tuple):
                if type(value) is not type(check[1]) or value != check[1]:  # a tensor or array compares elementwise
                    self.fail(f"input {check[0]} is {value!r} but the artifact was captured with {check[1]!r} (non-tensor inputs are baked into the graph)",
                              "pass the captured value, or capture again with this one")
                continue
            if not isinstance(value, torch.Tensor):
                self.fail(f"input {check.path}: expected a tensor, got {type(value).__name__}", "pass a tensor there")
            tensors.append(value)
        return modules, tensors

    def validate(self, modules, tensors):
        """The full checks, in Python: a CallMismatch that names the tensor and the difference. Returns
        the model's parameters and buffers in the captured order, and keeps the checks' C++ twin."""
        for check, value in zip(self.tensor_checks, tensors):
            problem = check.problem(value)
            if problem is not None:
                self.fail(f"input {check.path}: {problem}", "pass an input like the captured one, or capture again with this one")
        params, buffers = collect_params_and_buffers(modules)
        state = params + buffers
        names = [name for name, _ in state]
        if names != self.expected_names:
            missing = [n for n in self.expected_names if n not in names]
            extra = [n for n in names if n not in self.expected_names]
            self.fail(f"the model's parameters and buffers {names} differ from the captured {self.expected_names} (missing {missing}, unexpected {extra})",
                      "pass a model with the captured structure")
        for check, (_, tensor) in zip(self.state_checks, state):
            problem = check.problem(tensor)
            if problem is not None:
                self.fail(f"model tensor {check.path}: {problem}", "pass a model with the captured structure")
        state_tensors = [t for _, t in state]
        flat_tensors = [*state_tensors, *tensors]
        # The C++ check of exactly these tensors' metadata, with the dims that may vary left free.
        strides = [list(t.stride()) if c.stride is not None else [None] * t.dim()
                   for c, t in zip((*self.state_checks, *self.tensor_checks), flat_tensors)]
        # torch's stub types each of these as one tensor's dims; TensorGuards takes a list per tensor.
        guards = _TensorGuards(*flat_tensors, dynamic_dims_sizes=self.dynamic_sizes,  # type: ignore[arg-type]
                               dynamic_dims_strides=strides)  # type: ignore[arg-type]
        self.trusted = (_StatePlan(modules), guards)
        return state_tensors

    def check_unbacked(self, tensors):
        sizes: dict = {}
        for index, dim, spec, path in self.unbacked:
            size = tensors[index].shape[dim]
            low, high = spec.get("min"), spec.get("max")
            if (low is not None and size < low) or (high is not None and size > high):
                self.fail(f"input {path} has size {size} in dim {dim}, outside the mark_unbacked bounds [{low}, {high}]",
                          "pass a size within the bounds it was captured with")
            other = sizes.setdefault(spec["symbol"], (size, path, dim))
            if other[0] != size:
                self.fail(f"input {path} has size {size} in dim {dim} but {other[1]} has {other[0]} in dim {other[2]}; "
                          f"they were marked with shape_id {spec.get('shape_id')!r}, so the artifact assumes they are equal",
                          "pass inputs whose marked dims agree")

    def run(self, state_tensors, tensors):
        """Run the graph, scatter the parameter gradients it computed as eager .backward() would, and
        rebuild fn's result."""
        with torch.no_grad():
            flat = self.run_graph(*state_tensors, *tensors)
            n_results = len(flat) - len(self.grad_indices)
            for index, grad in zip(self.grad_indices, flat[n_results:]):
                param = state_tensors[index]
                if param.grad is None:
                    param.grad = grad
                else:
                    param.grad += grad
        results = iter(flat[:n_results])
        out_leaves = [next(results) if leaf is None else leaf["value"] for leaf in self.outputs]
        return _pytree.tree_unflatten(out_leaves, self.out_spec)
