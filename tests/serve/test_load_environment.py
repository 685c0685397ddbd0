"""load leaves the process environment as it found it (issue 38, finding 8): the variables it sets
for Triton and Inductor while it primes and runs python_code are put back once it returns, so a
child process the program starts later inherits the program's environment, not load's. Triton's
own settings (its cache dir, its autotuning cache) stay pointed at the primed kernels in-process.

The pair is the eager mlp fixture with a bundle holding a Triton file, recorded with this host's
requirements (no GPU here: "no CUDA device", as a capture on this host records them), so load
primes it and takes Triton's path, in a fresh process each time.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
from conftest import ROOT, run_fresh

from precompile.artifact import bundle_keys, codec
from precompile.artifact.pair import parse_cache

FIXTURES = ROOT / "fixtures" / "v1"
TRITON_FILE = "triton/0/abc/k.cubin"

LOAD = r"""
import json, os, sys, warnings
warnings.simplefilter("ignore")
import torch
import precompile
before = dict(os.environ)
runnable = precompile.load(sys.argv[1], sys.argv[2])
after = dict(os.environ)
changed = sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
print(json.dumps({"changed": {name: [before.get(name), after.get(name)] for name in changed}, "cache_used": runnable.cache_used}))
"""


def _triton_pair(tmp_path: Path) -> tuple[Path, Path]:
    import torch  # noqa: F401  (the build keys need it)

    from precompile.serve.kernels import gpu_keys

    artifact, cache = tmp_path / "m.py", tmp_path / "m.cache"
    shutil.copy(FIXTURES / "mlp.py", artifact)
    envelope = parse_cache(cache, (FIXTURES / "mlp.cache").read_bytes()).envelope
    keys = {**bundle_keys.host_keys(), "isa": "VecAVX2", "valid_isas": "VecAVX2", **gpu_keys()}
    bundle, payload = codec.build_bundle({TRITON_FILE: ("triton", b"x" * 16)}, keys)
    cache.write_bytes(codec.encode_cache(msgspec.structs.replace(envelope, bundle=bundle), payload))
    return artifact, cache


def test_load_puts_back_every_environment_variable_it_set(tmp_path):
    artifact, cache = _triton_pair(tmp_path)
    inductor = tmp_path / "home" / "inductor"
    inductor.mkdir(parents=True, mode=0o700)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(inductor), "TRITON_CACHE_DIR": "", "TRITON_CACHE_AUTOTUNING": ""}
    proc = run_fresh(LOAD.replace('before = dict(os.environ)', 'for name in ("TRITON_CACHE_DIR", "TRITON_CACHE_AUTOTUNING"):\n'
                                  '    os.environ.pop(name)\nbefore = dict(os.environ)'), str(artifact), str(cache), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    written = sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("k.cubin"))
    assert result["cache_used"] and written, (result, written, proc.stderr[-2000:])  # Triton's path was taken
    assert result["changed"] == {}


def test_a_triton_cache_dir_the_program_set_is_kept_as_it_was(tmp_path):
    artifact, cache = _triton_pair(tmp_path)
    inductor, triton = tmp_path / "home" / "inductor", tmp_path / "home" / "triton"
    inductor.mkdir(parents=True, mode=0o700)
    triton.mkdir(mode=0o700)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(inductor), "TRITON_CACHE_DIR": str(triton), "TRITON_CACHE_AUTOTUNING": "0"}
    proc = run_fresh(LOAD, str(artifact), str(cache), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["changed"] == {}
    assert (triton / "abc" / "k.cubin").is_file()
