# Kernel loading of an Inductor artifact (precompile/codegen/drivers/inductor_runtime.py, included
# verbatim). The Inductor output code below asks for its C++ kernels through
# AsyncCompile.cpp_pybinding. When precompile.load primed this process from the cache's kernel
# bundle, it passes `__precompile_kernels__` (sha256 of a kernel's source -> its shared library)
# and each kernel loads straight from its library, without importing torch._inductor. Otherwise
# the request goes to Inductor's own AsyncCompile, which finds the kernel in its cache dir or
# compiles it (JIT). The few other Inductor helpers the output code names are imported on first
# use only.
import hashlib as _hashlib
import importlib.util as _importlib_util
import os as _os
import sys as _sys

import torch

try:
    from precompile.errors import CallMismatch, PrecompileError
except ImportError:  # served where only torch is installed: twins of the same names

    class PrecompileError(RuntimeError):
        pass

    class CallMismatch(PrecompileError):
        pass


_primed_kernels = globals().get("__precompile_kernels__", {})

# The private torch names this driver reaches on the served path, "module:attribute.path". They
# live in torch._C on every supported torch (2.11 to 2.15), so serving never imports
# torch._inductor; precompile's runtime/torch_compat.py holds the same table (a test checks it).
_TORCH_PRIVATE = {
    "assert_size_stride": "torch._C:_dynamo.guards.assert_size_stride",
    "inductor_tensor_data_ptr": "torch._C:_dynamo.guards._torchinductor_pyobject_tensor_data_ptr",
}


def _torch_private(name):
    module_name, _, path = _TORCH_PRIVATE[name].partition(":")
    value: object = _sys.modules[module_name]
    for part in path.split("."):
        value = getattr(value, part, None)
        if value is None:
            raise PrecompileError(
                f"torch {torch.__version__} has no {module_name}.{path}, which this artifact's kernel runtime needs; "
                "serve it with the torch it was captured with"
            )
    return value


def _load_kernel(path):
    """The `kernel` entry of a compiled C++ kernel library, loaded as Inductor itself loads it."""
    _os.environ["_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"] = str(_torch_private("inductor_tensor_data_ptr"))
    name = _os.path.basename(path).split(".")[0] + ".kernel"
    module = _sys.modules.get(name)
    if module is None:
        spec = _importlib_util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise PrecompileError(f"the kernel library {path} cannot be loaded as a Python extension module")
        module = _importlib_util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _sys.modules[name] = module
    return module.kernel


def _inductor_async_compile():
    import torch._inductor.config as inductor_config
    from torch._inductor.async_compile import AsyncCompile as InductorAsyncCompile

    # A kernel no bundle primed compiles here (JIT), without precompiled headers: a serving host
    # then never builds torch's 155 MB precompiled header (about 5 s) for the few kernels it compiles.
    inductor_config.cpp_cache_precompile_headers = False
    return InductorAsyncCompile()


class AsyncCompile:
    """Inductor's AsyncCompile, served from the primed kernel bundle when it has the kernel."""

    def __init__(self):
        self._inductor = None

    def _fallback(self):
        if self._inductor is None:
            self._inductor = _inductor_async_compile()
        return self._inductor

    def cpp_pybinding(self, argtypes, source_code):
        path = _primed_kernels.get(_hashlib.sha256(source_code.encode("utf-8")).hexdigest())
        if path is not None:
            return _load_kernel(path)
        return self._fallback().cpp_pybinding(argtypes, source_code)

    def wait(self, scope):
        if self._inductor is not None:
            self._inductor.wait(scope)

    def __getattr__(self, name):
        return getattr(self._fallback(), name)


class _ExternKernels:
    """Inductor's extern_kernels: ATen out= ops directly, anything else from Inductor on first use."""

    _ATEN = ("addmm", "baddbmm", "bmm", "convolution", "mm")

    def __getattr__(self, name):
        if name in self._ATEN:
            value = getattr(torch, name)
        else:
            from torch._inductor.select_algorithm import extern_kernels as inductor_extern_kernels

            value = getattr(inductor_extern_kernels, name)
        setattr(self, name, value)
        return value


extern_kernels = _ExternKernels()


def run_intermediate_hooks(*args, **kwargs):
    from torch._inductor.hooks import run_intermediate_hooks as inductor_hooks

    return inductor_hooks(*args, **kwargs)


def maybe_profile(*args, **kwargs):
    from torch._inductor.utils import maybe_profile as inductor_maybe_profile

    return inductor_maybe_profile(*args, **kwargs)


def align(nbytes):
    from torch._inductor.codegen.memory_planning import _align

    return _align(nbytes)


def assert_tensor_metadata(tensor, expected_size, expected_stride, expected_dtype, op_name=None):
    """Inductor's own check of a tensor's dtype, sizes and strides (its output code imports it from
    torch._inductor.runtime.runtime_utils since torch 2.14, whose package import costs a second)."""
    if tensor is None:
        return
    if tensor.dtype != expected_dtype:
        raise RuntimeError(
            f"expected dtype {expected_dtype} but got {tensor.dtype}" + (f"\nError in op: {op_name}" if op_name else "")
        )
    _torch_private("assert_size_stride")(tensor, expected_size, expected_stride, op_name)


# What Inductor's GPU kernels assume of an input it compiled as aligned: its data pointer is a
# multiple of this many bytes (Triton specializes the pointer's divisibility).
_ALIGNMENT = 16


