"""verify and diff start the bytecode proof (a child that compiles python_code again) before they
parse python_code, so that on a machine with a core to spare the two overlap; the same bytes are
proven once per process (diff of a pair and its byte-identical copy)."""
from __future__ import annotations

import shutil

import msgspec
import pytest
from conftest import ROOT
from test_inspect_helpers import run_cli

from precompile.artifact import bytecode, codec
from precompile.artifact.pycode import code_hash, decode_source, parse_metadata, parse_source
from precompile.inspect.reading import reader
from precompile.inspect.verify import bytecode_proof

BASE = ROOT / "fixtures" / "v1" / "dynamo_rows"


@pytest.fixture
def sealed(tmp_path):
    """dynamo_rows with its cache sealed around the bytecode and metadata capture compiles from it."""
    return _sealed(tmp_path / "rows", BASE.with_suffix(".py").read_bytes())


def _sealed(prefix, data: bytes):
    """python_code `data` at `prefix`.py with dynamo_rows' cache sealed around what capture compiles from it."""
    prefix.with_suffix(".py").write_bytes(data)
    source = decode_source(data)
    tree = parse_source(source)
    compiled, metadata = bytecode.prepare(source, code_hash(data), parse_metadata(tree), tree)
    raw = BASE.with_suffix(".cache").read_bytes()
    envelope, offset = codec.decode_header(raw)
    envelope = msgspec.structs.replace(envelope, code_hash=code_hash(data), python_bytecode=compiled, metadata_msgpack=metadata)
    prefix.with_suffix(".cache").write_bytes(codec.encode_cache(envelope, raw[offset:]))
    return prefix


@pytest.fixture
def events(monkeypatch):
    """The order in which proofs' children start and python_code is parsed, in this process."""
    seen: list[str] = []
    started = bytecode_proof._Running.__init__
    parse = reader.read_python_code

    def start(self, *args, **kwargs):
        seen.append("proof started")
        started(self, *args, **kwargs)

    def read(*args, **kwargs):
        seen.append("python_code parsed")
        return parse(*args, **kwargs)

    monkeypatch.setattr(bytecode_proof._Running, "__init__", start)
    monkeypatch.setattr(reader, "read_python_code", read)
    monkeypatch.setattr(bytecode_proof, "_made", {})
    monkeypatch.setattr(bytecode_proof, "_in_flight", {})
    return seen


def test_verify_starts_the_proof_before_it_parses_python_code_and_collects_that_one(sealed, events, capsys):
    _, out, _ = run_cli(capsys, ["verify", "-v", str(sealed)])  # (resealing leaves its bundle header unproven)
    assert "ok    python_code bytecode: identical to python_code compiled here" in out
    assert events == ["proof started", "python_code parsed"]


def test_diff_of_a_pair_and_its_byte_identical_copy_proves_the_bytecode_once(sealed, events, capsys, tmp_path):
    copy = tmp_path / "copy"
    for suffix in (".py", ".cache"):
        shutil.copyfile(sealed.with_suffix(suffix), copy.with_suffix(suffix))
    rc, out, _ = run_cli(capsys, ["diff", str(sealed), str(copy)])
    assert rc == 0, out
    assert events.count("proof started") == 1
    assert events.index("proof started") < events.index("python_code parsed")


def test_diff_of_two_releases_starts_one_child_proving_both_before_it_reads_either(sealed, events, capsys, tmp_path):
    other = _sealed(tmp_path / "other", b"RELEASE_NOTE = 2\n" + BASE.with_suffix(".py").read_bytes())
    rc, out, _ = run_cli(capsys, ["diff", "--json", str(sealed), str(other)])
    assert rc == 1, out  # they differ: the added statement
    assert events == ["proof started", "python_code parsed", "python_code parsed"]
    assert "DIFFERS" not in out and "not proven" not in out, out


def test_a_proof_started_but_never_collected_is_stopped_at_exit(sealed, events):
    data = sealed.with_suffix(".py").read_bytes()
    full, _ = codec.decode_header(sealed.with_suffix(".cache").read_bytes())
    memory = bytecode_proof.proof_memory(len(data))
    bytecode_proof.start((data, code_hash(data), full.python_bytecode, memory))
    ((running, _),) = bytecode_proof._in_flight.values()
    running._stop()  # what atexit runs
    assert running.proc.poll() is not None


def test_a_blob_resealed_with_other_fields_is_proven_again_not_answered_from_memory(sealed, events):
    # Found by the full suite: the memo was keyed by the blob's sha256, which covers its bytes only,
    # so a blob forged with another filename was answered with the earlier blob's "identical".
    data = sealed.with_suffix(".py").read_bytes()
    compiled = codec.decode_header(sealed.with_suffix(".cache").read_bytes())[0].python_bytecode
    memory = bytecode_proof.proof_memory(len(data))
    first = bytecode_proof.prove(data, code_hash(data), compiled, memory)
    forged = bytecode_proof.prove(data, code_hash(data), msgspec.structs.replace(compiled, filename="<elsewhere>"), memory)
    assert first.problem is None and first.not_proven is None
    assert forged.problem is not None and "compiled as '<elsewhere>'" in forged.problem
    assert events.count("proof started") == 2
