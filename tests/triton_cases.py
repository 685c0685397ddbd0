"""Triton kernels for CPU tests: a stand-in driver lets Triton compile for a CUDA target and run
its launch path with no GPU (the launch itself does nothing), so its caches, autotuner and compile
path can be exercised for real. Imported only where triton is installed."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver


class _NoLaunch:
    """Stands in for Triton's launcher: a launch changes nothing."""

    def __init__(self, src, metadata) -> None:
        self.launch_cooperative_grid = False
        self.launch_cluster = False
        self.launch_pdl = False

    def __call__(self, *args, **kwargs) -> None:
        return None


class CpuOnlyCudaDriver:
    """Just enough of Triton's driver for JIT compiles and launches to run their course on a CPU."""

    launcher_cls = _NoLaunch

    def __init__(self) -> None:
        self.utils = self

    def is_active(self) -> bool:
        return True

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 80, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_device_properties(self, device) -> dict:
        return {"max_shared_mem": 2**20, "multiprocessor_count": 1, "max_num_regs": 65536, "warpSize": 32}

    def load_binary(self, name, kernel, shared, device):
        return (None, None, 0, 0, 2**20)

    def get_benchmarker(self):
        from triton.testing import do_bench

        return do_bench


def use_cpu_only_driver() -> None:
    driver.set_active(CpuOnlyCudaDriver())


# The timings the autotuners' benchmarker reports, per config block size; tests set which wins.
TIMINGS = {16: 1.0, 32: 2.0}
BENCHMARKS: list[int] = []


def fake_bench(kernel_call, quantiles):
    kernel_call()
    block = fake_bench.current
    BENCHMARKS.append(block)
    return [TIMINGS[block]] * len(quantiles)


fake_bench.current = 0


def _config(block: int) -> triton.Config:
    return triton.Config({"BLOCK": block}, num_warps=1)


@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) + 1, mask=offsets < n)


def _record_block(nargs, reset_only=False):
    if not reset_only:
        fake_bench.current = nargs["BLOCK"]


@triton.autotune(configs=[_config(16), _config(32)], key=["n"], do_bench=fake_bench, pre_hook=_record_block)
@triton.jit
def add_two(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) + 2, mask=offsets < n)


def launch_add_one(x: torch.Tensor) -> None:
    add_one[(1,)](x, x.numel(), BLOCK=16)


def launch_add_two(x: torch.Tensor) -> None:
    add_two[(1,)](x, x.numel())
