"""No co-tenant's library is mapped when load compiles kernels (issue 52, finding 1).

Inductor's default root, `$TMPDIR/torchinductor_<user>`, is a name any local user can take first:
a co-tenant makes it (their own, or anyone's to write) and plants a library at each path a kernel
will have, which the pair itself tells (its bundle holds the very files Inductor would compile, at
the same paths). Inductor's JIT compile then finds the planted library in place and maps it. The
co-tenant here is uid 65534 (a forked child that drops to it); the planted library is a C file whose
constructor appends to a marker file, so any process that maps it, the ISA probes' included, is
counted. Each load runs in a fresh process with TMPDIR a root-owned sticky directory, as /tmp is.

The pair is the mlp_inductor fixture (MakeFx, inductor backend, CPU): its python_code alone compiles
its kernels (JIT, ~20 s); a signed copy whose bundle records another machine falls back to JIT too.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec
import pytest
from conftest import CO_TENANT, ROOT, as_co_tenant

from precompile.artifact import codec
from precompile.artifact.codec import decode_payload
from precompile.artifact.pair import parse_cache

FIXTURE = ROOT / "fixtures" / "v1" / "mlp_inductor"

CONSTRUCTOR = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (fd >= 0) { write(fd, "mapped\n", 7); close(fd); }
}
"""

LOAD = r"""
import json, os, sys, warnings
import precompile
artifact, cache, keys = sys.argv[1], sys.argv[2], sys.argv[3:]
result = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        precompile.load(artifact, cache, trusted_keys=keys or None)
        result["outcome"] = "served"
    except precompile.PrecompileError as exc:
        result["outcome"] = f"refused: {exc}"
result["warnings"] = [str(w.message) for w in caught]
result["env"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
if result["outcome"] == "served":  # where a compile after load would look kernels up and write them
    from torch._inductor import codecache
    from torch._inductor.runtime import cache_dir_utils, runtime_utils
    result["after"] = [cache_dir_utils.cache_dir(), runtime_utils.default_cache_dir(), codecache._HEADER_DIR]
print(json.dumps(result))
"""


@functools.cache
def _kernel_libraries() -> tuple[str, ...]:
    """The libraries (relative to the root) loading the fixture's python_code alone compiles on this
    host, learnt by a rehearsal as a co-tenant would (the paths are keyed by the compile command,
    which holds this CPU's flags), and the ones its bundle holds."""
    envelope = parse_cache(FIXTURE.with_suffix(".cache"), FIXTURE.with_suffix(".cache").read_bytes()).envelope
    bundled = [entry.path for entry in envelope.bundle.files if entry.path.endswith(".so")]
    with tempfile.TemporaryDirectory(prefix="precompile-rehearsal-") as rehearsal:
        root = Path(rehearsal) / "root"
        _load(FIXTURE.with_suffix(".py"), Path(rehearsal) / "missing.cache",
              {"TMPDIR": rehearsal, "TORCHINDUCTOR_CACHE_DIR": str(root)})
        compiled = [str(path.relative_to(root)) for path in root.rglob("*.so")]
    assert any(path.endswith(".main.so") for path in compiled), compiled
    return tuple(dict.fromkeys([*compiled, *bundled]))


@pytest.fixture(scope="module")
def planted_library():
    """A library whose constructor appends to the marker file, where the co-tenant can read it
    (outside pytest's directories, which only their owner may enter)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to build the planted library with")
    directory = Path(tempfile.mkdtemp(prefix="precompile-planted-"))
    os.chmod(directory, 0o755)
    marker, source, library = directory / "mapped.txt", directory / "planted.c", directory / "planted.so"
    source.write_text(CONSTRUCTOR)
    subprocess.run(["cc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(library), str(source)], check=True)
    os.chmod(library, 0o755)
    yield library, marker
    shutil.rmtree(directory, ignore_errors=True)




@pytest.fixture
def shared_tmp():
    """A TMPDIR as /tmp is (root-owned, sticky, anyone may create in it), outside pytest's private dirs."""
    directory = Path(tempfile.mkdtemp(prefix="precompile-cotenant-"))
    os.chmod(directory, 0o1777)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def _plant(root: Path, library: Path) -> None:
    """The co-tenant's libraries at every path the pair's kernels and ISA probes will have under `root`."""
    for relative in _kernel_libraries():
        target = root / relative
        target.parent.mkdir(mode=0o777, parents=True, exist_ok=True)
        shutil.copyfile(library, target)
        os.chmod(target, 0o755)


def _default_root(tmp: Path) -> Path:
    return tmp / "torchinductor_root"


def _take_root(tmp: Path, library: Path, how: str, private: Path) -> tuple[dict[str, str], Path]:
    """The co-tenant takes (or writes) the root load's Inductor would use; the environment to load in
    and the root set aside."""
    root = _default_root(tmp)
    env = {"TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": ""}
    if how == "world-writable, this user's":
        root.mkdir(mode=0o777)
        os.chmod(root, 0o777)
    if how == "default taken, TORCHINDUCTOR_CACHE_DIR private":
        env["TORCHINDUCTOR_CACHE_DIR"] = str(private)
    _kernel_libraries()  # rehearsed as this user, before the co-tenant's child forks
    as_co_tenant(lambda: (root.mkdir(mode=0o777, exist_ok=True), _plant(root, library)), "plant its libraries")
    return env, root


