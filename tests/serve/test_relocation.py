"""Relocatable kernel bundles: a bundle is keyed on the torch build and the host's CPU/GPU, not on
where torch is installed. Served from a second virtualenv at another path holding the same torch
build, both tracers' Inductor kernels load from the bundle with nothing compiled; a different build
is refused with a warning naming both values.

The second venv costs a few seconds once per session: its site-packages are this venv's, hard-linked
(copied where hard links cannot reach), so torch lives at another path with the very same files.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import msgspec
import pytest
import torch

import dynamo_cases
import precompile
from cases import CASES
from conftest import ROOT, TESTS, run_fresh
from precompile.artifact import bundle_keys
from precompile.artifact import codec
from precompile.artifact.pair import parse_cache


@pytest.fixture(scope="session")
def relocation_pairs(tmp_path_factory):
    """One Inductor capture per tracer: MakeFx of a plain function, Dynamo of a graph-breaking fn."""
    directory = tmp_path_factory.mktemp("relocation")
    case = CASES["plain_function"]
    with precompile.capture(case.fn, artifact_path=directory / "makefx.py", cache_path=directory / "makefx.cache",
                            tracer=precompile.MakeFxTracer(), backend="inductor") as cap:
        cap(*case.args())
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    with torch.no_grad(), precompile.capture(dynamo_cases.break_and_scale, artifact_path=directory / "dynamo.py",
                                             cache_path=directory / "dynamo.cache", backend="inductor") as cap:
        cap(model, torch.ones(4, 8))
    return directory


@pytest.fixture(scope="session")
def second_venv(tmp_path_factory) -> Path:
    """The python of another virtualenv, at another path, holding this venv's torch build."""
    root = tmp_path_factory.mktemp("elsewhere") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    here = Path(sysconfig.get_paths()["purelib"])
    there = root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    linked = subprocess.run(["cp", "-al", f"{here}/.", str(there)], capture_output=True, timeout=300)
    if linked.returncode != 0:  # another filesystem: copy
        shutil.copytree(here, there, symlinks=True, dirs_exist_ok=True)
    return root / "bin" / "python"


SERVE_ELSEWHERE = r"""
import json, sys, warnings
import torch, precompile
import dynamo_cases
from cases import CASES
warnings.simplefilter("error", precompile.PrecompileWarning)  # the bundle must fit this venv as it is
directory = sys.argv[1]
report = {"torch": torch.__file__, "kernels": []}

def loaded_kernels():  # and forget them, so the next load finds its own: not one already imported
    for name, module in list(sys.modules.items()):
        if name.endswith(".kernel") and str(getattr(module, "__file__", "")).endswith(".so"):
            report["kernels"].append(module.__file__)
            del sys.modules[name]

with precompile.no_compilation():
    case = CASES["plain_function"]
    served = precompile.load(f"{directory}/makefx.py", f"{directory}/makefx.cache")(*case.args())
    eager = case.fn(*case.args())
    report["makefx"] = torch.allclose(served["sum"], eager["sum"])
    loaded_kernels()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    with torch.no_grad():
        for name in ("dynamo", "dynamo_old"):
            served = precompile.load(f"{directory}/{name}.py", f"{directory}/{name}.cache")(model, torch.ones(4, 8))
            report[name] = torch.allclose(served, dynamo_cases.break_and_scale(model, torch.ones(4, 8)), atol=1e-5)
            loaded_kernels()
print(json.dumps(report))
"""


def _serve(python: Path, directory: Path, cache_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]), "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
    return subprocess.run([str(python), "-c", SERVE_ELSEWHERE, str(directory)], capture_output=True, text=True,
                          env=env, timeout=300)


def test_a_second_venv_with_the_same_torch_build_serves_both_tracers_with_no_compile(relocation_pairs, second_venv, tmp_path):
    """Slow-ish: a second venv (hard links) and one fresh process. Inductor's own lookup would miss
    there (its kernel keys hash the -I paths of this venv's torch) and compile under no_compilation.
    `dynamo_old` is the Dynamo pair in the layout written before: paths among the keys, no kernels map."""
    parsed = parse_cache(relocation_pairs / "dynamo.cache", (relocation_pairs / "dynamo.cache").read_bytes())
    bundle = parsed.envelope.bundle
    old = msgspec.structs.replace(bundle, keys={**bundle.keys, **bundle.provenance}, provenance={}, kernels={})
    _write(relocation_pairs / "dynamo.py", parsed, old, tmp_path / "dynamo_old")
    for name in ("makefx", "dynamo"):
        for suffix in (".py", ".cache"):
            shutil.copy(relocation_pairs / f"{name}{suffix}", tmp_path / f"{name}{suffix}")
    proc = _serve(second_venv, tmp_path, tmp_path / "empty")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["torch"].startswith(str(second_venv.parent.parent))  # torch really is at the other path
    assert not report["torch"].startswith(os.path.dirname(torch.__file__))
    assert report["makefx"] is True and report["dynamo"] is True and report["dynamo_old"] is True
    # every kernel came from a frozen library primed out of a bundle, none from a compile
    assert len(report["kernels"]) >= 3 and all(path.startswith(str(tmp_path / "empty")) for path in report["kernels"])
    for name in ("makefx", "dynamo"):
        bundle = parse_cache(relocation_pairs / f"{name}.cache", (relocation_pairs / f"{name}.cache").read_bytes()).envelope.bundle
        assert "torch_dir" not in bundle.keys and bundle.provenance["torch_dir"] == os.path.dirname(torch.__file__)
        assert bundle.kernels, name  # both tracers serve through the map from kernel source to library


