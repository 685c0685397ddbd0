# Driver of a MakeFxTracer artifact (precompile/codegen/drivers/makefx.py, included verbatim).
# It checks a call against the captured calling convention, runs the captured graph on the
# runtime model's parameters and buffers (a compiled graph's tensor inputs copied into the captured
# memory layout where a call passes another), scatters parameter gradients like eager .backward(),
# and rebuilds fn's result. It also checks the Python values the trace read besides tensors
# (SPECIALIZED) as the read-checks section above (drivers/makefx_reads.py) says, and at load the
# code the trace ran (INLINED_SOURCES) as the driver-sources section (drivers/source_checks.py) does.
import gc as _gc
import importlib as _importlib
import sys as _sys
import warnings as _warnings
from operator import is_ as _is

import torch
import torch.utils._pytree as _pytree
from torch._C._dynamo.guards import TensorGuards as _TensorGuards

if "_ReadPlan" not in globals():  # imported as a module of its own; python_code has the sections above
    from precompile.codegen.drivers.makefx_reads import (
        _ABSENT,
        _GLOBAL_HOOKS,
        GLOBAL_STATE,
        MODULE_HOOKS,
        REQUIRES_GRAD,
        _Contents,
        _hook_ids,
        _may_change,
        _ReadPlan,
        module_hooks,
        specialized_source,
        spelled,
    )
    from precompile.codegen.drivers.source_checks import _check_sources

try:
    from precompile.errors import CallMismatch, PrecompileWarning
except ImportError:  # served where only torch is installed: twins of the same names

    class PrecompileError(RuntimeError):
        pass

    class CallMismatch(PrecompileError):
        pass

    class PrecompileWarning(UserWarning):
        pass


