"""Kernels land only where no one else writes (issue 38, finding 2). With TORCHINDUCTOR_CACHE_DIR
unset the root is `$TMPDIR/torchinductor_<user>`, a name another local user can take first: a
symlink to a directory they write, where they swap each library between its write and its dlopen.
The tests run as root, so "another user" is a symlink chowned to another uid, or a directory that
group and others may write. The pair is the eager mlp fixture (no kernel to compile) with a bundle
holding one library and its source, sealed as capture seals it."""
from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import msgspec
import pytest
from conftest import ROOT

import precompile
from precompile.artifact import bundle_keys, codec
from precompile.artifact.pair import parse_cache
from precompile.serve import kernel_root, kernels

FIXTURES = ROOT / "fixtures" / "v1"
LIBRARY, SOURCE = "ab/cabc.main.so", "ab/cabc.main.cpp"
OTHER_UID = 54321


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    import torch  # noqa: F401  (its build keys are among the host's)

    artifact, cache = tmp_path / "m.py", tmp_path / "m.cache"
    shutil.copy(FIXTURES / "mlp.py", artifact)
    envelope = parse_cache(cache, (FIXTURES / "mlp.cache").read_bytes()).envelope
    keys = {**bundle_keys.host_keys(), "isa": "VecAVX2", "valid_isas": "VecAVX2"}
    bundle, payload = codec.build_bundle({LIBRARY: ("kernel", b"\x7fELF library"), SOURCE: ("kernel-source", b"int k;")},
                                         keys, {"a" * 64: LIBRARY})
    cache.write_bytes(codec.encode_cache(msgspec.structs.replace(envelope, bundle=bundle), payload))
    return artifact, cache


@pytest.fixture(autouse=True)
def _torch_roots_put_back(monkeypatch):
    """Where a root breaks the rule, load points this process's Inductor at a private root for the
    rest of the process (torch's default root included): put back after each test here."""
    import sys

    import torch._inductor.runtime.cache_dir_utils  # noqa: F401  (what load points there)

    for name in ("torch._inductor.runtime.cache_dir_utils", "torch._inductor.runtime.runtime_utils",
                 "torch._inductor.codecache"):
        module = sys.modules.get(name)
        if module is not None:
            monkeypatch.setattr(module, "default_cache_dir", module.default_cache_dir)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)


@pytest.fixture
def default_root(tmp_path, monkeypatch):
    """The root load computes with TORCHINDUCTOR_CACHE_DIR unset, under this test's own TMPDIR (a
    root-owned sticky directory, as /tmp is)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr("tempfile.tempdir", None)
    root = kernel_root.inductor_cache_dir()
    assert root.parent == tmp
    return root


def _writable_by_all(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    return shared


def _load_warns(artifact: Path, cache: Path, match: str):
    with pytest.warns(precompile.PrecompileWarning, match=match):
        runnable = precompile.load(artifact, cache)
    assert runnable.cache_used
    return runnable


@pytest.mark.parametrize("owner", ["another user", "this user"])
def test_a_symlink_planted_at_the_root_to_a_directory_anyone_writes_is_not_followed(tmp_path, default_root, owner):
    artifact, cache = _pair(tmp_path)
    shared = _writable_by_all(tmp_path)
    default_root.symlink_to(shared)
    if owner == "another user":
        os.lchown(default_root, OTHER_UID, OTHER_UID)
        reason = rf"{default_root} is a symlink owned by uid {OTHER_UID}"
    else:
        reason = rf"{default_root} leads to {shared}: {shared} is writable by group and others \(mode 0777\)"
    _load_warns(artifact, cache, rf"not writing kernels into the kernel cache root {default_root}: {reason}.*private root")
    assert list(shared.iterdir()) == []


def test_a_root_group_or_others_may_write_is_not_written(tmp_path, default_root):
    artifact, cache = _pair(tmp_path)
    default_root.mkdir(mode=0o700)
    os.chmod(default_root, 0o770)
    _load_warns(artifact, cache, r"is writable by its group \(mode 0770\).*TORCHINDUCTOR_CACHE_DIR")
    assert list(default_root.iterdir()) == []


def test_a_root_another_user_owns_is_not_written(tmp_path, default_root):
    artifact, cache = _pair(tmp_path)
    default_root.mkdir(mode=0o700)
    os.chown(default_root, OTHER_UID, OTHER_UID)
    _load_warns(artifact, cache, rf"is owned by uid {OTHER_UID}, not by this user")
    assert list(default_root.iterdir()) == []


def test_a_directory_above_the_root_others_may_write_fails_the_rule(tmp_path, monkeypatch):
    shared = _writable_by_all(tmp_path)
    assert kernel_root.problem(shared / "inductor") == f"{shared} is writable by group and others (mode 0777)"
    os.chmod(shared, 0o1777)  # a sticky directory owned by root (as /tmp): allowed above the root, not as it
    assert kernel_root.problem(shared / "inductor") is None
    assert "is writable by group and others (mode 1777)" in kernel_root.problem(shared)


def test_a_root_of_this_user_only_is_used_and_created_private(tmp_path, default_root):
    artifact, cache = _pair(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", precompile.PrecompileWarning)
        precompile.load(artifact, cache)
    assert (default_root / LIBRARY).read_bytes() == b"\x7fELF library"
    assert default_root.stat().st_mode & 0o777 == 0o700
    assert (default_root / LIBRARY).stat().st_mode & 0o777 == 0o600


def test_a_library_replaced_after_its_write_is_not_mapped(tmp_path, default_root, monkeypatch):
    """What a swap between the write and the map leaves is read back through its own descriptor and
    compared with the bundle's sha256: a mismatch is refused (JIT), not loaded."""
    artifact, cache = _pair(tmp_path)
    real_replace = os.replace

    def replace_then_swap(source, target):
        real_replace(source, target)
        if str(target).endswith(".so"):
            Path(target).write_bytes(b"\x7fELF swapped")

    monkeypatch.setattr(kernels.os, "replace", replace_then_swap)
    runnable = _load_warns(artifact, cache, r"does not hold the bytes just written .*something else replaced it")
    assert runnable.cache_used


def test_a_library_already_in_place_as_a_symlink_is_replaced_not_followed(tmp_path, default_root):
    """A link inside the root to a file of the right bytes is not taken for the library: the library
    is written in its place (a link leading out of the root is refused as the bundle rules say)."""
    artifact, cache = _pair(tmp_path)
    (default_root / "ab").mkdir(parents=True, mode=0o700)
    os.chmod(default_root, 0o700)
    decoy = default_root / "decoy.so"
    decoy.write_bytes(b"\x7fELF library")
    (default_root / LIBRARY).symlink_to(decoy)
    with warnings.catch_warnings():
        warnings.simplefilter("error", precompile.PrecompileWarning)
        precompile.load(artifact, cache)
    assert not (default_root / LIBRARY).is_symlink() and (default_root / LIBRARY).read_bytes() == b"\x7fELF library"
