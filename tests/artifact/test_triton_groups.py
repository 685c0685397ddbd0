"""Triton's group files: portable in the bundle, pointed at the serving dir when primed (torch-free)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from precompile.artifact import triton_groups

PATH = "triton/0/KEY/__grp__kernel.json"
# As Triton's FileCacheManager.put_group writes it in a capture's private dir.
WRITTEN = json.dumps({"child_paths": {
    "kernel.cubin": "/tmp/precompile-capture-kernels-1000/triton/0/KEY/kernel.cubin",
    "kernel.json": "/tmp/precompile-capture-kernels-1000/triton/0/KEY/kernel.json",
}}).encode()


def test_only_tritons_group_files_are_groups():
    assert triton_groups.is_group(PATH)
    assert not triton_groups.is_group("triton/0/KEY/kernel.json")
    assert not triton_groups.is_group("ab/__grp__kernel.json")  # not under triton/


def test_capture_keeps_each_childs_key_and_name_and_no_path_of_the_capturing_machine():
    portable = triton_groups.portable(WRITTEN, PATH)
    assert json.loads(portable) == {"child_paths": {"kernel.cubin": "KEY/kernel.cubin", "kernel.json": "KEY/kernel.json"}}
    assert b"/tmp" not in portable
    assert triton_groups.portable(portable, PATH) == portable  # what a capture bundles, bundled again


def test_priming_names_each_child_where_the_bundle_put_it():
    bundled = {"triton/0/KEY/kernel.cubin", "triton/0/KEY/kernel.json", PATH}
    located = {path: Path("/serve/triton") / path.split("/", 2)[2] for path in bundled}
    for data in (WRITTEN, triton_groups.portable(WRITTEN, PATH)):
        served = json.loads(triton_groups.served(data, PATH, bundled, located.__getitem__))
        assert served == {"child_paths": {"kernel.cubin": "/serve/triton/KEY/kernel.cubin",
                                          "kernel.json": "/serve/triton/KEY/kernel.json"}}


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\xff", "is not JSON"),
        (b"[1]", "as Triton writes it"),
        (b'{"child_paths": ["KEY/kernel.cubin"]}', "as Triton writes it"),  # a remote cache manager's list
        (b'{"child_paths": {}, "extra": 1}', "as Triton writes it"),
        (b'{"child_paths": {"kernel.cubin": "kernel.cubin"}}', "not a file in a Triton cache dir"),
        (b'{"child_paths": {"kernel.cubin": "KEY/.."}}', "not a file in a Triton cache dir"),
        (b'{"child_paths": {"kernel.cubin": null}}', "not a file in a Triton cache dir"),
        # Found by a hostile review: a raw RecursionError, and one small stored group naming a file
        # millions of times (hundreds of MB written, the process killed for memory).
        (b"[" * 5_000, "is not JSON \\(RecursionError\\)"),
        (json.dumps({"child_paths": {f"k{i}": "KEY/kernel.cubin" for i in range(1000)}}).encode(), "names 1000 files, over the 256"),
        (b" " * (triton_groups.MAX_GROUP_BYTES + 1), "bytes, over the 65536 a group takes"),
    ],
)
def test_what_triton_does_not_write_is_refused_naming_the_file(data, problem):
    with pytest.raises(ValueError, match=rf"Triton group file '{PATH}' .*{problem}"):
        triton_groups.portable(data, PATH)


def test_a_child_the_bundle_does_not_hold_is_refused_at_priming():
    with pytest.raises(ValueError, match="names 'OTHER/kernel.cubin' for 'kernel.cubin', which the bundle does not hold"):
        triton_groups.served(b'{"child_paths": {"kernel.cubin": "OTHER/kernel.cubin"}}', PATH, {PATH}, Path)
