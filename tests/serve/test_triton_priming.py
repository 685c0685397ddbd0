"""Where load puts a bundle's Triton files and where it points Triton: pure file logic, no triton needed."""
from __future__ import annotations

import json
import os
import sys

import pytest

from precompile.serve import kernels
from precompile.artifact.codec import build_bundle, decode_payload

FILES = {
    "triton/0/ABC/__grp__k.json": ("triton", b'{"child_paths": {"k.cubin": "ABC/k.cubin"}}'),
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


def test_a_group_file_names_its_kernels_files_where_they_were_primed(clean_triton_env, tmp_path):
    # Triton counts a group whose files do not exist a miss and compiles: the second GPU check's
    # serving process did, each child still named by its path in the capture's dir, long gone.
    _prime(tmp_path / "inductor")
    primed = tmp_path / "inductor" / "triton" / "0"
    group = json.loads((primed / "ABC" / "__grp__k.json").read_text())
    assert group == {"child_paths": {"k.cubin": str(primed / "ABC" / "k.cubin")}}
    assert os.path.isfile(group["child_paths"]["k.cubin"])


def test_a_group_file_of_an_older_bundle_holding_the_capture_dirs_paths_is_served_the_same(clean_triton_env, tmp_path):
    old = {**FILES, "triton/0/ABC/__grp__k.json": (
        "triton", b'{"child_paths": {"k.cubin": "/tmp/precompile-capture-kernels-1000/triton/0/ABC/k.cubin"}}')}
    bundle, payload = build_bundle(old, {})
    kernels.prime(bundle, decode_payload(bundle, payload, 0), tmp_path / "inductor")
    primed = tmp_path / "inductor" / "triton" / "0"
    assert json.loads((primed / "ABC" / "__grp__k.json").read_text())["child_paths"]["k.cubin"] == str(primed / "ABC" / "k.cubin")


@pytest.mark.parametrize("child", ["ABC/missing.cubin", "/etc/passwd", "../../ABC/k.cubin/..", "k.cubin", 7])
def test_a_group_file_that_leads_out_of_the_bundle_refuses_the_bundle_before_anything_is_written(clean_triton_env, tmp_path, child):
    hostile = {**FILES, "triton/0/ABC/__grp__k.json": ("triton", json.dumps({"child_paths": {"k.cubin": child}}).encode())}
    bundle, payload = build_bundle(hostile, {})
    with pytest.raises(ValueError, match=r"Triton group file 'triton/0/ABC/__grp__k.json' names"):
        kernels.prime(bundle, decode_payload(bundle, payload, 0), tmp_path / "inductor")
    assert not any(path.is_file() for path in tmp_path.rglob("*"))
    assert "TRITON_CACHE_DIR" not in os.environ  # nor was Triton pointed anywhere (a hostile review found it was)
