"""Triton inside the capture block, priming at load, and no_compilation()'s reach into Triton.

Triton compiles for a CUDA target on a CPU; tests/triton_cases.py stands in for the driver so
Triton's own launch path (JITFunction.run, Autotuner.run) runs to its end without a GPU. These
run wherever triton is installed (torch's CUDA builds ship it); the `cuda` ones need a GPU.
"""
from __future__ import annotations

import collections
import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed"),
]

import torch  # noqa: E402

import precompile  # noqa: E402
from conftest import run_fresh  # noqa: E402
from precompile.capturing import kernels as freezing  # noqa: E402
from precompile.serve import kernels as priming  # noqa: E402
from precompile.serve import no_compilation as policy  # noqa: E402
from precompile.serve import triton_cache  # noqa: E402


@pytest.fixture
def tc(monkeypatch, tmp_path):
    """tests/triton_cases.py on the stand-in driver, with a user TRITON_CACHE_DIR and fresh caches."""
    import triton_cases

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "user-triton"))
    monkeypatch.delenv("TRITON_CACHE_AUTOTUNING", raising=False)
    from triton.runtime.driver import driver

    monkeypatch.setattr(driver, "_active", triton_cases.CpuOnlyCudaDriver())
    for fn in (triton_cases.add_one, triton_cases.add_two.fn):
        fn.device_caches.clear()
    triton_cases.add_two.cache.clear()
    triton_cases.add_two.cache_results = False
    triton_cases.BENCHMARKS.clear()
    triton_cases.TIMINGS.update({16: 1.0, 32: 2.0})
    return triton_cases


def _kernels(fn) -> dict:
    return {key: kernel for entry in fn.device_caches.values() for key, kernel in entry[0].items()}


def _best_block(autotuner, n: int) -> int:
    return autotuner.cache[(n, "torch.float32")].kwargs["BLOCK"]


def test_the_block_compiles_and_tunes_again_in_its_own_dir_and_keeps_earlier_decisions_after(tc, tmp_path):
    x8, x4 = torch.zeros(8), torch.zeros(4)
    tc.launch_add_one(x8)
    tc.launch_add_two(x8)
    tc.launch_add_two(x4)  # a decision the block will not take again
    assert tc.BENCHMARKS == [16, 32, 16, 32] and _best_block(tc.add_two, 8) == 16
    before = _kernels(tc.add_one)
    user_files = sorted(p.name for p in (tmp_path / "user-triton").rglob("*"))

    block = tmp_path / "block"
    tc.TIMINGS.update({16: 3.0, 32: 1.0})  # the block's real inputs favour the other config
    with triton_cache.triton_block(block):
        assert os.environ["TRITON_CACHE_DIR"] == str(block) and os.environ["TRITON_CACHE_AUTOTUNING"] == "1"
        assert _kernels(tc.add_one) == {} and tc.add_two.cache == {}  # set aside
        tc.launch_add_one(x8)
        tc.launch_add_two(x8)
        assert tc.BENCHMARKS[4:] == [16, 32] and _best_block(tc.add_two, 8) == 32  # tuned again
        assert triton_cache.unfrozen(block) == []
        inside = _kernels(tc.add_one)

    names = collections.Counter(p.name for p in block.rglob("*") if p.is_file())
    assert names["__grp__add_one.json"] == 1 and names["add_two.autotune.json"] == 1
    assert sorted(p.name for p in (tmp_path / "user-triton").rglob("*")) == user_files  # not used inside
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "user-triton")
    assert "TRITON_CACHE_AUTOTUNING" not in os.environ and tc.add_two.cache_results is False
    # Afterwards: the block's compiles and decisions over the earlier ones, the others kept.
    assert _kernels(tc.add_one) == inside and inside.keys() == before.keys()
    assert _best_block(tc.add_two, 8) == 32 and _best_block(tc.add_two, 4) == 16


def test_a_write_names_the_triton_kernel_it_cannot_freeze(tc, tmp_path):
    import triton

    with triton_cache.triton_block(tmp_path / "capture" / "triton" / "0"):
        triton.knobs.cache.dir = str(tmp_path / "elsewhere")  # the program sends Triton elsewhere mid-block
        try:
            tc.launch_add_one(torch.zeros(8))
        finally:
            del triton.knobs.cache.dir
        with pytest.raises(precompile.PrecompileError, match=r"could not freeze the Triton kernels .*triton_cases\.add_one"):
            freezing.collect_files(tmp_path / "capture")


def _cpu_double(x):
    return x * 2