def _write(artifact: Path, parsed, bundle, prefix: Path) -> tuple[Path, Path]:
    """A copy of a pair (its cache parsed) at `prefix`, with another bundle index over the same payload."""
    shutil.copy(artifact, prefix.with_suffix(".py"))
    payload = parsed.data[parsed.payload_offset:]
    prefix.with_suffix(".cache").write_bytes(codec.encode_cache(msgspec.structs.replace(parsed.envelope, bundle=bundle), payload))
    return prefix.with_suffix(".py"), prefix.with_suffix(".cache")


def _rekeyed(pair: tuple[Path, Path], tmp_path: Path, name: str, **changes: str) -> tuple[Path, Path]:
    """A copy of the pair whose bundle records other requirements (a synthetic other build or GPU)."""
    parsed = parse_cache(pair[1], pair[1].read_bytes())
    bundle = msgspec.structs.replace(parsed.envelope.bundle, keys={**parsed.envelope.bundle.keys, **changes})
    return _write(pair[0], parsed, bundle, tmp_path / name)


OTHER_BUILD = r"""
import json, sys, warnings
import torch, precompile
report = {}
for artifact, cache in json.loads(sys.argv[1]):
    with warnings.catch_warnings(record=True) as caught, precompile.no_compilation():
        warnings.simplefilter("always")
        try:
            precompile.load(artifact, cache)
            report[artifact] = ["served", [str(w.message) for w in caught]]
        except precompile.PrecompileError as exc:
            report[artifact] = [str(exc), [str(w.message) for w in caught]]
print(json.dumps(report))
"""


def test_a_different_torch_build_is_still_refused_with_a_warning_naming_both_values(relocation_pairs, tmp_path):
    """Same version string, another git revision: the bundle does not fit, load says so and would
    compile (JIT), which no_compilation() stops; in a fresh process, for both tracers."""
    other = "0" * 40
    pairs = [_rekeyed((relocation_pairs / f"{name}.py", relocation_pairs / f"{name}.cache"), tmp_path, name, torch_git=other)
             for name in ("makefx", "dynamo")]
    proc = run_fresh(OTHER_BUILD, json.dumps([[str(a), str(c)] for a, c in pairs]),
                     env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "empty")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for artifact, _ in pairs:
        outcome, warned = report[str(artifact)]
        assert f"torch_git is '{torch.version.git_version}' here but '{other}' where it was captured" in " ".join(warned)
        assert "no_compilation() is active" in outcome  # the frozen kernels were not used


def test_old_bundles_keep_their_paths_as_provenance():
    """A v1 bundle written before `provenance` kept torch_dir and python_include among its keys."""
    keys = {"torch": "2.13.0+cpu", "python": "3.11", "machine": "x86_64", "torch_dir": "/old/venv/torch",
            "python_include": "/old/include", "compiler_command_sha256": "ab", "precompiled_headers": "off",
            "isa": "avx2", "valid_isas": "avx2", "cpu_flags": ""}
    host = {**bundle_keys.host_keys(), "torch": "2.13.0+cpu", "python": "3.11", "machine": "x86_64"}
    assert bundle_keys.mismatches(keys, host) == []
    assert set(bundle_keys.requirements(keys)) == {"torch", "python", "machine", "isa", "valid_isas", "cpu_flags"}
    assert bundle_keys.provenance(keys, {"compiler": "g++"}) == {
        "compiler": "g++", "compiler_command_sha256": "ab", "precompiled_headers": "off",
        "python_include": "/old/include", "torch_dir": "/old/venv/torch",
    }


def test_torch_free_host_keys_agree_with_the_imported_torch():
    """verify reads torch's build from version.py as text; load reads it from the module."""
    code = ("import json, sys; from precompile.artifact import bundle_keys; free = bundle_keys.host_keys();"
            "assert 'torch' not in sys.modules; import torch; print(json.dumps([free, bundle_keys.host_keys()]))")
    proc = run_fresh(code)
    assert proc.returncode == 0, proc.stderr
    free, imported = json.loads(proc.stdout)
    assert imported.pop("cxx11_abi") in ("0", "1")  # only the module can tell the ABI
    assert free == imported
    assert free["torch_git"] == torch.version.git_version and free["torch_cuda"] == (torch.version.cuda or "")


