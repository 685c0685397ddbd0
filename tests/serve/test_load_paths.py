"""One set of load checks, whichever way python_code runs: compiled here from its text, or as the
bytecode its cache carries (which load runs without parsing python_code). Each hostile artifact of
fixtures/hostile/ is loaded as shipped (its cache carries no bytecode) and resealed with the bytecode
and typed metadata capture would compile from its python_code, each in a fresh process: the outcome
(the error, whether the payload ran) must be the same."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import zstandard
from conftest import ROOT

from precompile.artifact import bytecode, codec
from precompile.artifact.pycode import code_hash, decode_source, parse_metadata, parse_source

HOSTILE = ROOT / "fixtures" / "hostile"
ARTIFACTS = sorted(path.stem for path in HOSTILE.glob("*.py") if path.stem != "make_hostile")
MARKER = "PRECOMPILE_POISON_MARKER"

LOAD = r"""
import json, os, sys, warnings
warnings.simplefilter("ignore")
import precompile
artifact, cache = sys.argv[1:3]
try:
    runnable = precompile.load(artifact, cache)
    outcome = {"loaded": True, "bytecode": runnable.bytecode_from_cache}
except Exception as exc:
    outcome = {"error": type(exc).__name__, "message": str(exc).replace(os.path.dirname(artifact), "<dir>")}
outcome["payload_ran"] = os.path.exists(os.path.join(os.getcwd(), "PRECOMPILE_POISON_MARKER"))
print(json.dumps(outcome))
"""


def reseal(artifact: Path, cache: Path, *, with_bytecode: bool = True) -> None:
    """Give `cache` the bytecode and typed metadata capture compiles from `artifact` (every hash
    sealed), as capturing/pipeline.py does: what an attacker who ships python_code ships with it.
    Without the bytecode, load takes the metadata and compiles python_code (it parses nothing else)."""
    data = artifact.read_bytes()
    source = decode_source(data)
    tree = parse_source(source)
    compiled, metadata = bytecode.prepare(source, code_hash(data), parse_metadata(tree), tree)
    assert compiled is not None and metadata is not None
    assert bytecode.unusable_reason(compiled, code_hash(data)) is None  # load would run it
    envelope, offset = codec.decode_header(cache.read_bytes())
    payload = cache.read_bytes()[offset:]
    envelope = msgspec.structs.replace(envelope, python_bytecode=compiled if with_bytecode else None, metadata_msgpack=metadata)
    cache.write_bytes(codec.encode_cache(envelope, payload))


def load_outcome(artifact: Path, cache: Path, cwd: Path) -> dict:
    """What precompile.load does with the pair in a fresh process (cwd: where the payload writes)."""
    env = {"PYTHONPATH": f"{ROOT}{':' + str(ROOT / 'fixtures')}", "PATH": "/usr/bin:/bin", "HOME": str(cwd),
           "TORCHINDUCTOR_CACHE_DIR": str(cwd / "inductor")}
    proc = subprocess.run([sys.executable, "-c", LOAD, str(artifact), str(cache)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _copy(name: str, directory: Path) -> tuple[Path, Path]:
    directory.mkdir()
    artifact, cache = directory / f"{name}.py", directory / f"{name}.cache"
    shutil.copy(HOSTILE / f"{name}.py", artifact)
    shutil.copy(HOSTILE / f"{name}.cache", cache)
    return artifact, cache


@pytest.mark.parametrize("with_bytecode", [True, False], ids=["bytecode", "metadata-only"])
@pytest.mark.parametrize("name", ARTIFACTS)
def test_each_hostile_artifact_has_the_same_outcome_with_or_without_cached_bytecode(name, with_bytecode, tmp_path):
    shipped = _copy(name, tmp_path / "shipped")
    resealed = _copy(name, tmp_path / "resealed")
    reseal(*resealed, with_bytecode=with_bytecode)
    assert codec.decode_header(shipped[1].read_bytes())[0].python_bytecode is None
    expected = load_outcome(*shipped, cwd=shipped[0].parent)
    assert load_outcome(*resealed, cwd=resealed[0].parent) == expected
    assert expected.get("error") == "PrecompileError" and not expected["payload_ran"], expected  # canonical ones: their scan


def test_a_cached_bytecode_that_records_no_opaque_check_is_not_run(tmp_path):
    """A cache written before the check was recorded (or with the record removed): python_code is
    compiled, and so checked, instead."""
    artifact, cache = _copy("dynamo_state_bytes", tmp_path / "pair")
    reseal(artifact, cache)
    envelope, offset = codec.decode_header(cache.read_bytes())
    stripped = msgspec.structs.replace(envelope.python_bytecode, opaque=None)
    cache.write_bytes(codec.encode_cache(msgspec.structs.replace(envelope, python_bytecode=stripped), cache.read_bytes()[offset:]))
    outcome = load_outcome(artifact, cache, cwd=artifact.parent)
    assert outcome["error"] == "PrecompileError" and "is not in the canonical form" in outcome["message"]
    assert not outcome["payload_ran"]


def test_verify_refuses_a_record_that_is_not_what_the_rule_finds(tmp_path, capsys):
    """The record load trusts beside the bytecode is part of verify's proof that the bytecode is
    python_code's: a record that hides a problem fails verify, naming the rule."""
    from precompile.cli.main import main

    artifact, cache = _copy("dynamo_state_bytes", tmp_path / "pair")
    reseal(artifact, cache)
    envelope, offset = codec.decode_header(cache.read_bytes())
    hidden = msgspec.structs.replace(envelope.python_bytecode.opaque, problems=())
    forged = msgspec.structs.replace(envelope.python_bytecode, opaque=hidden)
    cache.write_bytes(codec.encode_cache(msgspec.structs.replace(envelope, python_bytecode=forged), cache.read_bytes()[offset:]))
    assert main(["verify", "--json", str(artifact), str(cache)]) == 1
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["python_code bytecode"]["status"] == "fail"
    assert "load's opaque-state rule finds in python_code as 0 problems" in checks["python_code bytecode"]["message"]


