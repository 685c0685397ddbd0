"""A load does no work a capture could have done: the cache carries python_code compiled (keyed, like a
hash-checked .pyc, by the exact python_code and the interpreter's magic number) and its metadata as
typed msgpack. Load uses them only when they provably belong to the python_code at hand (else it
compiles and parses as before), and verify proves them by compiling python_code again and comparing
bytes, never by loading what is stored."""
from __future__ import annotations

import ast
import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import torch
import zstandard
from conftest import ROOT, TESTS, fresh_json

import precompile
from precompile.artifact import bytecode, bytecode_check, codec
from precompile.cli.main import main

FIXTURES = ROOT / "fixtures" / "v1"

FRESH_LOAD = r"""
import json, linecache, logging, sys, torch
compiled = []
sys.addaudithook(lambda event, args: compiled.append(str(args[1])) if event == "compile" else None)
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("precompile").addHandler(Keep())
logging.getLogger("precompile").setLevel(logging.DEBUG)
import precompile
from precompile.artifact import pycode
from cases import CASES
artifact, cache = sys.argv[1:3]
before = len(compiled)
runnable = precompile.load(artifact, cache)
import os
compiled_by_load = [name for name in compiled[before:] if name.startswith("<precompile") or name == os.path.realpath(artifact)]
case = CASES["mlp_batchnorm"]
with torch.no_grad():
    close = torch.allclose(runnable(*case.args()), case.fn(*case.args()))
code = type(runnable._forward).__call__.__code__  # the served forward: the MakeFx driver's _ServedForward
alone = {}
exec(open(artifact).read(), alone)  # python_code still runs alone, as the source of truth
with torch.no_grad():
    alone_close = torch.allclose(alone["forward"](*case.args()), case.fn(*case.args()))
print(json.dumps({
    "close": close, "alone_close": alone_close, "parses": pycode.parses, "bytecode": runnable.bytecode_from_cache,
    "metadata": runnable.metadata_from_cache, "loaded": [r for r in records if r.startswith("loaded ")],
    "co_filename": code.co_filename, "line": linecache.getline(code.co_filename, code.co_firstlineno),
    "compiled_by_load": compiled_by_load,
}))
"""


def _copy(pair, tmp_path: Path, name: str = "m") -> tuple[Path, Path]:
    artifact, cache = tmp_path / f"{name}.py", tmp_path / f"{name}.cache"
    shutil.copy(pair[0], artifact)
    shutil.copy(pair[1], cache)
    return artifact, cache


def _fields(cache: Path) -> tuple[dict, bytes]:
    data = cache.read_bytes()
    offset = codec.PREFIX_SIZE + int.from_bytes(data[len(codec.MAGIC) : codec.PREFIX_SIZE], "little")
    return msgspec.msgpack.decode(data[codec.PREFIX_SIZE : offset]), data[offset:]


def _forge(cache: Path, *, bytecode_fields: dict | None = None, metadata_fields: dict | None = None) -> None:
    """Rewrite the header's blob entries as a hand edit would, the header digest recomputed."""
    fields, payload = _fields(cache)
    fields["python_bytecode"].update(bytecode_fields or {})
    fields["metadata_msgpack"].update(metadata_fields or {})
    fields.pop("header_sha256")
    fields["header_sha256"] = codec.header_digest(msgspec.msgpack.encode(fields))
    header = msgspec.msgpack.encode(fields)
    cache.write_bytes(codec.MAGIC + len(header).to_bytes(4, "little") + header + payload)


def _sealed(data: bytes) -> dict:
    """The entry fields that store `data` as capture does, its sizes and sha256 matching."""
    stored = zstandard.ZstdCompressor(write_content_size=True).compress(data)
    return {"data": stored, "size": len(data), "compressed_size": len(stored), "sha256": hashlib.sha256(stored).hexdigest()}


def _stored(entry: dict) -> bytes:
    return zstandard.ZstdDecompressor().decompress(entry["data"])


def _verify(capsys, artifact: Path, cache: Path) -> tuple[int, dict[str, dict]]:
    rc = main(["verify", "--json", str(artifact), str(cache)])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    return rc, checks