def test_a_capture_is_not_refused_for_triton_kernels_compiled_before_its_block(tc, tmp_path):
    # Found by the first GPU check: kernels the process compiled before the block (here into the
    # user's TRITON_CACHE_DIR) were named as "outside the block's dir" once the block had put them back.
    tc.launch_add_one(torch.zeros(8))
    with precompile.capture(_cpu_double, artifact_path=tmp_path / "m.py", cache_path=tmp_path / "m.cache",
                            tracer=precompile.MakeFxTracer(), backend="inductor") as cap:
        cap(torch.ones(4))
    assert (tmp_path / "m.cache").is_file()
    assert _kernels(tc.add_one)  # the earlier kernel is still there for the program


def test_a_block_and_a_serving_process_key_kernels_by_the_ptxas_inductor_picks(tc, monkeypatch, tmp_path):
    # Found by the first GPU check: Triton keys each kernel by its ptxas's version, read once per process.
    # A process that compiled a kernel before Inductor pointed TRITON_PTXAS_PATH at torch's ptxas keyed
    # the block's kernels by Triton's bundled one; the serving process, where Inductor sets it first,
    # missed every one of them.
    import functools

    from triton.backends.nvidia import compiler as nvidia

    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    monkeypatch.setattr(nvidia, "get_ptxas_version", functools.lru_cache()(lambda arch=80: nvidia.get_ptxas(arch).path))
    nvidia.get_ptxas_version()  # a kernel compiled before the block: Triton's own ptxas, remembered
    with triton_cache.triton_block(tmp_path / "block"):
        in_block = nvidia.get_ptxas_version()
    chosen = nvidia.get_ptxas(80).path  # Inductor's (torch's own ptxas, left set for the process), else Triton's
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    nvidia.get_ptxas_version.cache_clear()
    nvidia.get_ptxas_version()  # a serving program that launched a kernel of its own before load
    triton_cache.serve_from(tmp_path / "primed")
    assert in_block == chosen == nvidia.get_ptxas_version()