READS_LEFT_OUT = "\nif bytes.fromhex('53554d4d415259').decode() not in globals():\n    open('PRECOMPILE_POISON_MARKER', 'w').close()\n"


@pytest.mark.parametrize("old_cache", [False, True], ids=["as-capture-writes", "left-out-as-caches-before"])
def test_a_name_looked_up_at_run_time_is_bound_under_load_as_when_python_code_runs_as_printed(old_cache, tmp_path):
    """A visible line of python_code that looks SUMMARY up by a name computed at run time acts the
    same under load as when python_code runs alone: load's bytecode binds every name python_code
    binds, and bytecode that leaves one out (as caches written before did) is not run."""
    directory = tmp_path / "pair"
    directory.mkdir()
    artifact, cache = directory / "m.py", directory / "m.cache"
    artifact.write_text((ROOT / "fixtures" / "v1" / "dynamo_break_eager.py").read_text(encoding="utf-8") + READS_LEFT_OUT,
                        encoding="utf-8")
    envelope, offset = codec.decode_header((ROOT / "fixtures" / "v1" / "dynamo_break_eager.cache").read_bytes())
    cache.write_bytes(codec.encode_cache(msgspec.structs.replace(envelope, code_hash=code_hash(artifact.read_bytes()))))
    reseal(artifact, cache)
    if old_cache:
        data = artifact.read_bytes()
        source, digest = decode_source(data), code_hash(data)
        assert bytecode.left_out_literals(source, parse_source(source)) == ("SUMMARY",)
        stored = bytecode.compiled_bytes(source, digest, parse_source(source), left_out=("SUMMARY",))
        blob = zstandard.ZstdCompressor(write_content_size=True).compress(stored)
        envelope, offset = codec.decode_header(cache.read_bytes())
        old = msgspec.structs.replace(envelope.python_bytecode, data=blob, size=len(stored), compressed_size=len(blob),
                                      sha256=hashlib.sha256(blob).hexdigest(), left_out=("SUMMARY",))
        cache.write_bytes(codec.encode_cache(msgspec.structs.replace(envelope, python_bytecode=old)))
    outcome = load_outcome(artifact, cache, cwd=directory)
    import torch

    if "TORCH_VERSION = '2.13.0+cpu'" not in artifact.read_text(encoding="utf-8") or torch.__version__ != "2.13.0+cpu":
        # the fixture's guard state is tied to the torch build it was captured with: refused before it runs
        assert outcome["error"] == "PrecompileError" and "it was captured with torch" in outcome["message"], outcome
        assert not outcome["payload_ran"]
        return
    assert outcome == {"loaded": True, "bytecode": not old_cache, "payload_ran": False}, outcome
    alone = subprocess.run([sys.executable, str(artifact)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env={"PYTHONPATH": f"{ROOT}:{ROOT / 'fixtures'}", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert alone.returncode == 0, alone.stderr[-2000:]
    assert not (tmp_path / MARKER).exists()