def _load(artifact: Path, cache: Path, env: dict[str, str], *keys: Path) -> dict:
    env = {**env}
    if not env["TORCHINDUCTOR_CACHE_DIR"]:
        env.pop("TORCHINDUCTOR_CACHE_DIR")
    full = {name: value for name, value in os.environ.items() if name not in ("TORCHINDUCTOR_CACHE_DIR", "TMPDIR")}
    proc = subprocess.run(
        [sys.executable, "-c", LOAD, str(artifact), str(cache), *map(str, keys)], capture_output=True, text=True,
        timeout=600, env={**full, "PYTHONPATH": str(ROOT), **env},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_python_code_alone_compiles_into_a_private_root_and_never_maps_the_co_tenants_libraries(
        planted_library, shared_tmp, tmp_path):
    library, marker = planted_library
    marker.unlink(missing_ok=True)
    env, root = _take_root(shared_tmp, library, "another user's", tmp_path / "unused")
    result = _load(FIXTURE.with_suffix(".py"), tmp_path / "missing.cache", env)
    assert not marker.exists(), "a library the co-tenant planted was mapped"
    assert result["outcome"] == "served", result
    set_aside = [text for text in result["warnings"] if "not writing kernels into the kernel cache root" in text]
    assert set_aside and f"{root}: {root} is owned by uid {CO_TENANT}" in set_aside[0]
    private = Path(result["env"])
    assert private != root and private.stat().st_mode & 0o777 == 0o700
    kernel = next(path for path in _kernel_libraries() if path.endswith(".main.so"))
    assert (private / kernel).is_file(), "the kernel compiled elsewhere than where the co-tenant planted it"
    assert result["after"] == [str(private), str(private), str(private / "precompiled_headers")]


def _signed(directory: Path, **keys_changed: str) -> tuple[Path, Path, Path]:
    """The fixture sealed as capture seals it now (the requirements it predates recorded as this
    host's; `keys_changed` changed: `machine` set to another makes load fall back to JIT), signed;
    and the key to trust."""
    import torch  # noqa: F401  (its build keys are among the host's)

    from precompile.artifact.bundle_keys import host_keys
    from precompile.signing import generate, sign_pair

    artifact, cache = directory / "model.py", directory / "model.cache"
    shutil.copy(FIXTURE.with_suffix(".py"), artifact)
    parsed = parse_cache(cache, FIXTURE.with_suffix(".cache").read_bytes())
    bundle = parsed.envelope.bundle
    files = decode_payload(bundle, parsed.data, parsed.payload_offset)
    kinds = {entry.path: entry.kind for entry in bundle.files}
    host = host_keys()
    # This host's CPU flags, not the capturing CPU's (an AMD one, whose clzero an Intel host lacks)
    flags = {"cpu_flags": host["cpu_flags"]} if "cpu_flags" in host else {}
    rebuilt, payload = codec.build_bundle({path: (kinds[path], data) for path, data in files.items()},
                                          {**host, "valid_isas": "avx512", **bundle.keys, **flags, **keys_changed},
                                          dict(bundle.kernels))
    cache.write_bytes(codec.encode_cache(msgspec.structs.replace(parsed.envelope, bundle=rebuilt), payload))
    private_key, public_key, _ = generate(directory / "release")
    sign_pair(artifact, cache, private_key)
    return artifact, cache, public_key


@pytest.mark.parametrize("how", ["another user's", "world-writable, this user's",
                                 "default taken, TORCHINDUCTOR_CACHE_DIR private"])
def test_under_pins_a_pair_whose_bundle_does_not_fit_is_refused_rather_than_compiled(
        planted_library, shared_tmp, tmp_path, how):
    library, marker = planted_library
    marker.unlink(missing_ok=True)
    artifact, cache, public_key = _signed(tmp_path, machine="riscv64")
    env, root = _take_root(shared_tmp, library, how, tmp_path / "mine")
    result = _load(artifact, cache, env, public_key)
    assert not marker.exists(), "a library the co-tenant planted was mapped"
    assert result["outcome"].startswith(f"refused: python_code {artifact} would compile its kernels here"), result
    assert f"another user can write ({root}: {root} is " in result["outcome"]
    assert "TORCHINDUCTOR_CACHE_DIR" in result["outcome"]


def test_under_pins_a_bundle_that_fits_is_served_from_a_private_root_beside_a_taken_default(
        planted_library, shared_tmp, tmp_path):
    import torch

    if f"TORCH_VERSION = {torch.__version__!r}" not in FIXTURE.with_suffix(".py").read_text(encoding="utf-8"):
        pytest.skip(f"the fixture's kernels were built for another torch than {torch.__version__}: load compiles its own")
    library, marker = planted_library
    marker.unlink(missing_ok=True)
    artifact, cache, public_key = _signed(tmp_path)
    env, root = _take_root(shared_tmp, library, "another user's", tmp_path / "unused")
    result = _load(artifact, cache, env, public_key)
    assert not marker.exists(), "a library the co-tenant planted was mapped"
    assert result["outcome"] == "served", result
    private = result["env"]  # kept after load: compiles after it returns land in the private root too
    assert private is not None and Path(private) != root, result
    assert result["after"] == [private, private, str(Path(private) / "precompiled_headers")]