def test_a_serving_process_judges_the_bundle_by_the_ptxas_inductor_picks(tc, monkeypatch, tmp_path):
    # Found by the second GPU check: the serving process read its Triton key (Triton's build and
    # backend, the ptxas version among it) before anything had picked torch's ptxas, judged the bundle
    # built for another assembler, dropped its kernels and compiled them under no_compilation().
    import functools

    from torch.utils import _triton as torch_triton
    from triton.backends.nvidia import compiler as nvidia

    monkeypatch.setenv("TRITON_PTXAS_PATH", "")
    monkeypatch.delenv("TRITON_PTXAS_PATH")  # unset now, and unset again after the test
    monkeypatch.setattr(nvidia, "get_ptxas_version", functools.lru_cache()(lambda arch=80: nvidia.get_ptxas(arch).path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *device: (9, 0))
    memos = (torch_triton.triton_backend, torch_triton.triton_hash_with_backend)
    try:
        with triton_cache.triton_block(tmp_path / "block"):
            captured = priming.gpu_keys()["triton_key"]
            in_block = nvidia.get_ptxas_version()
        # A fresh serving process that compiled a kernel of its own before load and had torch read
        # its Triton key (Inductor does, for its own caches): both remember Triton's bundled ptxas.
        monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
        nvidia.get_ptxas_version.cache_clear()
        for memo in memos:
            memo.cache_clear()
        before_load = nvidia.get_ptxas_version()
        assert torch_triton.triton_hash_with_backend() != captured or before_load == in_block
        assert priming.gpu_keys()["triton_key"] == captured != "no GPU backend"
    finally:
        for memo in memos:
            memo.cache_clear()  # nothing computed on the stand-in driver outlives the test
    # Meaningful where torch ships a ptxas of its own (its CUDA builds): Triton's bundled one differs.
    assert (before_load != in_block) == (Path(torch.__file__).parent / "bin" / "ptxas").is_file()


def test_triton_stays_pointed_at_the_primed_kernels_after_load_returns(monkeypatch, tmp_path):
    # Found by a hostile review: the knobs were never set (Triton's descriptors cannot be read from
    # their class, so the hasattr test was always false), so only TRITON_CACHE_DIR pointed Triton at
    # the primed kernels, and load puts it back when it returns: a kernel first launched after load
    # (a user's JIT kernel, an autotuner) looked in ~/.triton/cache.
    import triton

    from precompile.serve import environment

    monkeypatch.setitem(vars(triton.knobs.cache), "dir", None)
    monkeypatch.setitem(vars(triton.knobs.autotuning), "cache", False)
    for name in ("TRITON_CACHE_DIR", "TRITON_CACHE_AUTOTUNING", "TRITON_PTXAS_PATH"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)  # unset now, and unset again after the test
    with environment.restored():
        triton_cache.serve_from(tmp_path / "primed")
    assert "TRITON_CACHE_DIR" not in os.environ
    assert triton.knobs.cache.dir == str(tmp_path / "primed") and triton.knobs.autotuning.cache is True


PRIMED_SERVE = r"""
import json, os, sys
import msgspec
import precompile, triton_cases as tc
from precompile.serve import kernel_root, kernels as priming
from precompile.artifact.codec import decode_payload
from precompile.artifact.envelope import KernelBundle
import torch

if not os.environ.get("TRITON_CACHE_DIR"):
    del os.environ["TRITON_CACHE_DIR"]  # the test's own is not this process's
bundle = msgspec.json.decode(open(sys.argv[1], "rb").read(), type=KernelBundle)
payload = open(sys.argv[2], "rb").read()
tc.use_cpu_only_driver()
mode = sys.argv[3]
if mode == "primed":
    priming.prime(bundle, decode_payload(bundle, payload, 0), kernel_root.inductor_cache_dir())
outcome = "served"
try:
    with precompile.no_compilation():
        tc.launch_add_one(torch.zeros(8))
        tc.launch_add_two(torch.zeros(8))
except precompile.PrecompileError as exc:
    outcome = str(exc)
print(json.dumps({"outcome": outcome, "benchmarks": tc.BENCHMARKS, "best": tc.add_two.cache[(8, "torch.float32")].kwargs["BLOCK"] if tc.add_two.cache else None,
                  "triton_dir": os.environ.get("TRITON_CACHE_DIR")}))
"""


@pytest.mark.parametrize("mode", ["primed", "bare"])
def test_a_primed_process_launches_the_captured_kernels_without_compiling_or_tuning(tc, tmp_path, mode):
    from precompile.artifact.codec import build_bundle

    capture_dir = tmp_path / "capture"
    tc.TIMINGS.update({16: 3.0, 32: 1.0})
    with triton_cache.triton_block(capture_dir / "triton" / "0"):
        tc.launch_add_one(torch.zeros(8))
        tc.launch_add_two(torch.zeros(8))
        files = freezing.collect_files(capture_dir)
    assert {kind for kind, _ in files.values()} == {"triton"}
    # Found by the second GPU check: Triton's group files named the kernels' files by their paths in
    # the capture's dir, gone once it returns (here, as there). They ship as <key>/<file>.
    groups = {path: json.loads(data) for path, (_, data) in files.items() if "/__grp__" in path}
    assert groups and all(
        child == "/".join(path.split("/")[2:3] + [name]) for path, group in groups.items()
        for name, child in group["child_paths"].items()
    )
    shutil.rmtree(capture_dir)
    bundle, payload = build_bundle(files, {})
    import msgspec

    (tmp_path / "bundle.json").write_bytes(msgspec.json.encode(bundle))
    (tmp_path / "payload").write_bytes(payload)
    env = {"HOME": str(tmp_path / "home"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "serve"), "TRITON_CACHE_DIR": ""}
    proc = run_fresh(PRIMED_SERVE, str(tmp_path / "bundle.json"), str(tmp_path / "payload"), mode, env=env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if mode == "primed":
        # The block's decision ships (BLOCK=32), read from Triton's autotuning cache: no benchmark, no compile.
        assert result == {"outcome": "served", "benchmarks": [], "best": 32, "triton_dir": str(tmp_path / "serve" / "triton" / "0")}
    else:
        assert "no_compilation() is active and a Triton" in result["outcome"] and result["benchmarks"] == []


# -- no_compilation() reaches Triton however it is called -------------------------------------------


def test_the_gate_stops_a_jit_compile_through_the_launch_path_but_lets_cache_hits_through(tc):
    x = torch.zeros(8)
    with precompile.no_compilation():
        with pytest.raises(policy.CompilationForbidden, match="a Triton kernel would be compiled"):
            tc.launch_add_one(x)  # JITFunction.run -> its bound compile -> the IR build
    tc.launch_add_one(x)  # compiles into the file cache
    tc.add_one.device_caches.clear()
    with precompile.no_compilation():
        tc.launch_add_one(x)  # compile() again, but a file-cache hit: nothing is built


def test_the_gate_stops_a_compile_called_through_a_name_bound_by_from_import(tc):
    from triton.compiler import ASTSource
    from triton.compiler import compile as bound_compile

    source = ASTSource(tc.add_one, {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {(2,): 32})
    with precompile.no_compilation():
        with pytest.raises(policy.CompilationForbidden, match="a Triton kernel would be compiled"):
            bound_compile(source)


def test_the_gate_stops_the_autotuners_benchmark_through_its_run(tc):
    import triton

    from triton_cases import add_one

    tuned = triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"])(add_one)
    tc.launch_add_one(torch.zeros(8))  # both specializations exist: only the benchmark is left to refuse
    add_one[(1,)](torch.zeros(8), 8, BLOCK=32)
    with precompile.no_compilation():
        with pytest.raises(policy.CompilationForbidden, match="a Triton autotuner would benchmark"):
            tuned[(1,)](torch.zeros(8), 8)


BOUND_BENCHMARKER = r"""
import sys, types
import triton.testing
from triton.testing import do_bench
holder = types.ModuleType("holder")
holder.do_bench = do_bench
sys.modules["holder"] = holder
import precompile
with precompile.no_compilation():
    for call in (do_bench, holder.do_bench, triton.testing.do_bench):
        try:
            call(lambda: None)
            print("ran")
        except precompile.PrecompileError:
            print("refused")
"""


def test_the_gate_reaches_a_benchmarker_bound_by_name_before_it_was_installed():
    proc = run_fresh(BOUND_BENCHMARKER)
    assert proc.returncode == 0, proc.stderr
    # Every module-level name bound to it before the gate went in (here in __main__ and `holder`) is rebound.
    assert proc.stdout.split() == ["refused", "refused", "refused"]


# -- on a GPU ---------------------------------------------------------------------------------------

CUDA_SERVE = r"""
import sys, torch, precompile
dtype = getattr(torch, sys.argv[3])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()).cuda().to(dtype)
x = torch.randn(8, 32, device="cuda", dtype=dtype)
with torch.no_grad(), precompile.no_compilation():
    served = precompile.load(sys.argv[1], sys.argv[2])(model, x)
    torch.testing.assert_close(served, model(x))
print("ok")
"""


def relu_mlp(model, x):
    return model(x)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu_check.sh runs this)")
@pytest.mark.parametrize(
    ("tracer", "dtype"), [("makefx", "float32"), ("dynamo", "float32"), ("dynamo", "bfloat16")]
)
def test_a_cuda_inductor_capture_serves_in_a_fresh_process_under_no_compilation(tmp_path, tracer, dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()).cuda().to(getattr(torch, dtype))
    x = torch.randn(8, 32, device="cuda", dtype=getattr(torch, dtype))
    artifact, cache = tmp_path / "m.py", tmp_path / "m.cache"
    chosen = precompile.MakeFxTracer() if tracer == "makefx" else precompile.DynamoTracer()
    with torch.no_grad(), precompile.capture(
        relu_mlp, artifact_path=artifact, cache_path=cache, tracer=chosen, backend="inductor"
    ) as cap:
        cap(model, x)
    proc = run_fresh(
        CUDA_SERVE, str(artifact), str(cache), dtype, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "serve")}
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("ok")


CUDA_MISALIGNED = r"""
import sys, torch, precompile

def misaligned(values):  # a view 4 bytes past a 16-byte boundary, as a slice of a bigger buffer is
    view = torch.empty(values.numel() + 4, device="cuda")[1:1 + values.numel()]
    assert view.data_ptr() % 16 == 4
    return view.copy_(values)

base, x = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
cache, eager_cache = misaligned(base), base.clone()
with torch.no_grad(), precompile.no_compilation():
    served = precompile.load(sys.argv[1], sys.argv[2])(cache, misaligned(x))
    eager = (eager_cache.add_(x) * 2, x.sin())  # update_cache, run eagerly
torch.cuda.synchronize()
torch.testing.assert_close(served, eager)
torch.testing.assert_close(cache, eager_cache)  # the write reached the caller's misaligned tensor
print("ok")
"""


def update_cache(cache, x):
    cache.add_(x)
    return cache * 2, x.sin()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu_check.sh runs this)")
@pytest.mark.parametrize("tracer", ["makefx", "dynamo"])
def test_a_cuda_capture_serves_misaligned_inputs_like_eager(tmp_path, tracer):
    """Captured on aligned tensors, Inductor's kernels take aligned pointers: python_code passes a
    misaligned input (a slice of a bigger buffer) as an aligned copy, and copies a write back."""
    artifact, cache = tmp_path / "m.py", tmp_path / "m.cache"
    chosen = precompile.MakeFxTracer() if tracer == "makefx" else precompile.DynamoTracer()
    with torch.no_grad(), precompile.capture(
        update_cache, artifact_path=artifact, cache_path=cache, tracer=chosen, backend="inductor"
    ) as cap:
        cap(torch.zeros(1024, device="cuda"), torch.ones(1024, device="cuda"))
    assert "realign=(" in artifact.read_text()
    proc = run_fresh(CUDA_MISALIGNED, str(artifact), str(cache), env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "serve")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("ok")
