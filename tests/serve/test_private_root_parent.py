"""The private root load falls back to must itself be one no one else can write (issue 52, finding 1).

Where Inductor's root breaks the owner-only rule, load points this process's Inductor at a "private
root" it makes with `tempfile.mkdtemp` in TMPDIR. Where the rule was broken by TMPDIR itself (a dir
the co-tenant owns, or any dir they can write that is not sticky), that private root sits in the
co-tenant's dir: they rename it away and put a dir of their own, planted, in its place between its
mkdtemp and the compile or bundle write that follows (a watcher loop wins this race every time, the
JIT compile taking seconds), and the process maps their libraries. The co-tenant here is uid 65534.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import ROOT

CO_TENANT = 65534

JUDGE = r"""
import json, warnings
from precompile.serve import kernel_root
from precompile.storage.owner_only import problem
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    judged = kernel_root.for_this_process()
print(json.dumps({"root": str(judged.root), "problem": problem(judged.root)}))
"""


@pytest.fixture
def co_tenants_tmp():
    """A TMPDIR the co-tenant owns and anyone may write (not sticky): the kind a shared job sets."""
    if os.getuid() != 0:
        pytest.skip("emulating a second user needs root here (to give a dir to uid 65534)")
    directory = Path(tempfile.mkdtemp(prefix="precompile-cotenant-tmp-"))
    os.chmod(directory, 0o777)
    os.chown(directory, CO_TENANT, CO_TENANT)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_the_private_root_load_falls_back_to_keeps_the_rule_it_enforces(co_tenants_tmp):
    env = {name: value for name, value in os.environ.items() if name not in ("TORCHINDUCTOR_CACHE_DIR", "TMPDIR")}
    proc = subprocess.run([sys.executable, "-c", JUDGE], capture_output=True, text=True, timeout=300,
                          env={**env, "PYTHONPATH": str(ROOT), "TMPDIR": str(co_tenants_tmp)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    judged = json.loads(proc.stdout.strip().splitlines()[-1])
    assert judged["problem"] is None, f"the private root {judged['root']} breaks the rule: {judged['problem']}"
