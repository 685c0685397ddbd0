"""verify's proof that a cache's bytecode is its python_code's is bounded (issue 38, finding 5): what
a cache carries cannot make verify take memory in proportion to a compile of the whole file (about
40-150 bytes per byte). The proof runs in a child with an address-space limit; over it, the check
fails as "not proven" (exit 1) instead. Each verify runs in a fresh process; its peak resident
memory (the proof's child included: wait4 reports the largest of them) is read with wait4.
"""
from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from conftest import ROOT

from precompile.artifact import bytecode, codec
from precompile.artifact.pycode import code_hash, decode_source, parse_metadata, parse_source

BASE = ROOT / "fixtures" / "v1" / "dynamo_rows"
SIZE = 2 * 1024 * 1024
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """dynamo_rows with ~2 MB appended (a base64 literal, a table of strings, plain code: what a big
    artifact holds), its cache sealed around the bytecode and metadata capture compiles from it."""
    prefix = tmp_path_factory.mktemp("big") / "big"
    encoded = base64.b64encode(random.Random(0).randbytes(SIZE // 4)).decode()
    lines = ["_big_state = (\n", *(f"    {encoded[i:i + 100]!r}\n" for i in range(0, len(encoded), 100)), ")\n",
             "BIG_TABLE = (\n", *(f"    'entry {i}: {'abcdefgh' * 3}',\n" for i in range(SIZE // 3 // 42)), ")\n",
             *(f"value_{i} = value_{i - 1} + {i % 7} if {i} % 3 else None\n" for i in range(1, SIZE // 3 // 56))]
    data = BASE.with_suffix(".py").read_bytes() + "".join(lines).encode()
    prefix.with_suffix(".py").write_bytes(data)
    source = decode_source(data)
    tree = parse_source(source)
    compiled, metadata = bytecode.prepare(source, code_hash(data), parse_metadata(tree), tree)
    del tree
    raw = BASE.with_suffix(".cache").read_bytes()
    envelope, offset = codec.decode_header(raw)
    envelope = msgspec.structs.replace(envelope, code_hash=code_hash(data), python_bytecode=compiled, metadata_msgpack=metadata)
    prefix.with_suffix(".cache").write_bytes(codec.encode_cache(envelope, raw[offset:]))
    return prefix


MEASURE = r"""
import json, os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
out, err = proc.communicate(timeout=120)
print(json.dumps({"rc": proc.returncode, "out": out.decode(), "err": err.decode()[-3000:]}))
print(json.dumps({"peak": __import__("resource").getrusage(__import__("resource").RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""
"""Runs a command from a small process of its own and reports the command's peak resident memory:
measured from the test process, it would count the test process's own pages, which a forked child
holds until it runs the command."""


def _verify(prefix: Path, tmp_path: Path, **env: str) -> tuple[int, str, int]:
    """(exit code, stdout, peak resident bytes) of `precompile verify -v` in a fresh process."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    proc = subprocess.run([sys.executable, "-c", MEASURE, sys.executable, "-m", "precompile", "verify", "-v", str(prefix)],
                          cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result, peak = (json.loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    assert result["rc"] in (0, 1), result["err"]
    return result["rc"], result["out"], peak["peak"]


def test_a_proof_over_its_memory_bound_is_not_made_and_verify_fails_saying_so(big, tmp_path):
    size = big.with_suffix(".py").stat().st_size
    bound = 20 * size
    rc, out, peak = _verify(big, tmp_path, PRECOMPILE_PROOF_MEMORY=str(bound // MiB))
    line = next(line for line in out.splitlines() if "python_code bytecode" in line)
    assert rc == 1 and line.lstrip().startswith("FAIL") and "not proven" in line, out
    assert f"needs more than the {bound // MiB} MiB the proof may take" in line
    # The verb itself reads the pair like show (about 30 bytes per byte here, interpreter included);
    # the proof adds no more than its bound. A whole compile in-process took about 90 per byte.
    assert peak < 100 * MiB + bound, f"verify peaked at {peak / MiB:.0f} MiB for {size / MiB:.1f} MiB of python_code"


def test_a_normal_size_is_proven_whole_under_the_default_bound(big, tmp_path):
    rc, out, peak = _verify(big, tmp_path)
    line = next(line for line in out.splitlines() if "python_code bytecode" in line)
    assert line.lstrip().startswith("ok") and "identical to python_code compiled here" in line, out
