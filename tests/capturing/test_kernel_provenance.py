"""What a bundle's provenance records of the C++ builds: the same for two captures of one model."""
from __future__ import annotations

from pathlib import Path

from precompile.capturing.kernels import CAPTURE_DIR_NAME, producer_provenance, reproducible

CACHE = Path("/tmp/precompile-capture-kernels-0")
KERNEL = f"g++ {CACHE}/ab/cabc.main.cpp -O3 -include /tmp/torchinductor_0/precompiled_headers/c1.h -o {CACHE}/ab/cabc.main.so"
PROBE = f"g++ {CACHE}/q6/cq6.cpp -mavx512f -o {CACHE}/q6/cq6.so"


def _header_check(tmp: str) -> str:
    return f"g++ /tmp/{tmp}/header.hpp -E -D TORCH_INDUCTOR_PRECOMPILE_HEADERS -o /tmp/{tmp}/header.i"


def test_the_command_hash_ignores_the_precompiled_header_checks_in_fresh_temporary_dirs():
    """Inductor checks its precompiled header in a new temporary dir, and only on a process's first
    capture: neither may change the hash (found by a second capture of the same model differing)."""
    def digest(commands):
        return producer_provenance(commands, CACHE)["compiler_command_sha256"]

    first = digest([KERNEL, PROBE, _header_check("tmpa1b2c3")])
    assert digest([_header_check("tmpz9y8x7"), PROBE, KERNEL]) == first
    assert digest([KERNEL, PROBE]) == first  # a later capture in the same process checks no header
    assert digest([KERNEL.replace("-O3", "-O2"), PROBE]) != first  # a kernel built otherwise still shows


def test_a_build_maps_the_capture_dir_out_and_inductors_key_command_stays_free_of_it(tmp_path):
    """The capture dir sits under TMPDIR: mapped to a fixed name where a command builds in it (a bounds
    check's `__FILE__`), and left out of the command Inductor keys a kernel by (its placeholder names)."""
    build = reproducible(f"g++ {tmp_path}/ab/cabc.cpp -O3 -o {tmp_path}/ab/cabc.so", tmp_path)
    assert f"-ffile-prefix-map={tmp_path}={CAPTURE_DIR_NAME} " in build
    assert str(tmp_path) not in reproducible("g++ i -O3 -o o.so", tmp_path)