def test_a_fresh_process_runs_the_cached_bytecode_and_parses_nothing(captured):
    artifact, cache = captured["mlp_batchnorm"]
    report = fresh_json(FRESH_LOAD, str(artifact), str(cache))
    assert report["close"] and report["alone_close"]
    assert report["parses"] == 0, "load parsed python_code although its cache carries the metadata"
    assert report["bytecode"] and report["metadata"]
    assert report["compiled_by_load"] == []  # the audit hook saw no compile() of python_code
    assert len(report["loaded"]) == 1 and "bytecode from the cache, metadata from the cache" in report["loaded"][0]
    # tracebacks and debuggers see python_code's real path and lines, as when it was compiled there
    assert report["co_filename"] == str(artifact.resolve())
    assert report["line"].strip().startswith("def __call__(self, *args, **kwargs):")


def test_tracebacks_show_the_loaded_python_code_after_its_file_is_replaced_or_gone(captured, tmp_path):
    """load registers the lines it ran with linecache: a file overwritten by a later capture, or
    moved away, does not change what tracebacks of the loaded code show."""
    import linecache

    artifact, cache = _copy(captured["mlp_batchnorm"], tmp_path)
    runnable = precompile.load(artifact, cache)
    code = type(runnable._forward).__call__.__code__
    line = linecache.getline(code.co_filename, code.co_firstlineno)
    assert code.co_filename == str(artifact.resolve()) and line.strip().startswith("def __call__(self, *args, **kwargs):")
    artifact.write_text("\n" * code.co_firstlineno + "# another capture's python_code\n")
    linecache.checkcache()
    assert linecache.getline(code.co_filename, code.co_firstlineno) == line
    artifact.unlink()
    linecache.checkcache()
    assert linecache.getline(code.co_filename, code.co_firstlineno) == line


def test_a_process_at_another_optimization_level_compiles_python_code(captured):
    artifact, cache = captured["mlp_batchnorm"]
    optimized = run_fresh_optimized(FRESH_LOAD, str(artifact), str(cache))
    assert optimized["close"] and not optimized["bytecode"] and optimized["metadata"]
    assert optimized["compiled_by_load"] == [str(artifact.resolve())]
    assert "bytecode compiled here, metadata from the cache" in optimized["loaded"][0]


