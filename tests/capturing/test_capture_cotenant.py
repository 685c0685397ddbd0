"""No co-tenant's code is compiled into the kernels a capture freezes (issue 52, on the capture side).

A capture compiles its kernels in a dir of its own, but with precompiled headers on it reads the
header Inductor precompiles from torch's default root, `$TMPDIR/torchinductor_<user>/precompiled_headers`,
a name any local user can take first. Inductor writes the header there only where no file has that
name yet (`codecache.write`), and its name is keyed by the header, compile command and compiler, so a
rehearsal on the same software learns it. A co-tenant who takes the root plants a header of their own
at that name; every kernel the capture compiles then `-include`s it, the capture maps them, and the
bundle ships them to every host that serves the pair (signed, verified: `verify --host` says ok).

The co-tenant is uid 65534 (a forked child that drops to it); the planted header includes the real
one and adds a constructor that appends to a marker file. Each capture runs in a fresh process (the
header is memoized per process) with TMPDIR a root-owned sticky directory, as /tmp is.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import ROOT, as_co_tenant

from precompile.artifact.codec import decode_payload
from precompile.artifact.pair import parse_cache


CAPTURE = r"""
import sys, torch, precompile
def step(model, x):
    return model(x).relu()
model, x = torch.nn.Linear(8, 4), torch.randn(2, 8)
with torch.no_grad(), precompile.capture(step, artifact_path=sys.argv[1] + ".py", cache_path=sys.argv[1] + ".cache",
                                         tracer=precompile.MakeFxTracer(), backend="inductor") as cap:
    cap(model, x)
"""

PLANTED = r"""#include <torch/csrc/inductor/cpp_prefix.h>
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void co_tenant_planted(void) {
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (fd >= 0) { write(fd, "mapped\n", 7); close(fd); }
}
"""




def _capture(prefix: Path, tmp: Path) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if name not in ("TORCHINDUCTOR_CACHE_DIR", "TMPDIR")}
    return subprocess.run([sys.executable, "-c", CAPTURE, str(prefix)], capture_output=True, text=True, timeout=600,
                          env={**env, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)})


@pytest.fixture
def shared_tmp():
    directory = Path(tempfile.mkdtemp(prefix="precompile-cotenant-"))
    os.chmod(directory, 0o1777)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_a_capture_never_compiles_a_header_a_co_tenant_planted_in_the_default_root(shared_tmp, tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    outside = Path(tempfile.mkdtemp(prefix="precompile-marker-"))
    os.chmod(outside, 0o777)
    marker = outside / "mapped.txt"
    try:
        root = shared_tmp / "torchinductor_root"
        rehearsal = _capture(tmp_path / "rehearsal", shared_tmp)  # learns the header's name, as a co-tenant would
        assert rehearsal.returncode == 0, rehearsal.stderr[-4000:]
        headers = sorted((root / "precompiled_headers").glob("*.h"))
        if not headers:
            pytest.skip("this torch precompiles no header for a CPU kernel")
        names = [path.name for path in headers]
        shutil.rmtree(root)

        def plant() -> None:
            (root / "precompiled_headers").mkdir(mode=0o777, parents=True)
            for name in names:
                (root / "precompiled_headers" / name).write_text(PLANTED.replace("MARKER", f'"{marker}"'))

        as_co_tenant(plant, "plant its header")
        captured = _capture(tmp_path / "model", shared_tmp)
        mapped_at_capture = marker.exists()
        marker.unlink(missing_ok=True)
        if captured.returncode == 0:  # refusing is fine; serving the co-tenant's code is not
            cache = tmp_path / "model.cache"
            parsed = parse_cache(cache, cache.read_bytes())
            files = decode_payload(parsed.envelope.bundle, parsed.data, parsed.payload_offset)
            shipped = [path for path, data in files.items() if b"co_tenant_planted" in data]
            assert not shipped, f"the bundle ships the co-tenant's code in {shipped}"
        assert not mapped_at_capture, "the capturing process mapped a kernel built with the co-tenant's header"
    finally:
        shutil.rmtree(outside, ignore_errors=True)


def test_the_capture_lock_never_follows_a_co_tenants_symlink_onto_a_file_of_this_user(shared_tmp, tmp_path):
    """The capture's lock file is a fixed name in TMPDIR (`precompile-capture-kernels-<uid>.lock`): a
    co-tenant who makes it a symlink to a file of this user gets that file truncated and overwritten
    with the holder's record (where fs.protected_symlinks is 0, as in many containers)."""
    from precompile.capturing import kernel_dir
    from precompile.errors import PrecompileError

    precious = tmp_path / "precious.txt"
    precious.write_text("this user's data\n")
    lock = shared_tmp / f"precompile-capture-kernels-{os.getuid()}.lock"
    as_co_tenant(lambda: os.symlink(precious, lock), "make its symlink")
    try:
        taken = kernel_dir.try_take(lock)
    except (PrecompileError, OSError):
        taken = None
    if taken is not None:
        os.close(taken)
    assert precious.read_text() == "this user's data\n", "the capture lock wrote through the co-tenant's symlink"
