"""What the MakeFx contract forbids is refused at capture, with a message that names the cause."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import precompile
from precompile import PrecompileError

GLOBAL_TENSOR = torch.ones(100)  # over 64 elements: small constants are rendered as literals (test_constants.py)


def reads_global(x):
    return x + GLOBAL_TENSOR


def makes_constant(x):
    return x + torch.tensor([float(i) for i in range(100)])


def calls_item(x):
    return x * x.sum().item()


def calls_nonzero(x):
    return x.nonzero()


def branches_on_data(x):
    return x + 1 if x.sum() > 0 else x - 1


def uses_cond(x):
    return torch.cond(x.sum() > 0, lambda y: y + 1, lambda y: y - 1, (x,))


def prints(x):
    torch.ops.aten._print("side effect")
    return x + 1


def returns_object(x):
    return object()


def updates_param(model, x):
    with torch.no_grad():
        model.weight.add_(1.0)
    return model(x)


def updates_param_data(model, x):
    model.weight.data.mul_(2.0)
    return model(x)


def grads_into_buffer(model, x):
    (model(x) * model.scale).sum().backward()
    return x


def grads_into_input(model, x):
    model(x).sum().backward()
    return x


def identity(x):
    return x


class Scaled(nn.Linear):
    def __init__(self):
        super().__init__(4, 4)
        self.register_buffer("scale", torch.ones(4, requires_grad=True))


def capture_once(tmp_path, fn, *args, grad=False):
    with torch.set_grad_enabled(grad), precompile.capture(
        fn, artifact_path=tmp_path / "m.py", cache_path=tmp_path / "m.cache", tracer=precompile.MakeFxTracer(), backend="eager"
    ) as cap:
        cap(*args)


CASES = [
    (reads_global, lambda: (torch.ones(100),), "the tensor global test_makefx_refusals.GLOBAL_TENSOR \\(shape \\(100,\\).*existed before the call"),
    (makes_constant, lambda: (torch.ones(100),), "baked into the artifact as a constant"),
    (calls_item, lambda: (torch.ones(4),), "calls aten._local_scalar_dense.default, whose result depends on tensor data"),
    (calls_nonzero, lambda: (torch.ones(4),), r"returns result, whose shape depends on tensor data"),
    (branches_on_data, lambda: (torch.ones(4),), "needs a tensor's value to decide a branch"),
    (uses_cond, lambda: (torch.ones(4),), "control-flow operator"),
    (prints, lambda: (torch.ones(4),), "effectful op aten._print.default"),
    (returns_object, lambda: (torch.ones(4),), "result is a object, which an artifact cannot serialize"),
    (updates_param, lambda: (nn.Linear(4, 4), torch.ones(2, 4)), "updates parameter 'weight' in place"),
    (updates_param_data, lambda: (nn.Linear(4, 4), torch.ones(2, 4)), "updates parameter 'weight' in place"),
    (identity, lambda: (torch.ones(4).to_sparse(),), "input args\\[0\\] is a torch.sparse_coo tensor"),
    (identity, lambda: (torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),), "input args\\[0\\] is a nested tensor"),
    (identity, lambda: ([torch.ones(1), {"k": object()}],), "input args\\[0\\]\\[1\\]\\['k'\\] is a object"),
]


@pytest.mark.parametrize(("fn", "args", "message"), CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_forbidden_captures_are_refused(tmp_path, fn, args, message):
    with pytest.raises(PrecompileError, match=message):
        capture_once(tmp_path, fn, *args())
    assert not (tmp_path / "m.py").exists()


def test_a_buffer_that_receives_a_gradient_is_refused(tmp_path):
    with pytest.raises(PrecompileError, match="registered buffer 'scale' received a gradient"):
        capture_once(tmp_path, grads_into_buffer, Scaled(), torch.ones(2, 4), grad=True)


def test_a_user_input_that_receives_a_gradient_is_refused(tmp_path):
    with pytest.raises(PrecompileError, match=r"user input args\[1\] received a gradient"):
        capture_once(tmp_path, grads_into_input, nn.Linear(4, 4), torch.ones(2, 4, requires_grad=True), grad=True)


def test_the_real_model_and_its_grads_are_untouched_by_a_refused_capture(tmp_path):
    model = nn.Linear(4, 4)
    weight = model.weight.detach().clone()
    with pytest.raises(PrecompileError):
        capture_once(tmp_path, updates_param, model, torch.ones(2, 4))
    assert torch.equal(model.weight, weight) and model.weight.grad is None


def test_a_tensors_data_used_as_a_size_is_refused_naming_the_line_and_the_remedy(tmp_path):
    """torch's GRU over a packed sequence reads its batch sizes as Python ints: a fake tensor has none."""
    import trace_failure_cases as cases

    model, x, lengths = cases.PackedGRU(), torch.randn(3, 5, 4), torch.tensor([5, 3, 2])
    with pytest.raises(precompile.CaptureRefused, match=r"uses a tensor's data as a Python value at .*rnn\.py:\d+ in forward "
                                                        r"\(TypeError: .*FakeTensor.*pad instead of packing.*DynamoTracer"):
        with torch.no_grad(), precompile.capture(cases.packed_step, artifact_path=tmp_path / "g.py", cache_path=tmp_path / "g.cache",
                                                 tracer=precompile.MakeFxTracer(), backend="eager") as cap:
            cap(model, x, lengths)
    assert not (tmp_path / "g.py").exists()


def scale(model, x):
    return model(x) * 2


def test_a_functools_partial_is_refused_up_front_with_the_reason(tmp_path):
    """As upstream's capture refuses one: the artifact is called with fn's own arguments, so what the
    partial binds (here a model, whose weights would be read as constants) is no call argument."""
    with pytest.raises(PrecompileError, match="takes the function itself, not a functools.partial.*pass them as call arguments"):
        precompile.capture(__import__("functools").partial(scale, nn.Linear(4, 4)), artifact_path=tmp_path / "m.py",
                           cache_path=tmp_path / "m.cache", tracer=precompile.MakeFxTracer(), backend="eager")


def test_a_tensor_subclass_input_is_refused_naming_it(tmp_path):
    """Upstream's MakeFx captures a traceable wrapper subclass (DTensor) through AOTAutograd; ours refuses
    one at capture (serve a plain tensor, or DynamoTracer where AOTAutograd unwraps it)."""
    from torch.testing._internal.two_tensor import TwoTensor

    with pytest.raises(PrecompileError, match=r"input args\[0\] is a tensor subclass \(TwoTensor\), which MakeFxTracer cannot capture"):
        capture_once(tmp_path, identity, TwoTensor(torch.ones(3), torch.ones(3)))
    assert not (tmp_path / "m.py").exists()