def run_fresh_optimized(code: str, *args: str) -> dict:
    """conftest.fresh_json under `python -O`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-O", "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_genuine_pair_verifies_and_show_lists_the_blobs(captured, capsys):
    artifact, cache = captured["mlp_batchnorm"]
    rc, checks = _verify(capsys, artifact, cache)
    assert rc == 0
    assert checks["python_code bytecode"]["status"] == "ok"
    assert checks["python_code typed metadata"]["status"] == "ok"
    assert main(["show", str(artifact), str(cache)]) == 0
    out = capsys.readouterr().out
    assert "python_code bytecode: " in out and f"Python magic {bytecode.magic()}" in out
    assert "python_code metadata, typed: " in out
    assert main(["show", "--json", str(artifact), str(cache)]) == 0
    envelope = json.loads(capsys.readouterr().out)["artifact"]["cache"]["envelope"]
    assert envelope["python_bytecode"]["data"] == "" and envelope["python_bytecode"]["size"] > 0  # sizes, not bytes


@pytest.mark.parametrize("enabled", [True, False])
def test_load_pauses_the_cyclic_collector_only_while_nothing_compiles_and_leaves_it_as_found(
        captured, tmp_path, monkeypatch, enabled):
    """Load builds long-lived objects, not garbage: the collector waits while it runs python_code's
    cached bytecode (a full collection over torch's objects would otherwise land in the middle of it),
    runs as found while python_code compiles, and is as found afterwards, also after a refused pair."""
    from precompile.serve import load as load_module

    seen = []
    real_execute = load_module.execute
    monkeypatch.setattr(load_module, "execute", lambda *args, **kwargs: (seen.append(gc.isenabled()), real_execute(*args, **kwargs))[1])
    artifact, cache = _copy(captured["mlp_batchnorm"], tmp_path)
    forged_artifact, forged_cache = _copy(captured["mlp_batchnorm"], tmp_path, "forged")
    _forge(forged_cache, bytecode_fields={"magic": "00000d0a"})
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        assert precompile.load(artifact, cache).bytecode_from_cache
        assert gc.isenabled() is enabled
        assert not precompile.load(forged_artifact, forged_cache).bytecode_from_cache
        assert gc.isenabled() is enabled
        with pytest.raises(precompile.PrecompileError):
            precompile.load(artifact, captured["plain_function"][1])
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
    assert seen == [False, enabled]


def test_a_foreign_magic_number_falls_back_to_compiling(captured, tmp_path, capsys):
    artifact, cache = _copy(captured["mlp_batchnorm"], tmp_path)
    _forge(cache, bytecode_fields={"magic": "00000d0a"})
    runnable = precompile.load(artifact, cache)
    assert runnable.cache_used and runnable.metadata_from_cache and not runnable.bytecode_from_cache
    rc, checks = _verify(capsys, artifact, cache)
    # cannot be proven here, and a Python of that magic number would run it: verify says so with a failure
    assert rc == 1 and checks["python_code bytecode"]["status"] == "fail"


def test_a_swapped_bytecode_blob_falls_back_to_compiling_and_fails_verify(captured, tmp_path, capsys):
    artifact, cache = _copy(captured["mlp_batchnorm"], tmp_path)
    other, _ = _fields(captured["plain_function"][1])
    _forge(cache, bytecode_fields={"data": other["python_bytecode"]["data"]})  # its size and sha256 left as recorded
    runnable = precompile.load(artifact, cache)
    assert runnable.cache_used and not runnable.bytecode_from_cache
    rc, checks = _verify(capsys, artifact, cache)
    assert rc == 1 and checks["python_code bytecode"]["status"] == "fail"
    assert "its entry records" in checks["python_code bytecode"]["message"]
    # With every hash forged to match, load trusts the paired cache as it trusts python_code (a
    # signature covers both); verify still proves the bytes are not python_code's.
    fields, _ = _fields(captured["mlp_batchnorm"][1])
    code = _stored(fields["python_bytecode"])
    forged = code.replace(b"forward", b"fOrward", 1)
    assert forged != code
    _forge(cache, bytecode_fields=_sealed(forged))
    rc, checks = _verify(capsys, artifact, cache)
    assert rc == 1 and "differ from python_code compiled here" in checks["python_code bytecode"]["message"]


def test_bytecode_of_another_python_code_is_never_run(captured, tmp_path, capsys):
    """A cache whose code_hash was made to follow an edited python_code keeps blobs of the old one:
    they record the code_hash they were made from, so load compiles and parses the new text."""
    artifact, cache = _copy(captured["mlp_batchnorm"], tmp_path)
    artifact.write_bytes(artifact.read_bytes() + b"EDITED = 1\n")
    fields, payload = _fields(cache)
    fields["code_hash"] = hashlib.sha256(artifact.read_bytes()).hexdigest()
    fields.pop("header_sha256")
    fields["header_sha256"] = codec.header_digest(msgspec.msgpack.encode(fields))
    header = msgspec.msgpack.encode(fields)
    cache.write_bytes(codec.MAGIC + len(header).to_bytes(4, "little") + header + payload)
    runnable = precompile.load(artifact, cache)
    assert runnable.cache_used and not runnable.bytecode_from_cache and not runnable.metadata_from_cache
    rc, checks = _verify(capsys, artifact, cache)
    assert rc == 1
    assert checks["python_code bytecode"]["status"] == checks["python_code typed metadata"]["status"] == "fail"


def test_swapped_metadata_falls_back_to_parsing_and_fails_verify(captured, tmp_path, capsys):
    artifact, cache = _copy(captured["mlp_batchnorm"], tmp_path)
    other, _ = _fields(captured["mlp_batchnorm"][1])
    meta = msgspec.msgpack.decode(_stored(other["metadata_msgpack"]))
    meta["FN_NAME"] = "somewhere.else"
    swapped = msgspec.msgpack.encode(meta)
    _forge(cache, metadata_fields={"data": _sealed(swapped)["data"]})
    runnable = precompile.load(artifact, cache)
    assert runnable.bytecode_from_cache and not runnable.metadata_from_cache
    assert runnable.metadata.fn_name != "somewhere.else"
    _forge(cache, metadata_fields=_sealed(swapped))
    rc, checks = _verify(capsys, artifact, cache)
    assert rc == 1 and "differs from the metadata literals" in checks["python_code typed metadata"]["message"]


def test_served_metadata_is_decoded_whole_only_when_read(captured, tmp_path, monkeypatch):
    """load decodes the typed metadata's header alone (what it acts on); the whole (a Dynamo
    artifact's guards and summary) is decoded when first read. A copy whose header decodes but whose
    whole does not is read from python_code's literals instead."""
    from precompile.artifact import pair
    from precompile.artifact.pair import read_python_code

    decoded = []
    decode = pair.decode_metadata
    monkeypatch.setattr(pair, "decode_metadata", lambda *args: decoded.append(1) or decode(*args))
    artifact, cache = _copy(captured["mlp_batchnorm"], tmp_path)
    parsed = read_python_code(artifact).metadata
    runnable = precompile.load(artifact, cache)
    assert runnable.bytecode_from_cache and "mlp" in repr(runnable).lower() and decoded == []
    assert runnable.metadata == parsed and runnable.metadata_from_cache and decoded == [1]
    fields, _ = _fields(cache)
    meta = msgspec.msgpack.decode(_stored(fields["metadata_msgpack"]))
    meta["INPUTS"] = "not a tuple of leaves"
    _forge(cache, metadata_fields=_sealed(msgspec.msgpack.encode(meta)))
    runnable = precompile.load(artifact, cache)
    assert runnable.bytecode_from_cache and runnable.metadata == parsed and not runnable.metadata_from_cache
    # A forged header it acted on: said when the whole is read (verify refuses the blob outright).
    meta["SERVING_MODE"] = "installed"
    _forge(cache, metadata_fields=_sealed(msgspec.msgpack.encode(meta)))
    runnable = precompile.load(artifact, cache)
    with pytest.warns(precompile.PrecompileWarning, match=r"serving mode 'installed'.*serving mode 'standalone'.*verify"):
        assert runnable.metadata == parsed


@pytest.mark.parametrize("name", ["mlp", "dynamo_break_eager"])
def test_caches_written_before_load_as_before(name, tmp_path, capsys, monkeypatch):
    """Format-1 caches without the blobs: load compiles and parses python_code; verify adds no line."""
    monkeypatch.syspath_prepend(str(FIXTURES.parent))  # dynamo_models, the captured module
    artifact, cache = _copy((FIXTURES / f"{name}.py", FIXTURES / f"{name}.cache"), tmp_path)
    if name.startswith("dynamo") and f"TORCH_VERSION = {torch.__version__!r}" not in artifact.read_text(encoding="utf-8"):
        pytest.skip(f"the fixture's guard state is tied to the torch it was captured with, not {torch.__version__}")
    fields, payload = _fields(cache)
    if "python_bytecode" in fields:  # fixtures/regenerate.py rewrote it since: as written before, without them
        for field in ("python_bytecode", "metadata_msgpack", "header_sha256"):
            fields.pop(field)
        fields["header_sha256"] = codec.header_digest(msgspec.msgpack.encode(fields))
        header = msgspec.msgpack.encode(fields)
        cache.write_bytes(codec.MAGIC + len(header).to_bytes(4, "little") + header + payload)
    runnable = precompile.load(artifact, cache)
    assert runnable.cache_used and not runnable.bytecode_from_cache and not runnable.metadata_from_cache
    rc, checks = _verify(capsys, artifact, cache)
    assert rc == 0 and "python_code bytecode" not in checks and "python_code typed metadata" not in checks


def test_capture_compiles_deterministically_whatever_the_process_holds():
    """The stored bytes are marshal version 2, which depends on no reference count: compiling the
    same text again, with the first code object alive, marshals to the same bytes."""
    source = "import math\n\ndef f(x, *, name='forward'):\n    return {'a': x, 'b': (1, 2.5, None)} if x in {'p', 'q'} else math.pi\n"
    keep = bytecode.compile_python_code(source, bytecode.code_filename("0" * 64))
    tree = ast.parse(source)
    assert bytecode.compiled_bytes(source, "0" * 64, tree) == bytecode.compiled_bytes(source, "0" * 64, tree)
    assert keep is not None


def test_unmarshalling_renames_every_code_object_and_nothing_else():
    """load unmarshals the stored bytes with the filename replaced (bytecode.renamed): every nested
    code object carries the real path, any path, and a string constant that holds the compiled-in
    filename within its text is left as it is."""
    import marshal
    import types

    digest = "ab" * 32
    placeholder = bytecode.code_filename(digest)
    source = f"MENTION = {'see ' + placeholder!r}\n\nclass C:\n    def m(self):\n        return lambda: 1\n"
    stored = bytecode.compiled_bytes(source, digest, ast.parse(source))
    for path in ("/srv/models/m.py", "/tmp/ünïcode ☃/m.py"):
        code, _ = marshal.loads(bytecode.renamed(stored, digest, path))
        seen = []

        def walk(code):
            seen.append(code.co_filename)
            for const in code.co_consts:
                if isinstance(const, types.CodeType):
                    walk(const)

        walk(code)
        assert len(seen) == 4 and set(seen) == {path}
        namespace: dict = {}
        exec(code, namespace)
        assert namespace["MENTION"] == "see " + placeholder


SERVE_INDUCTOR = r"""
import json, sys, torch
compiled = []
sys.addaudithook(lambda event, args: compiled.append(str(args[1])) if event == "compile" else None)
import precompile, dynamo_cases
runnable = precompile.load(sys.argv[1], sys.argv[2])
x = torch.arange(12.0).reshape(3, 4)
print(json.dumps({"close": torch.allclose(runnable(x), dynamo_cases.uses_global(x)), "bytecode": runnable.bytecode_from_cache,
                  "compiled": [name for name in compiled if name.startswith("<precompile subgraph") or name == sys.argv[1]]}))
"""


def test_inductor_output_modules_a_dynamo_artifact_carries_as_text_are_not_compiled_at_load(tmp_path, capsys):
    """A lowered subgraph's output module is a string in python_code that its driver compiled at
    load, a cost that grows with depth: the cache carries it compiled too, checked by verify."""
    import dynamo_cases
    import torch

    artifact, cache = tmp_path / "ind.py", tmp_path / "ind.cache"
    with precompile.capture(dynamo_cases.uses_global, artifact_path=artifact, cache_path=cache, backend="inductor") as cap:
        cap(torch.ones(3, 4))
    source = artifact.read_text(encoding="utf-8")
    assert len(bytecode.embedded_modules(ast.parse(source))) >= 1
    report = fresh_json(SERVE_INDUCTOR, str(artifact), str(cache), env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "kernels")})
    assert report == {"close": True, "bytecode": True, "compiled": []}
    rc, checks = _verify(capsys, artifact, cache)
    assert rc == 0 and checks["python_code bytecode"]["status"] == "ok"