GPU = {"gpu_capability": "1.0", "triton": "3.5.1", "triton_key": "f" * 64, "triton_env": ""}


def test_gpu_keys_mismatch_names_both_values():
    here = {**bundle_keys.host_keys(), "gpu_capability": "8.0", "triton": "3.5.1", "triton_key": "e" * 64, "triton_env": ""}
    found = {m.key: str(m) for m in bundle_keys.mismatches({"torch": here["torch"], **GPU}, here)}
    assert found == {
        "gpu_capability": "gpu_capability is '8.0' here but '1.0' where it was captured",
        "triton_key": f"triton_key is '{'e' * 64}' here but '{'f' * 64}' where it was captured",
    }
    # a torch-free host cannot tell the GPU's capability or Triton's build hash
    assert bundle_keys.unchecked(GPU, bundle_keys.host_keys(gpu=True)) == ["gpu_capability", "triton_key", "triton_env"]


def _gpu_pair(captured, tmp_path: Path) -> tuple[Path, Path]:
    """A synthetic CUDA bundle: an eager pair's cache given a bundle that records GPU keys."""
    artifact, cache = tmp_path / "gpu.py", tmp_path / "gpu.cache"
    shutil.copy(captured["plain_function"][0], artifact)
    parsed = parse_cache(captured["plain_function"][1], captured["plain_function"][1].read_bytes())
    bundle, payload = codec.build_bundle({"triton/0/abc/k.cubin": ("triton", b"\0" * 16)},
                                         {**bundle_keys.host_keys(), "isa": "VecAVX2", "valid_isas": "VecAVX2", **GPU})
    cache.write_bytes(codec.encode_cache(msgspec.structs.replace(parsed.envelope, bundle=bundle), payload))
    return artifact, cache


def test_a_gpu_bundle_on_a_host_without_that_gpu_degrades_with_a_warning(captured, tmp_path):
    """Load checks the GPU keys before touching the payload, warns naming both values, and serves
    python_code (an eager pair's, which needs no kernel)."""
    artifact, cache = _gpu_pair(captured, tmp_path)
    here = "no CUDA device" if not torch.cuda.is_available() else "%d.%d" % torch.cuda.get_device_capability()
    with pytest.warns(precompile.PrecompileWarning, match=f"gpu_capability is '{here}' here but '1.0' where it was captured"):
        runnable = precompile.load(artifact, cache)
    case = CASES["plain_function"]
    with torch.set_grad_enabled(case.grad):
        assert torch.allclose(runnable(*case.args())["sum"], case.fn(*case.args())["sum"])


def test_verify_host_reports_a_gpu_bundles_keys_without_torch(captured, tmp_path):
    """In a fresh process that never imports torch: Triton's release is compared (from installed
    distributions); what needs torch or the GPU driver is a skip that says load checks it."""
    artifact, cache = _gpu_pair(captured, tmp_path)
    proc = run_fresh("import sys; from precompile.cli.main import main; rc = main(['verify', '-v', '--host', sys.argv[1]]);"
                     "print('torch imported:', 'torch' in sys.modules)", str(artifact.with_suffix("")))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "torch imported: False" in out and "verified: FAILED" in out  # this host has no Triton 3.5.1
    assert "FAIL  host kernels requirement triton: triton is '" + bundle_keys.triton_version() + "' here but '3.5.1' where it was captured" in out
    for key in ("gpu_capability", "triton_key", "cxx11_abi"):
        assert f"skip  host kernels requirement {key}: " in out and "cannot tell here without importing torch" in out
    assert "'1.0' where captured; cannot tell here without importing torch (a GPU's compute capability needs the CUDA driver" in out


CAPTURE_ELSEWHERE = r"""
import sys
import precompile
from cases import CASES
case = CASES["plain_function"]
with precompile.capture(case.fn, artifact_path=sys.argv[1] + "/makefx.py", cache_path=sys.argv[1] + "/makefx.cache",
                        tracer=precompile.MakeFxTracer(), backend="inductor") as cap:
    cap(*case.args())
"""


def test_the_same_capture_in_another_venv_of_one_torch_build_diffs_equal(relocation_pairs, second_venv, tmp_path, capsys):
    """A release gate: what differs between two venvs of one build (where torch lives, the compile
    command, the libraries' bytes, their hashed names) is provenance, which diff leaves out unless asked."""
    from precompile.cli.main import main

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([str(second_venv), "-c", CAPTURE_ELSEWHERE, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    here, there = str(relocation_pairs / "makefx"), str(tmp_path / "makefx")
    assert main(["diff", here, there]) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.splitlines()[-1] == "verdict: equal"
    assert main(["diff", "--provenance", here, there]) == 1  # asked for: where each was built differs
    assert "bundle.provenance.torch_dir" in capsys.readouterr().out