def _aligned_copy(tensor):
    """A copy of `tensor` with the same sizes and strides over storage of its own (aligned, as a new
    allocation is): the part of its storage it spans, copied as it lies."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()) if size > 0)
    if tensor.numel() == 0:
        span = 0
    storage = torch.as_strided(tensor, (span,), (1,)).clone()
    return torch.as_strided(storage, tensor.shape, tensor.stride())


def _memory(tensor):
    """The bytes `tensor` spans, as [first, end) addresses (tensors of other storages never share one)."""
    if tensor.is_contiguous():
        start = tensor.data_ptr()
        return (start, start + tensor.nbytes)
    if tensor.numel() == 0:
        return (0, 0)
    low = high = 0
    for size, stride in zip(tensor.shape, tensor.stride()):
        reach = (size - 1) * stride
        low, high = (low + reach, high) if reach < 0 else (low, high + reach)
    size = tensor.element_size()
    return (tensor.data_ptr() + low * size, tensor.data_ptr() + (high + 1) * size)


def _overlap_with_written(flat, written):
    """(written, other): graph inputs that share memory where the module writes into the first, or None
    (views interleaved in one span, x[::2] and x[1::2], do not: see _share_a_byte).
    The module is functional inside (AOTAutograd's functionalization): it reads every input as it was
    before the call's writes, where eager's in-place op changes what the other input then reads."""
    spans = [_memory(tensor) if isinstance(tensor, torch.Tensor) else (0, 0) for tensor in flat]
    for index in written:
        low, high = spans[index]
        if low == high:
            continue  # an empty input spans nothing
        for other, (other_low, other_high) in enumerate(spans):
            if (other != index and other_low < high and low < other_high and other_low < other_high
                    and _share_a_byte(flat[index], flat[other], min(low, other_low), max(high, other_high))):
                return index, other
    return None


# The most bytes two overlapping spans may cover for _share_a_byte to tell them apart; beyond it they count as sharing.
_BYTE_CHECK_LIMIT = 1 << 24


def _share_a_byte(written, other, low, high):
    """Whether two tensors whose spans of memory overlap, within [low, high), have a byte in common:
    views interleaved in one span (x[::2] and x[1::2], two columns of a matrix) do not."""
    if high - low > _BYTE_CHECK_LIMIT or written.device != other.device:
        return True
    marks = torch.zeros(high - low, dtype=torch.uint8)

    def bytes_of(tensor):
        size = tensor.element_size()
        return marks.as_strided((*tensor.shape, size), (*(stride * size for stride in tensor.stride()), 1),
                                tensor.data_ptr() - low)

    try:
        bytes_of(written).fill_(1)  # refused where the written input repeats an element (eager refuses it too)
    except RuntimeError:
        return True
    return bool(bytes_of(other).any())


def run_inductor_call(call, flat, realign=(), write_back=(), written=()):
    """Run the Inductor module's call() on the flat graph inputs, with its layout asserts as CallMismatch.

    As AOTAutograd's runtime wrapper does: the module runs with grad off (an inference graph may take
    an input that requires grad, which its out= kernels refuse under grad mode; a training module's
    gradients come from the autograd.Function around it), and the inputs of `written` (those it writes
    into) have their version counters bumped after it, as eager's in-place ops bump them (autograd then
    refuses a backward that saved one of them before the write).
    `realign` are the inputs the kernels were compiled to take aligned (GPU tensors aligned at capture,
    whose check the output code does not make itself): one whose data pointer is not is passed as an
    aligned copy, as Inductor's own wrapper does, and those of `write_back` (the module writes into
    them) are copied back into the caller's tensor after the call.
    An input it writes into that is an inference tensor is refused outside inference mode, as eager's
    in-place op refuses it. An input it writes into that shares memory with another input is refused, as the module reads
    the other as it was before the write (the capture's inputs were apart: with aliased inputs the
    capture is refused, or, for Dynamo, the graph is not lowered).
    """
    if written and not torch.is_inference_mode_enabled() and any(
            isinstance(flat[index], torch.Tensor) and flat[index].is_inference() for index in written):
        raise CallMismatch(
            "Inplace update to inference tensor outside InferenceMode is not allowed (eager's in-place op refuses it "
            "too, and the compiled module writes into one of its inputs made under torch.inference_mode()); call it "
            "under torch.inference_mode(), or pass a clone() of the tensor"
        )
    if written and (shared := _overlap_with_written(flat, written)) is not None:
        raise CallMismatch(
            f"inputs {shared[0]} and {shared[1]} of the compiled graph share memory and it writes into input {shared[0]}, "
            "but the capture's were apart: its kernels would read the other as it was before the write, where eager "
            "reads the written values; pass a copy (.clone()) of one of them, or capture with backend='eager'"
        )
    inputs = list(flat)
    copied = []
    for index in realign:
        tensor = inputs[index]
        if tensor.data_ptr() % _ALIGNMENT:
            inputs[index] = _aligned_copy(tensor)
            if index in write_back:
                copied.append((tensor, inputs[index]))
    try:
        with torch.no_grad():
            outputs = call(inputs)
    except AssertionError as exc:
        text = str(exc)
        if "size" in text or "stride" in text or "dimensions" in text:
            raise CallMismatch(
                f"an input's shape or memory layout differs from the captured one ({text}); "
                "pass inputs laid out like the captured ones (e.g. .contiguous()), or capture again"
            ) from None
        raise
    for original, aligned in copied:
        original.copy_(aligned)
    if written:
        torch.autograd.graph.increment_version([flat[index] for index in written])
    return outputs