SERVE_DYNAMO = r"""
import json, sys, torch
import precompile, dynamo_cases
runnable = precompile.load(sys.argv[1], sys.argv[2])
x = torch.arange(12.0).reshape(3, 4)
close = torch.allclose(runnable(x), dynamo_cases.uses_global(x))
print(json.dumps({"close": close, "bytecode": runnable.bytecode_from_cache, "metadata": runnable.metadata_from_cache,
                  "served_globals_bind": sorted({"SUMMARY", "GUARDS"} & set(type(runnable._forward).__call__.__globals__)),
                  "summary_frames": runnable.metadata.summary.frames}))
"""


@pytest.fixture(scope="module")
def dynamo_eager(tmp_path_factory):
    import dynamo_cases
    import torch

    directory = tmp_path_factory.mktemp("dynamo-eager")
    artifact, cache = directory / "d.py", directory / "d.cache"
    with precompile.capture(dynamo_cases.uses_global, artifact_path=artifact, cache_path=cache, backend="eager") as cap:
        cap(torch.ones(3, 4))
    return artifact, cache


def test_the_stored_bytecode_binds_every_name_python_code_binds(dynamo_eager, capsys):
    """Caches written before left SUMMARY and GUARDS out of the bytecode (no code names them), so a
    name computed at run time told the bytecode from python_code (issue 38, finding 4): the stored
    bytecode of a capture now compiles every statement, the served globals bind both, and verify
    compiles python_code and finds the same bytes."""
    artifact, cache = dynamo_eager
    fields, _ = _fields(cache)
    assert fields["python_bytecode"]["left_out"] == []
    report = fresh_json(SERVE_DYNAMO, str(artifact), str(cache))
    assert report["close"] and report["bytecode"] and report["metadata"]
    assert report["served_globals_bind"] == ["GUARDS", "SUMMARY"]
    assert report["summary_frames"] >= 1
    rc, checks = _verify(capsys, artifact, cache)
    assert rc == 0 and checks["python_code bytecode"]["status"] == "ok"
    assert main(["show", str(artifact), str(cache)]) == 0
    assert "leaving out" not in capsys.readouterr().out


