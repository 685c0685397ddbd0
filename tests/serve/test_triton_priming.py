"""Where load puts a bundle's Triton files and where it points Triton: pure file logic, no triton needed."""
from __future__ import annotations

import os
import sys

import pytest

from precompile.serve import kernels
from precompile.artifact.codec import build_bundle, decode_payload

FILES = {
    "triton/0/ABC/__grp__k.json": ("triton", b"{}"),
    "triton/0/ABC/k.cubin": ("triton", b"\x7fELF"),
    "triton/0/DEF/k.autotune.json": ("triton", b'{"key": [8]}'),
}


@pytest.fixture
def clean_triton_env(monkeypatch):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_AUTOTUNING", raising=False)
    knobs = getattr(sys.modules.get("triton"), "knobs", None)
    if knobs is not None:  # priming points the imported Triton at its dir, autotuning cache on: undone after the test
        monkeypatch.setitem(vars(knobs.autotuning), "cache", False)
        monkeypatch.setitem(vars(knobs.cache), "dir", None)
    return monkeypatch


def _prime(cache_dir):
    bundle, payload = build_bundle(FILES, {})
    kernels.prime(bundle, decode_payload(bundle, payload, 0), cache_dir)


def test_without_a_triton_cache_dir_the_files_go_beside_inductors_and_triton_is_pointed_there(clean_triton_env, tmp_path):
    _prime(tmp_path / "inductor")
    primed = tmp_path / "inductor" / "triton" / "0"
    assert sorted(p.relative_to(primed).as_posix() for p in primed.rglob("*") if p.is_file()) == [
        "ABC/__grp__k.json", "ABC/k.cubin", "DEF/k.autotune.json"
    ]
    assert os.environ["TRITON_CACHE_DIR"] == str(primed)
    assert os.environ["TRITON_CACHE_AUTOTUNING"] == "1"


def test_a_triton_cache_dir_the_user_set_receives_the_files_and_stays(clean_triton_env, tmp_path):
    clean_triton_env.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    _prime(tmp_path / "inductor")
    assert (tmp_path / "mine" / "DEF" / "k.autotune.json").read_bytes() == b'{"key": [8]}'
    assert not (tmp_path / "inductor" / "triton").exists()
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine")


def test_a_bundle_without_triton_files_leaves_triton_alone(clean_triton_env, tmp_path):
    bundle, payload = build_bundle({"ab/k.best_config": ("autotune-result", b"{}")}, {})
    kernels.prime(bundle, decode_payload(bundle, payload, 0), tmp_path)
    assert "TRITON_CACHE_DIR" not in os.environ and "TRITON_CACHE_AUTOTUNING" not in os.environ
