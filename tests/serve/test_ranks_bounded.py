"""load_everywhere reads the pair as load does (issue 38, finding 6): a FIFO in place of the cache
was read with Path.read_bytes() and hung rank src, where load refuses it at once."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from conftest import ROOT

SERVE = r"""
import json, sys
import torch.distributed as dist
import precompile, precompile.distributed
dist.init_process_group("gloo", init_method="file://" + sys.argv[3], rank=0, world_size=1)
try:
    precompile.distributed.load_everywhere(sys.argv[1], sys.argv[2])
    print(json.dumps({"loaded": True}))
except precompile.PrecompileError as exc:
    print(json.dumps({"error": str(exc)}))
finally:
    dist.destroy_process_group()
"""


def test_a_fifo_cache_is_refused_at_once_by_load_everywhere(tmp_path):
    artifact, cache = tmp_path / "m.py", tmp_path / "m.cache"
    shutil.copy(ROOT / "fixtures" / "v1" / "mlp.py", artifact)
    os.mkfifo(cache)
    proc = subprocess.run([sys.executable, "-c", SERVE, str(artifact), str(cache), str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    assert f"cache {cache} is not a regular file (it is a FIFO)" in outcome["error"], outcome