@pytest.mark.parametrize("pair", ["dynamo", "makefx"])
def test_no_code_in_python_code_reads_a_literal_the_bytecode_leaves_out(pair, dynamo_eager, captured):
    """What bytecode.LEFT_OUT may hold: a name python_code's code never reads, by name or as a
    globals() key (the Dynamo driver reads its metadata literals through globals())."""
    artifact, _ = dynamo_eager if pair == "dynamo" else captured["mlp_batchnorm"]
    tree = ast.parse(artifact.read_text(encoding="utf-8"))
    for name in bytecode.LEFT_OUT:
        assigned = [s for s in tree.body if isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in s.targets)]
        read = [node for node in ast.walk(ast.Module(body=[s for s in tree.body if s not in assigned], type_ignores=[]))
                if (isinstance(node, ast.Name) and node.id == name) or (isinstance(node, ast.Constant) and node.value == name)]
        assert read == [], f"python_code's code reads {name}, which its stored bytecode leaves out"
        assert len(assigned) <= 1


def test_bytecode_that_leaves_out_other_statements_is_never_run(dynamo_eager, tmp_path, capsys):
    """A cache that says it left out a statement other than LEFT_OUT's (its bytes compiled to match,
    every hash sealed) is not run: load compiles python_code, verify names what was left out."""
    import marshal

    artifact, cache = _copy(dynamo_eager, tmp_path)
    fields, _ = _fields(cache)
    source = artifact.read_text(encoding="utf-8")
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()
    tree = ast.parse(source)
    for left_out in (["FRAMES"], ["SUMMARY", "SUMMARY"]):
        kept = ast.Module(body=[s for s in tree.body if not (isinstance(s, ast.Assign) and getattr(s.targets[0], "id", None) in left_out)],
                          type_ignores=[])
        code = bytecode.compile_python_code(kept, bytecode.code_filename(digest))
        forged = marshal.dumps((code, {}), bytecode.MARSHAL_VERSION)
        _forge(cache, bytecode_fields={**_sealed(forged), "left_out": left_out})
        runnable = precompile.load(artifact, cache)
        assert runnable.cache_used and runnable.metadata_from_cache and not runnable.bytecode_from_cache
        rc, checks = _verify(capsys, artifact, cache)
        assert rc == 1 and "only 'SUMMARY', 'GUARDS'" in checks["python_code bytecode"]["message"]
        assert main(["show", str(artifact), str(cache)]) == 0
        assert "may be left out, each once: load compiles python_code instead" in capsys.readouterr().out