class _Specialized:
    """The Python values the trace read besides tensors, checked before each call. A full check
    finds where each lives and compares its spelling, naming what differs; until the model changes,
    later calls compare the values themselves with the ones the full check saw."""

    def __init__(self, records, module_slots):
        self.records = [r for r in records if r.get("checked", True) and r["name"] != REQUIRES_GRAD]
        self.module_slots = list(module_slots)
        self.state = [GLOBAL_STATE[r["name"]] for r in self.records if r["kind"] == "global_state" and r["name"] in GLOBAL_STATE]
        self.state_seen = None
        self.plan = None  # the _ReadPlan of the last full check
        self.seen: list = []  # the values it read
        self.contents = []  # (index into the values, the _Contents of one that may change in place)

    def unchanged(self):
        """Whether every checked value is still the very object the last full check saw (a list or
        dict, which may change in place: still spelled alike). A value set again, even to an equal
        one, takes the full check."""
        if self.plan is None or [get() for get in self.state] != self.state_seen:
            return False
        values = self.plan.values()
        return (values is not None and all(map(_is, values, self.seen)) and self.plan.still_absent()
                and all(contents.same(self.seen[i]) for i, contents in self.contents))

    def check(self, modules, fail):
        """Compare every checked value with its captured spelling; remember where they live."""
        places: list = []
        for record in self.records:
            where = specialized_source(record)
            if record["kind"] == "global_state" and record["name"] == MODULE_HOOKS:
                now = module_hooks(modules, self.module_slots)
                if now != record["value"]:
                    fail(f"the model's hooks are {now} but the artifact was captured with {record['value']} (the trace ran "
                         "those; a served call runs its graph, which calls no hook)",
                         "remove the hooks added since (handle.remove()) or register the captured ones, or capture again "
                         "with them (DynamoTracer guards on hooks)")
                continue
            if record["kind"] == "global_state":
                value = GLOBAL_STATE[record["name"]]()
            elif record["kind"] == "global":
                value = self.global_value(record, fail, places)
            else:
                owner = self.owner_of(record, modules, places)
                value = _ABSENT if owner is _ABSENT else getattr(owner, record["name"], _ABSENT)
                if owner is not _ABSENT:
                    places.append((owner, record["name"]))
            now = "missing" if value is _ABSENT else spelled(value) or f"a {type(value).__name__}"
            if now == record["value"]:
                continue
            if record["kind"] == "global_state":
                fail(f"{where} is {now} but the artifact was captured under {record['value']} (its graph is specialized "
                     "on it)", "serve it under the captured state (e.g. torch.no_grad() for grad_mode False), or capture again")
            fail(f"{where} is {now} but the artifact was captured with {record['value']} (the trace read it, so its "
                 "graph is specialized on that value)", "set it back, or capture again with this value")
        self.plan = _ReadPlan(places)
        self.seen = self.plan.values() or []
        self.contents = [(i, _Contents(value)) for i, value in enumerate(self.seen) if _may_change(value)]
        self.state_seen = [get() for get in self.state]

    def owner_of(self, record, modules, places):
        try:
            owner = modules[self.module_slots.index(record.get("keyword") or record["arg"])]
            if record.get("module"):
                owner = owner.get_submodule(record["module"])
        except (ValueError, AttributeError):
            return _ABSENT
        for name in record.get("chain", ()):
            found = getattr(owner, name, _ABSENT)
            if found is _ABSENT:
                return _ABSENT
            places.append((owner, name))  # the object itself is checked too: a new config is checked in full
            owner = found
        return owner

    def global_value(self, record, fail, places):
        """A module's global, a torch class's method (`LayerNorm.forward`), read on its class, or an
        attribute of a class or settings object a global holds (`CFG.sub.scale`)."""
        owner = self.module_of(record, fail)
        *heads, name = record["name"].split(".")
        for head in heads:
            places.append((owner, head))
            owner = getattr(owner, head, _ABSENT)
        places.append((owner, name))
        return getattr(owner, name, _ABSENT)

    @staticmethod
    def module_of(record, fail):
        name = record["module"]
        module = _sys.modules.get(name)
        if module is None:
            try:
                module = _importlib.import_module(name)
            except Exception as exc:  # any failure of the user's module to import
                fail(f"cannot check {specialized_source(record)} (captured {record['value']}): importing {name} failed "
                     f"({type(exc).__name__}: {exc})", "make that module importable where the artifact serves")
        return module


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
    changed (a submodule replaced, a tensor added, removed or untied, a hook registered or removed):
    the caller then re-validates.
    """

    def __init__(self, modules):
        self.modules = list(modules)
        self.owners = []  # (module, children ids, number of params, number of buffers)
        for module in self.modules:
            for _, owner in module.named_modules(remove_duplicate=False):
                self.owners.append((owner, tuple(map(id, owner._modules.values())),
                                    len(owner._parameters), len(owner._buffers), _hook_ids(owner)))
        self.global_hooks = [tuple(table) for _, table in _GLOBAL_HOOKS]
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
        for owner, children, n_params, n_buffers, hook_ids in self.owners:
            if (len(owner._parameters) != n_params or len(owner._buffers) != n_buffers
                    or tuple(map(id, owner._modules.values())) != children or _hook_ids(owner) != hook_ids):
                return None
        if [tuple(table) for _, table in _GLOBAL_HOOKS] != self.global_hooks:
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
    __slots__ = ("path", "shape", "dims", "dtype", "device", "stride", "relayout", "kept")

    def __init__(self, path, shape, dtype, device, stride=None, copyable=False, kept=""):
        self.path = path
        self.shape = tuple(shape)
        self.dims = None if None not in shape else tuple(i for i, d in enumerate(shape) if d is not None)
        self.dtype = _dtype(dtype)
        self.device = torch.device(device)
        # Strides matter only where a dim has more than one element and a fixed size.
        self.stride = None if stride is None else tuple(
            (i, s) for i, (s, d) in enumerate(zip(stride, shape)) if s is not None and d is not None and d > 1
        )
        # An input of another layout is copied into the captured strides (`relayout`) rather than refused,
        # unless a copy would change what the call does (`kept` says why) or a size or stride is free.
        self.kept = kept
        self.relayout = tuple(stride) if copyable and self.stride and not kept and self.dims is None and None not in stride else None

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
        if self.stride and self.relayout is None and self.other_layout(value):
            why = f" ({self.kept}, so it is not copied into that layout)" if self.kept else ""
            return (f"expected the captured memory layout (strides {_shape_text(tuple(s for _, s in self.stride))} "
                    f"on dims {[i for i, _ in self.stride]}), got strides {_shape_text(value.stride())}{why}")
        return None

    def other_layout(self, value):
        actual = value.stride()
        return actual != self.relayout and any(actual[i] != s for i, s in self.stride or ())

    def relaid(self, value):
        """`value` in the captured layout: itself, or a copy where its strides differ."""
        stride = self.relayout
        if stride is None or not self.other_layout(value):
            return value
        return torch.empty_strided(value.shape, stride, dtype=value.dtype, device=value.device).copy_(value)


def build_forward(metadata, run_graph, artifact="this artifact", autograd_graph=None, no_autograd=None):
    """The served `forward(*args)` of an artifact whose metadata literals are in `metadata`:
    `run_graph(*params, *buffers, *tensor_inputs)` runs the captured graph and returns its flat
    outputs: fn's tensor results, then the gradients of GRAD_PARAM_INDICES. `autograd_graph`, called
    alike, runs it as ATen ops autograd records, for a forward's calls that autograd would record
    (run_graph itself for the eager backend; None: such calls are refused). `no_autograd`: (why
    there is none, whether eager's result carries autograd in any grad mode, fn turning grad on).
    """
    return _ServedForward(metadata, run_graph, artifact, autograd_graph, no_autograd)


class _ServedForward:
    """One artifact's forward: checks a call against the calling convention, runs the graph, and
    rebuilds fn's result. The first call that passes every check (in Python, naming what differs)
    leaves a C++ check of exactly those tensors' metadata that later calls pass through instead."""

    def __init__(self, metadata, run_graph, artifact, autograd_graph=None, no_autograd=None):
        _check_sources(metadata, artifact, unfound_ok=True)  # the code the trace ran, which the graph baked in
        self.run_graph = run_graph
        self.autograd_graph = autograd_graph
        self.no_autograd = no_autograd or ("it keeps no ATen graph to record them", False)
        self.warned_autograd = False
        self.capturing = False  # set on the capture's own served forward
        self.requires_grad = next((r["value"] for r in metadata.get("SPECIALIZED", ())
                                   if r["kind"] == "global_state" and r["name"] == REQUIRES_GRAD), None)
        self.artifact = artifact
        self.num_args = metadata["NUM_POSITIONAL_ARGS"]
        self.module_positions = tuple(metadata["MODULE_POSITIONS"])
        self.module_keywords = tuple(metadata.get("MODULE_KEYWORDS", ()))
        self.expected_names = [p["name"] for p in metadata["PARAMS"]] + [b["name"] for b in metadata["BUFFERS"]]
        self.state_checks = [_TensorCheck(t["name"], t["shape"], t["dtype"], t["device"], t.get("stride"))
                             for t in (*metadata["PARAMS"], *metadata["BUFFERS"])]
        self.in_spec = _pytree.treespec_loads(metadata["IN_SPEC"])
        # The inputs are a dict of the positional args by position, then the keywords by name.
        self.keywords = tuple(key for key in self.in_spec.context if isinstance(key, str))
        self.keyword_set = frozenset((*self.keywords, *self.module_keywords))
        self.out_spec = _pytree.treespec_loads(metadata["OUT_SPEC"])
        # A tensor input's check, or (path, value) of a non-tensor input baked into the graph.
        self.input_checks = [
            _TensorCheck(leaf["path"], leaf["shape"], leaf["dtype"], leaf["device"], leaf.get("stride"), True, leaf.get("layout_kept", ""))
            if leaf["kind"] == "tensor" else (leaf["path"], leaf["value"])
            for leaf in metadata["INPUTS"]
        ]
        self.tensor_checks = [c for c in self.input_checks if isinstance(c, _TensorCheck)]
        # The inputs a compiled graph takes in its captured layout, copied into it where a call passes another.
        self.relayouts = [(i, c) for i, c in enumerate(self.tensor_checks) if c.relayout is not None]
        self.outputs = [leaf if leaf["kind"] == "constant" else None for leaf in metadata["OUTPUTS"]]
        self.grad_indices = tuple(metadata["GRAD_PARAM_INDICES"])
        # Dims marked with mark_unbacked: (tensor input index, dim, its spec, path), checked on every call
        # since a size is free there only within its bounds and equal to the dims sharing its symbol.
        self.unbacked = [(index, dim, spec, leaf["path"])
                         for index, leaf in enumerate(leaf for leaf in metadata["INPUTS"] if leaf["kind"] == "tensor")
                         for dim, spec in (leaf.get("unbacked") or {}).items()]
        self.dynamic_sizes = [list(c.shape) for c in (*self.state_checks, *self.tensor_checks)]
        self.specialized = _Specialized(metadata.get("SPECIALIZED", ()), (*self.module_positions, *self.module_keywords))
        self.trusted = None  # (the model's _StatePlan, the C++ guards) of the last call that passed every check

    def fail(self, message, remedy):
        raise CallMismatch(f"{self.artifact}: {message}; {remedy}")

    def __call__(self, *args, **kwargs):
        modules, tensors = self.arguments(args, kwargs)
        state_tensors = None
        if self.trusted is not None:
            plan, guards = self.trusted
            state_tensors = plan.gather(modules)
            if state_tensors is not None and not (guards.check(*state_tensors, *tensors) and self.specialized.unchanged()):
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
        if kwargs.keys() != self.keyword_set:
            captured = [*self.module_keywords, *self.keywords]
            missing = [name for name in captured if name not in kwargs]
            extra = [name for name in kwargs if name not in self.keyword_set]
            self.fail(f"got keyword arguments {list(kwargs)} but the artifact was captured with {captured} "
                      f"(missing {missing}, unexpected {extra})", "pass the captured call's keyword arguments, by name")
        if len(args) != self.num_args:
            self.fail(f"expected {self.num_args} positional arguments, got {len(args)}", "call it with the captured call's arguments")
        modules = []
        for position in self.module_positions:
            if not isinstance(args[position], torch.nn.Module):
                self.fail(f"argument {position} must be an nn.Module (the captured call passed one there), got {type(args[position]).__name__}",
                          "pass the model in the same position")
            modules.append(args[position])
        for name in self.module_keywords:
            if not isinstance(kwargs[name], torch.nn.Module):
                self.fail(f"keyword argument {name!r} must be an nn.Module (the captured call passed one there), got "
                          f"{type(kwargs[name]).__name__}", "pass the model by the same keyword")
            modules.append(kwargs[name])
        leaves, spec = _pytree.tree_flatten({**{i: a for i, a in enumerate(args) if i not in self.module_positions},
                                             **{name: kwargs[name] for name in self.keywords}})
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
        self.specialized.check(modules, self.fail)
        state_tensors = [t for _, t in state]
        if self.requires_grad is not None:
            now = spelled(tuple(t.requires_grad for t in (*state_tensors, *tensors)))
            if now != self.requires_grad:
                self.fail(f"the tensors' requires_grad are {now} (parameters, buffers, then inputs) but the artifact was "
                          f"captured with {self.requires_grad} (fn's code read requires_grad, so its graph is specialized "
                          "on it)", "set requires_grad back, or capture again with these")
        flat_tensors = [*state_tensors, *tensors]
        # The C++ check of exactly these tensors' metadata, with the dims that may vary left free.
        strides = [list(t.stride()) if c.stride is not None and c.relayout is None else [None] * t.dim()
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
        rebuild fn's result. A forward's call that autograd would record (grad mode on and a tensor it
        takes requiring grad) runs as ATen ops autograd records, so its results carry autograd as
        eager's do."""
        if not self.grad_indices and (torch.is_grad_enabled() or (self.no_autograd[1] and not torch.is_inference_mode_enabled())) and (
                any(t.requires_grad for t in tensors) or any(t.requires_grad for t in state_tensors)):
            graph = self.recording_autograd()
            if graph is not None:
                results = iter(graph(*state_tensors, *tensors))
                return _pytree.tree_unflatten([next(results) if leaf is None else leaf["value"] for leaf in self.outputs],
                                              self.out_spec)
        with torch.no_grad():
            for index, check in self.relayouts:  # `tensors` is this call's own list
                tensors[index] = check.relaid(tensors[index])
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

    def recording_autograd(self):
        """The graph that runs a call autograd records; the first such call of a compiled artifact says
        it runs at eager speed."""
        if self.autograd_graph is None and self.capturing:
            _warnings.warn(f"{self.artifact}: the capture's result carries no autograd, and a served call that autograd "
                           f"records will be refused: {self.no_autograd[0]}", PrecompileWarning, stacklevel=5)
            return None
        if self.autograd_graph is None:
            self.fail("this call would record autograd (a parameter, buffer or input requires grad, under grad mode or "
                      f"where fn turns it on), but the artifact cannot record it as eager does: {self.no_autograd[0]}",
                      "call it under torch.inference_mode() (or torch.no_grad(), where fn does not turn grad on), or turn "
                      "requires_grad off; for gradients through it, capture with DynamoTracer")
        if self.autograd_graph is not self.run_graph and not self.warned_autograd:
            self.warned_autograd = True
            _warnings.warn(
                f"{self.artifact}: this call records autograd (grad mode is on and a parameter or input requires grad), so "
                "it runs the captured ATen graph, whose results carry autograd as eager's do, at eager speed; call it "
                "under torch.inference_mode() or torch.no_grad() to run the compiled kernels",
                PrecompileWarning, stacklevel=4)
        return self.autograd_graph