def _compiled_blob(source: str, left_out: tuple[str, ...]):
    """A CompiledCode entry as capture seals one, for `source` compiled without `left_out`."""
    from precompile.artifact.envelope import CompiledCode

    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()
    data = bytecode.compiled_bytes(source, digest, ast.parse(source), left_out=left_out)
    sealed = _sealed(data)
    return digest, CompiledCode(code_hash=digest, magic=bytecode.magic(), filename=bytecode.code_filename(digest),
                                flags=bytecode.COMPILE_FLAGS, optimize=bytecode.OPTIMIZE, marshal_version=bytecode.MARSHAL_VERSION,
                                left_out=left_out, **sealed)


@pytest.mark.parametrize("reader", [
    "print(SUMMARY)", "x = globals()['SUMMARY']", "x = sys.modules[__name__].SUMMARY", "T = 'module text that says SUMMARY'",
    "SUMMARY = {'b': 2}", "def f():\n    global SUMMARY\n    return SUMMARY",
    "exec(b'print(SUMMARY)')", "exec('print(\\uff33UMMARY)')", "def f(*, SUMMARY=None, **k):\n    return SUMMARY\nf(**globals())",
    "match sys:\n    case object(SUMMARY=s):\n        pass",
])
def test_verify_refuses_bytecode_without_a_literal_python_code_names_elsewhere(reader):
    """Leaving SUMMARY out is only python_code compiled if nothing else in it names SUMMARY: capture
    then compiles it whole, and verify refuses bytecode that left it out anyway (load would run code
    that behaves otherwise than python_code)."""
    source = "import sys\nSUMMARY = {'a': 1}\n" + reader + "\n"
    tree = ast.parse(source)
    assert bytecode.left_out_literals(source, tree) == ()
    digest, compiled = _compiled_blob(source, ("SUMMARY",))
    assert "which python_code does not assign once as a literal or names elsewhere" in bytecode_check.bytecode_problem(source, digest, compiled, tree)
    digest, whole = _compiled_blob(source, ())
    assert bytecode_check.bytecode_problem(source, digest, whole, tree) is None


def test_verify_proves_bytecode_that_left_out_a_literal_nothing_names():
    source = "SUMMARY = {'frames': 1, 'kept': ('a', 'b')}\nFORWARD_NOTE = 'summary, lowercase, is another word'\n"
    tree = ast.parse(source)
    assert bytecode.left_out_literals(source, tree) == ("SUMMARY",)
    digest, compiled = _compiled_blob(source, ("SUMMARY",))
    assert bytecode_check.bytecode_problem(source, digest, compiled, tree) is None
    digest, whole = _compiled_blob(source, ())  # a cache written before left_out existed
    assert bytecode_check.bytecode_problem(source, digest, whole, tree) is None


def test_what_a_forged_blob_says_reaches_the_terminal_escaped(dynamo_eager, tmp_path, capsys):
    """A name in the cache is shown, never interpreted: escape sequences, line breaks and
    bidirectional overrides in it are written as escapes by show and verify."""
    artifact, cache = _copy(dynamo_eager, tmp_path)
    hostile = "\x1b[2J\nverdict: all checks ok\u202e"
    _forge(cache, bytecode_fields={"left_out": [hostile], "filename": hostile})
    assert main(["show", str(artifact), str(cache)]) == 0
    shown = capsys.readouterr().out
    assert main(["verify", str(artifact), str(cache)]) == 1
    verified = capsys.readouterr().out
    for out in (shown, verified):
        assert "\x1b" not in out and "\u202e" not in out and "\nverdict: all checks ok" not in out
    assert "\\x1b[2J\\x0averdict: all checks ok\\u202e" in shown


@pytest.mark.parametrize(("source", "left_out"), [
    ("SUMMARY = {'a': 1}\nGUARDS = ({'checks': ('x',)},)\n", ("SUMMARY", "GUARDS")),
    ("SUMMARY = {'note': 'see GUARDS'}\nGUARDS = ({'checks': ('x',)},)\n", ("SUMMARY",)),
    ("SUMMARY = {'note': '\\x47UARDS'}\nGUARDS = ({'checks': ('x',)},)\n", ("SUMMARY",)),
    ("SUMMARY = {'a': 1}\nGUARDS = ({'checks': ('\\x53UMMARY',)},)\n", ("GUARDS",)),
    ("SUMMARY = {'note': '\\uff27UARDS'}\nGUARDS = ({'checks': (b'\\x53UMMARY',)},)\n", ()),
])
def test_each_literal_left_out_is_proved_on_its_own(source, left_out):
    """SUMMARY and GUARDS are proved in one walk of python_code: a literal that names the other (in its
    text or only in a constant's value: an escape, a bytes constant, a character NFKC folds to ASCII)
    keeps the other in the bytecode, and leaves itself out if nothing else names it."""
    assert bytecode.left_out_literals(source, ast.parse(source)) == left_out


@pytest.mark.parametrize("source", [
    "SUMMARY = {'a': 1}; x = [*(lambda **k: k)(SUMMARY=0)][0]\n",  # a keyword argument, on the literal's line
    "SUMMARY = {'a': 1}; from os import SUMMARY as path\n",  # an imported name, on the literal's line
    "SUMMARY = {'a': 1}; import os as SUMMARY\n",  # an alias
    "SUMMARY = {'a': 1}\nx = eval(b'\\xef\\xbc\\xb3UMMARY')\n",  # UTF-8 bytes that fold to the name
])
def test_verify_refuses_a_literal_read_by_any_identifier_or_utf8_bytes(source):
    """Every identifier a statement spells counts, not only names and attributes, and a bytes constant
    is read as UTF-8 too (helper-20: each of these loaded the cache's bytecode, which lacks SUMMARY)."""
    tree = ast.parse(source)
    assert bytecode.left_out_literals(source, tree) == ()
    digest, compiled = _compiled_blob(source, ("SUMMARY",))
    assert "which python_code does not assign once as a literal or names elsewhere" in bytecode_check.bytecode_problem(source, digest, compiled, tree)


def test_the_literal_s_lines_are_the_compiler_s():
    """A line separator that is no line break to the compiler (\\x85 here) does not shift which lines
    hold the literal: the literal is left out, nothing else named it."""
    source = "x = '\x85'\nSUMMARY = {'a': 1}\n"
    assert bytecode.left_out_literals(source, ast.parse(source)) == ("SUMMARY",)


@pytest.mark.parametrize("value", ["{'a': (X := 5)}", "{'a': 1 / 0}", "{'a': print('side effect')}", "{'a': globals().update(Y=7)}"])
def test_a_summary_whose_value_is_not_a_plain_literal_is_compiled(value):
    """Leaving the statement out must skip nothing but binding the name: a value with a call, an
    operator or an assignment in it is compiled with the rest."""
    source = f"SUMMARY = {value}\nNOTE = 1\n"
    assert bytecode.left_out_literals(source, ast.parse(source)) == ()
    plain = "SUMMARY = {'frames': -1, 'kept': (('a', 2.5), None, True), 'set': {1}}\n"
    assert bytecode.left_out_literals(plain, ast.parse(plain)) == ("SUMMARY",)


def test_the_cli_escapes_artifact_text_in_its_errors_and_what_a_terminal_would_hide(capsys, tmp_path):
    """Errors the CLI prints quote files (a path here), and separators or invisible characters in
    what an artifact says are shown as escapes, not acted on or hidden."""
    from precompile.inspect.render.terminal_text import printable

    assert printable("a\u2028b\u200bc\ufeffd\u061ce\x9bf") == "a\\u2028b\\u200bc\\ufeffd\\u061ce\\x9bf"
    hostile = tmp_path / "m\x1b]0;pwned\x07.py"
    assert main(["verify", str(hostile), str(tmp_path / "m.cache")]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\\x1b]0;pwned\\x07" in err


def test_python_code_stored_a_part_at_a_time_serves_from_its_parts_and_verify_proves_them(tmp_path, monkeypatch, capsys):
    """Big python_code is stored a part at a time (artifact/code_parts.py), so that verify proves it
    in the memory of a part: here every python_code is big. A fresh process runs the parts in turn,
    compiling nothing, and serves what eager computes; verify compiles the parts again and finds the
    same bytes; a cut moved by a hand edit is caught."""
    import dynamo_cases
    import torch

    from precompile.artifact import code_parts

    monkeypatch.setattr(code_parts, "WHOLE_MAX_CHARS", 1000)
    monkeypatch.setattr(code_parts, "PART_CHARS", 1000)
    artifact, cache = tmp_path / "d.py", tmp_path / "d.cache"
    with precompile.capture(dynamo_cases.uses_global, artifact_path=artifact, cache_path=cache, backend="eager") as cap:
        cap(torch.ones(3, 4))
    fields, _ = _fields(cache)
    assert fields["python_bytecode"]["flags"] & code_parts.PARTS and len(fields["python_bytecode"]["part_lines"]) >= 5
    report = fresh_json(SERVE_DYNAMO, str(artifact), str(cache))
    assert report["close"] and report["bytecode"] and report["metadata"]
    rc, checks = _verify(capsys, artifact, cache)
    assert rc == 0 and checks["python_code bytecode"]["status"] == "ok", checks
    lines = fields["python_bytecode"]["part_lines"]
    _forge(cache, bytecode_fields={"part_lines": [1, *(line + 1 for line in lines[1:])]})
    rc, checks = _verify(capsys, artifact, cache)
    assert rc == 1 and checks["python_code bytecode"]["status"] == "fail", checks
