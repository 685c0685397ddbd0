"""The pickle scan is sound: every hostile pickle is flagged, it names at least every import the real
unpickler performs, it flags whatever picklescan or fickling flag, and it stays bounded on junk."""
from __future__ import annotations

import base64
import io
import json
import pickle
import re
import subprocess
import sys
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from fickling.analysis import Severity, check_safety
from fickling.fickle import Pickled
from picklescan.scanner import SafetyLevel, scan_pickle_bytes

from property_budget import examples
from test_inspect_helpers import FIXTURES, ROOT, run_cli

from precompile.artifact.pickle_policy import DATA_ONLY, classify
from precompile.artifact.pickle_machine import MAX_NESTED_DEPTH, Machine, Shared
from precompile.artifact.pickle_scan import STOPS_AT_ONCE, is_pickle, scan_pickle

HOSTILE = FIXTURES / "hostile"
EXPECTED = json.loads((HOSTILE / "expected.json").read_text())
MARKER = "PRECOMPILE_POISON_MARKER"


def _fixture_pickles() -> dict[str, bytes]:
    """Every pickle the fixtures hold: bare files, zip members, and base64 blobs in python_code."""
    found: dict[str, bytes] = {}
    for path in sorted(FIXTURES.rglob("*")):
        name = str(path.relative_to(FIXTURES))
        if path.suffix == ".pkl" and path.parent != HOSTILE:  # the corpus is parametrized by EXPECTED
            found[name] = path.read_bytes()
        elif path.suffix == ".cache" and zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                for member in archive.namelist():
                    if member.endswith(".pkl"):
                        found[f"{name}:{member}"] = archive.read(member)
        elif path.suffix == ".py" and path.parent.name in ("v1", "damaged", "hostile"):
            for literal in re.findall(r"^_dynamo_state = \(\n((?:    '[^']*'\n)+)\)", path.read_text(), flags=re.M):
                found[f"{name}:_dynamo_state"] = base64.b64decode("".join(re.findall(r"'([^']*)'", literal)))
    return found


FIXTURE_PICKLES = _fixture_pickles()


def test_corpus_is_what_the_script_writes():
    sys.path.insert(0, str(HOSTILE))
    try:
        import make_hostile
    finally:
        sys.path.remove(str(HOSTILE))
    assert len(make_hostile.CORPUS) >= 30
    assert {p.stem for p in HOSTILE.glob("*.pkl")} == set(make_hostile.CORPUS)
    for name, (data, expect) in make_hostile.CORPUS.items():
        assert (HOSTILE / f"{name}.pkl").read_bytes() == data, name
        assert EXPECTED[name] == expect
    assert {data[1] for data, _ in make_hostile.CORPUS.values() if data[0] == 0x80} >= {2, 3, 4, 5}
    assert any(data[0] != 0x80 for data, _ in make_hostile.CORPUS.values())  # protocols 0 and 1 have no PROTO


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_hostile_pickle_is_flagged(name):
    scan = scan_pickle((HOSTILE / f"{name}.pkl").read_bytes(), member=name)
    expect = EXPECTED[name]
    if expect == "unresolved":
        assert any(imp.unresolved for imp in scan.dangerous), scan.imports
    else:
        assert expect in {f"{imp.module}.{imp.name}" for imp in scan.dangerous}, scan.imports
    assert all(imp.offset is not None and imp.opcode for imp in scan.dangerous)


def test_the_str_decoy_trick_is_unresolved_not_allowed():
    """The issue's trick: names built by builtins.str calls, decoy strings left on the stack."""
    scan = scan_pickle((HOSTILE / "p4_str_decoy.pkl").read_bytes(), member="x")
    assert [(imp.module, imp.name, imp.risk) for imp in scan.imports if imp.risk != "allowed"] == [
        ("<builtins.str(...)>", "<builtins.str(...)>", "dangerous")
    ]
    assert "torch.load" not in {f"{imp.module}.{imp.name}" for imp in scan.imports}


def test_nested_findings_say_where_they_sit():
    scan = scan_pickle((HOSTILE / "p4_doubly_nested.pkl").read_bytes(), member="x")
    (imp,) = scan.dangerous
    assert (imp.module, imp.name) == ("os", "system")
    assert imp.within.count("pickle inside the BINBYTES at offset") == 2
    assert scan.nested == 2


@pytest.mark.parametrize(
    ("module", "name", "risk"),
    [
        ("torch.fx.graph_module", "reduce_graph_module", "dangerous"), ("torch", "load", "dangerous"),
        ("torch.serialization", "_load_from_bytes", "dangerous"), ("torch.storage", "_load_from_bytes", "dangerous"),
        ("builtins", "__import__", "dangerous"), ("builtins", "print", "dangerous"), ("importlib", "import_module", "dangerous"),
        ("pickle", "loads", "dangerous"), ("_pickle", "loads", "dangerous"), ("numpy", "load", "dangerous"),
        ("shlex", "os.system", "dangerous"), ("collections", "OrderedDict.__class__", "dangerous"),
        ("torch._utils", "_rebuild_parameter", "allowed"), ("torch.serialization", "_get_layout", "allowed"),
        ("torch", "float32", "allowed"), ("builtins", "frozenset", "allowed"), ("copyreg", "_reconstructor", "allowed"),
        ("torch._dynamo.guards", "GuardsState", "unknown"), ("torch.nn.modules.linear", "Linear", "unknown"),
    ],
)
def test_allowlist_is_explicit(module, name, risk):
    assert classify(module, name) == risk


class _Stub:
    """Stands for whatever an import would return: callable, settable, never does anything."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Stub()

    def __setstate__(self, state):
        pass

    def append(self, value):
        pass

    def extend(self, values):
        pass

    def __setitem__(self, key, value):
        pass


class _RecordingUnpickler(pickle.Unpickler):
    """The real unpickler, whose find_class records the import and returns a stub (real only for the
    str/bytes builders, so the str-decoy trick goes as far as it would)."""

    REAL = {("builtins", n): getattr(__builtins__ if isinstance(__builtins__, dict) else __builtins__, n, None)
            for n in ("str", "bytes", "int", "tuple", "list", "dict")}

    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data), buffers=iter([bytearray(b"buffer")] * 8))
        self.imports: list[tuple[str, str]] = []

    def find_class(self, module, name):
        if self.proto < 3:
            import _compat_pickle

            module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        self.imports.append((module, name))
        real = self.REAL.get((module, name))
        return real if real is not None else type(name.replace(".", "_"), (_Stub,), {})

    def persistent_load(self, pid):
        return _Stub()


def _real_imports(data: bytes) -> list[tuple[str, str]]:
    unpickler = _RecordingUnpickler(data)
    try:
        unpickler.load()
    except Exception:  # noqa: BLE001 - the unpickler stops where the pickle is broken; what it imported before counts
        pass
    return unpickler.imports


@pytest.mark.parametrize("name", sorted(EXPECTED) + sorted(FIXTURE_PICKLES))
def test_scan_names_every_import_the_unpickler_performs(name):
    data = (HOSTILE / f"{name}.pkl").read_bytes() if name in EXPECTED else FIXTURE_PICKLES[name]
    scan = scan_pickle(data, member=name)
    top_level = {(imp.module, imp.name) for imp in scan.imports if imp.within is None}
    dotted = {(imp.module, imp.name.split(".")[0]) for imp in scan.imports if imp.within is None}
    unresolved = any(imp.unresolved and imp.within is None for imp in scan.imports)
    for module, attr in _real_imports(data):
        if (module, attr) == ("builtins", "getattr"):
            continue  # judged by use: recorded as the dotted names it reaches, or flagged itself
        assert (module, attr) in top_level | dotted or unresolved, (module, attr, scan.imports)


@pytest.mark.parametrize("name", sorted(EXPECTED) + sorted(FIXTURE_PICKLES))
def test_differential_with_picklescan_and_fickling(name):
    """Whatever either of them flags, ours flags too. Flagging is judged per pickle: picklescan's
    "Dangerous" (or its scan error) needs a dangerous finding or a problem here (its names can be decoys:
    it pairs the last strings seen); fickling's verdict above LIKELY_SAFE (or its failure) needs an
    import off the data-only list or a problem here."""
    data = (HOSTILE / f"{name}.pkl").read_bytes() if name in EXPECTED else FIXTURE_PICKLES[name]
    ours = scan_pickle(data, member=name)
    result = scan_pickle_bytes(io.BytesIO(data), name)
    dangerous = {(g.module, g.name) for g in result.globals if g.safety == SafetyLevel.Dangerous}
    if dangerous or result.scan_err:
        assert ours.dangerous or ours.problem, (dangerous, ours.imports)
    try:
        results = check_safety(Pickled.load(data)).results
        fickling_flags = [str(r) for r in results if r.severity >= Severity.LIKELY_UNSAFE and not _data_only(r)]
    except Exception as exc:  # noqa: BLE001 - fickling cannot follow it (EXT codes, out-of-band buffers): that is its flag
        fickling_flags = [repr(exc)]
    if fickling_flags:
        assert ours.flagged or ours.problem, (fickling_flags, ours.imports)


def _data_only(result) -> bool:
    """fickling calls every import outside the standard library unsafe, and every call of one; the
    reconstructors on our explicit data-only list (torch's tensor rebuilders...) are the deliberate
    exception, and only they."""
    trigger = result.trigger or ""
    if result.analysis_name == "NonStandardImports":
        match = re.fullmatch(r"from (\S+) import (\S+)", trigger)
        return bool(match) and match.groups() in DATA_ONLY
    if result.analysis_name == "OvertlyBadEval" and result.severity == Severity.LIKELY_UNSAFE:
        return trigger.split("(", 1)[0] in {name for _, name in DATA_ONLY}
    return False


def test_dynamo_fixtures_carry_nothing_dangerous():
    """The real opaque states: nothing dangerous anywhere; and as the opaque state load unpickles,
    every name is on the data-only list or reviewed as Dynamo's (or the captured model's) own."""
    from precompile.inspect.reading.reader import read_python_code

    states = [name for name in FIXTURE_PICKLES if name.endswith(":_dynamo_state") and "hostile" not in name]
    assert len(states) == 5  # dynamo_break, _eager, _installed, _rows, _rows_risky (_lowered pickles nothing)
    for name in states:
        scan = scan_pickle(FIXTURE_PICKLES[name], member=name)
        assert scan.problem is None and scan.dangerous == (), (name, scan.dangerous)
        assert scan.nested >= 1
        assert ("torch._dynamo.guards", "GuardsState") in {(i.module, i.name) for i in scan.imports}
        info, _ = read_python_code(str(FIXTURES / name.split(":")[0]))
        (state,) = info.pickles
        assert state.unpickled_by_load and state.findings == () and info.opaque_problems == (), (name, state.findings)


def test_malformed_and_huge_inputs_end_with_a_problem():
    for data in (b"", b"\x80", b"\x80\x04\x95", b"(((((", b"\x80\x04" + b"h\x00", b"\x80\x02cos\nsystem\n" + b"\xff",
                 b"\x80\x04" + b"N" * 10 + b"t.", b"\x80\x04\x8c\x02os\x8c\x02os\x93" + b"R."):
        scan = scan_pickle(data, member="x")
        assert scan.problem is not None, data
    scan = scan_pickle(b"\x80\x02cos\nsystem\n\xff", member="x")
    assert ("os", "system", "dangerous") in {(i.module, i.name, i.risk) for i in scan.imports}  # kept past the break
    many = b"\x80\x04" + b"]" + b"(" + b"K\x01" * 3_000_000 + b"e."
    scan = scan_pickle(many, member="x")
    assert "opcodes" in scan.problem


def test_nested_budget_is_shared(monkeypatch):
    """A pickle holding many large bytes values is scanned in bounded work: the nested budget is one
    for the whole scan, so repeating the value never multiplies the work."""
    monkeypatch.setattr("precompile.artifact.pickle_machine.MAX_NESTED_BYTES", 10_000)
    inner = pickle.dumps([b"x" * 1000], protocol=4)
    outer = pickle.dumps([inner + bytes([i]) for i in range(100)], protocol=4)
    scan = scan_pickle(outer, member="x")
    assert 1 <= scan.nested <= 10
    assert "past the nested-scan limits" in scan.problem  # not scanned means not vouched for


# ---- the hostile Dynamo artifact: its opaque state calls os.system --------------------------------

def test_hostile_artifact_really_calls_os_system(tmp_path):
    """The tests below mean something: the blob, unpickled, runs the shell command."""
    source = (HOSTILE / "dynamo_os_system.py").read_text()
    data = FIXTURE_PICKLES["hostile/dynamo_os_system.py:_dynamo_state"]
    assert b"os" in data and b"system" in data
    code = "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"
    subprocess.run([sys.executable, "-c", code], input=data, cwd=tmp_path, capture_output=True, timeout=30)
    assert (tmp_path / MARKER).exists()
    assert "_dynamo_state = (" in source


def test_hostile_artifact_is_flagged_by_show_guards_verify(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    path = "fixtures/hostile/dynamo_os_system"
    rc, out, err = run_cli(capsys, ["show", path])
    assert rc == 1 and "Traceback" not in err
    assert "pairs: yes" in out
    assert "os.system  FLAGGED: dangerous" in out
    assert "python_code section opaque-state: _dynamo_state (line 297) would import os.system at opcode offset 23" in err
    rc, out, err = run_cli(capsys, ["guards", path])
    assert rc == 1 and "would import os.system at opcode offset 23 (STACK_GLOBAL)" in out + err
    rc, out, err = run_cli(capsys, ["verify", "-v", path])
    assert rc == 1
    assert "FAIL  opaque pickle: python_code section opaque-state: _dynamo_state (line 297) would import os.system" in out
    assert "os.system at opcode offset 23" in out
    rc, out, err = run_cli(capsys, ["verify", "-v", "--json", path])
    report = json.loads(out)
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert [c["actual"] for c in failed] == ["os.system at opcode offset 23"]
    assert not (ROOT / MARKER).exists()


def test_huge_literals_stay_summaries():
    big = pickle.dumps({"n": 1 << 200_000, 1 << 100_000: "k"}, protocol=4)
    scan = scan_pickle(big, member="x")
    assert scan.problem is None
    assert "int (200001 bits)" in {f.summary for f in scan.fields}


def test_mutated_corpus_never_raises():
    import random

    rng = random.Random(10)
    corpus = [(HOSTILE / f"{name}.pkl").read_bytes() for name in sorted(EXPECTED)]
    for _ in range(1500):
        data = bytearray(rng.choice(corpus))
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        scan_pickle(bytes(data), member="x")


@pytest.mark.parametrize("name", ["p4_stack_global_literal", "p0_global_os_system"])
def test_verify_scans_pickles_in_the_kernel_bundle(name, capsys, tmp_path):
    """A cache whose bundle carries a pickle (a compiler cache entry) of any protocol gets it scanned by verify."""
    import hashlib
    import shutil

    import msgspec

    from precompile.artifact.codec import build_bundle, decode_header, encode_cache

    shutil.copy(FIXTURES / "v1/mlp.py", tmp_path / "b.py")
    envelope, _ = decode_header((FIXTURES / "v1/mlp.cache").read_bytes())
    evil = (HOSTILE / f"{name}.pkl").read_bytes()
    # a kind capture never bundles (an Inductor fxgraph entry) is refused when the cache is decoded; a
    # Triton file may have any name, so one that is a pickle is scanned
    bundle, payload = build_bundle({"triton/0/abc/entry.pkl": ("triton", evil)}, dict(envelope.bundle.keys) if envelope.bundle else {})
    envelope = msgspec.structs.replace(envelope, bundle=bundle,
                                       code_hash=hashlib.sha256((tmp_path / "b.py").read_bytes()).hexdigest())
    (tmp_path / "b.cache").write_bytes(encode_cache(envelope, payload))
    rc, out, err = run_cli(capsys, ["verify", "-v", str(tmp_path / "b")])
    assert rc == 1
    assert "FAIL  bundle pickle: cache" in out and "bundle file triton/0/abc/entry.pkl would import os.system at opcode offset" in out


@pytest.mark.parametrize("spelling", ["spaced", "urlsafe", "bytes"])
def test_opaque_blob_spellings_the_driver_could_decode_are_scanned(spelling, capsys, tmp_path):
    """A blob hidden from a strict base64 check (a space, URL-safe letters) or kept as bytes is scanned."""
    evil = (HOSTILE / "p4_stack_global_literal.pkl").read_bytes()
    literal = {
        "spaced": repr(" " + base64.b64encode(evil).decode()),
        "urlsafe": repr(base64.urlsafe_b64encode(evil).decode()),
        "bytes": repr(evil),
    }[spelling]
    source = (FIXTURES / "v1/mlp.py").read_text() + f"\n_hidden = {literal}\n"
    (tmp_path / "h.py").write_text(source)
    rc, out, err = run_cli(capsys, ["show", str(tmp_path / "h.py"), str(FIXTURES / "v1/mlp.cache")])
    assert "_hidden" in out and "os.system  FLAGGED: dangerous" in out
    assert "would import os.system at opcode offset" in err


# ---- the opcode reader agrees with the C unpickler on every text argument -------------------------

_TEXT_PIECES = [b"0", b"1", b"7", b"8", b"x", b"X", b"b", b"o", b"L", b"_", b" ", b"\t", b"\v", b"+", b"-", b"\x00",
                b"f", b"e", b".", b"inf", b"nan", b"'", b'"', b"\\x41", b"\\"]


def _c_unpickler(data: bytes):
    """What CPython's C unpickler makes of a pickle of literals only (nothing here can import)."""
    try:
        return ("ok", repr(pickle.loads(data)))
    except Exception:  # noqa: BLE001 - any refusal is one outcome
        return ("error",)


def _read_ops_outcome(data: bytes):
    from precompile.artifact.pickle_ops import read_ops

    try:
        ops = list(read_ops(data))
    except ValueError:
        return ("error",)
    return ("ok", repr(ops[0][1]))


@pytest.mark.parametrize("opcode", [b"I", b"L", b"F", b"S"])
def test_text_arguments_are_read_as_the_c_unpickler_reads_them(opcode):
    """INT and LONG are strtol/PyLong_FromString base 0 to the C unpickler (`I0x10` is 16, `L-0x10L`
    is -16, `I7\\0junk` is 7): a reader that refuses one stops a scan where the unpickler goes on."""
    import random

    rng = random.Random(opcode[0])
    for _ in range(3000):
        body = b"".join(rng.choice(_TEXT_PIECES) for _ in range(rng.randrange(0, 6)))
        data = opcode + body + b"\n."
        assert _read_ops_outcome(data) == _c_unpickler(data), data


def test_memo_indexes_are_read_as_the_c_unpickler_reads_them():
    """GET and PUT are PyLong_FromString base 10 to the C unpickler (up to a NUL, spaces and underscores allowed)."""
    import random

    rng = random.Random(7)
    for _ in range(2000):
        index = b"".join(rng.choice([b"0", b"1", b" ", b"_", b"+", b"-", b"\x00", b"x"]) for _ in range(rng.randrange(0, 4)))
        data = b"N" + b"p" + index + b"\n" + b"0" + b"g" + index + b"\n."
        assert (scan_pickle(data, member="x").problem is None) == (_c_unpickler(data)[0] == "ok"), data


# ---- protocol 0 and 1 pickles are told by content in every container -------------------------------


_HOSTILE_TAILS = [b"os\nsystem\n", b"cos\nsystem\n(S'ls'\ntR.", b"(cos\nsystem\nS'ls'\ntR.", b"\x8c\x02os\x8c\x06system\x93.",
                  pickle.dumps(print, protocol=0), pickle.dumps(print, protocol=2)[2:], pickle.dumps(print, protocol=4)[2:]]


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.sampled_from(sorted(STOPS_AT_ONCE)), rest=st.one_of(st.binary(max_size=64), st.sampled_from(_HOSTILE_TAILS)))
def test_a_stream_whose_first_opcode_needs_what_is_not_there_is_told_no_pickle_as_the_machine_runs_it(first, rest):
    """is_pickle tells text starting with such an opcode (`entry 3: ...` starts with APPENDS) no
    pickle without running the machine: the machine, run, stops there having imported nothing."""
    data = bytes([first]) + rest
    machine = Machine(data, Shared(), MAX_NESTED_DEPTH, None)
    machine.run()
    assert not machine.imports and not machine.incomplete and not machine.refs
    assert not is_pickle(data)


def test_inst_is_run_first_in_a_stream_as_pickle_py_imports_its_class_before_it_looks_for_the_mark():
    assert ord("i") not in STOPS_AT_ONCE and is_pickle(b"ios\nsystem\n")


def test_protocol_0_pickle_in_a_mega_cache_entry_is_scanned(capsys, monkeypatch):
    """`cos\\nsystem\\n(S'...'\\ntR.` is valid UTF-8: sniffed as text, torch.compiler.load_cache_artifacts
    would still unpickle it."""
    monkeypatch.chdir(ROOT)
    rc, out, err = run_cli(capsys, ["show", "fixtures/hostile/mega_cache_p0_entry.bin"])
    assert rc == 1 and "Traceback" not in err
    assert "inductor evil  pickle" in out and "os.system  FLAGGED: dangerous" in out
    assert "1 pickle (inductor/evil) would import os.system" in err
    assert "aot_autograd harmless  text" in out  # a protocol 0 pickle of plain data does nothing: not one


@pytest.mark.parametrize("name", ["p0_global_os_system", "p1_global_posix_system", "p0_inst_os_system"])
@pytest.mark.parametrize("suffix", [".pkl", ".py", ""])
def test_bare_protocol_0_and_1_pickles_are_pickles_whatever_their_name(name, suffix, capsys, tmp_path):
    """Alone, a protocol 0/1 pickle was taken for python_code ("not valid Python") and never scanned."""
    path = tmp_path / f"blob{suffix}"
    path.write_bytes((HOSTILE / f"{name}.pkl").read_bytes())
    rc, out, err = run_cli(capsys, ["show", str(path)])
    assert rc == 1 and "not valid Python" not in err
    assert f"{EXPECTED[name]}  FLAGGED: dangerous" in out


@pytest.mark.parametrize("spelling", ["protocol0_text", "protocol0_bytes"])
def test_protocol_0_pickle_literals_in_python_code_are_scanned(spelling, capsys, tmp_path):
    inner = (HOSTILE / "p0_global_os_system.pkl").read_bytes()
    literal = repr(inner.decode("ascii")) if spelling == "protocol0_text" else repr(inner)
    (tmp_path / "h.py").write_text((FIXTURES / "v1/mlp.py").read_text() + f"\n_hidden = {literal}\n")
    rc, out, err = run_cli(capsys, ["show", str(tmp_path / "h.py"), str(FIXTURES / "v1/mlp.cache")])
    assert rc == 1 and "_hidden" in out and "os.system  FLAGGED: dangerous" in out


# ---- a scan that cannot finish is a finding, never a note -----------------------------------------

UNFINISHED = b"\x80\x04" + b"N" * 10 + b"t."  # TUPLE without a MARK: the scan stops, nothing imported yet


def _mega_cache(entries: list[tuple[str, str, bytes]]) -> bytes:
    sys.path.insert(0, str(HOSTILE))
    try:
        from make_hostile import mega_cache
    finally:
        sys.path.remove(str(HOSTILE))
    return mega_cache(entries)


def test_an_unfinished_scan_in_a_mega_cache_entry_or_bare_pickle_fails_show(capsys, tmp_path):
    (tmp_path / "mc.bin").write_bytes(_mega_cache([("inductor", "broken", UNFINISHED)]))
    (tmp_path / "bare.pkl").write_bytes(UNFINISHED)
    for name in ("mc.bin", "bare.pkl"):
        rc, out, err = run_cli(capsys, ["show", str(tmp_path / name)])
        assert rc == 1 and "could not be scanned to its end (scan stopped: MARK missing)" in err, (name, err)


def test_the_scan_limit_is_a_finding_not_a_note(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("precompile.artifact.pickle_machine.MAX_OPS", 50)
    (tmp_path / "mc.bin").write_bytes(_mega_cache([("inductor", "long", pickle.dumps(list(range(100)), protocol=0))]))
    rc, out, err = run_cli(capsys, ["show", str(tmp_path / "mc.bin")])
    assert rc == 1 and "more than 50 opcodes" in err


def _upstream_pair_with_artifact(tmp_path, artifact: bytes) -> str:
    """fixtures/upstream/inductor with its cache's `artifact` Mega-Cache replaced (the code_hash kept)."""
    import shutil

    from precompile.inspect.formats.pickle_values import pickle_value

    source = FIXTURES / "upstream/inductor.cache"
    with zipfile.ZipFile(source) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    envelope = pickle_value(members["archive/data.pkl"])
    members["archive/data.pkl"] = pickle.dumps({**envelope, "artifact": artifact}, protocol=2)
    with zipfile.ZipFile(tmp_path / "u.cache", "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    shutil.copy(FIXTURES / "upstream/inductor.py", tmp_path / "u.py")
    return str(tmp_path / "u")


@pytest.mark.parametrize("content", ["hostile", "unfinished"])
def test_verify_of_an_upstream_pair_fails_on_its_cache_pickles(content, capsys, tmp_path):
    """A cache read without a problem (an upstream pair) had its pickles listed by show but never
    checked by verify: a Mega-Cache entry calling os.system verified ok."""
    entry = (HOSTILE / "p0_global_os_system.pkl").read_bytes() if content == "hostile" else UNFINISHED
    pair = _upstream_pair_with_artifact(tmp_path, _mega_cache([("inductor", "entry", entry)]))
    rc, out, err = run_cli(capsys, ["verify", pair])
    assert rc == 1 and "FAIL  cache pickle: cache" in out
    assert ("would import os.system" if content == "hostile" else "could not be scanned to its end") in out


# ---- the opaque state is found by load's own rule, and only its canonical spelling passes ----------

def _with_state(assignment: str) -> str:
    """The hostile artifact's python_code with its `_dynamo_state = (...)` replaced by `assignment`."""
    source = (HOSTILE / "dynamo_os_system.py").read_text()
    return re.sub(r"^_dynamo_state = \(\n(?:    '[^']*'\n)+\)\n", lambda _: assignment + "\n", source, count=1, flags=re.M)


def _all_verbs(capsys, path) -> dict[str, tuple[int, str]]:
    return {verb: (lambda r: (r[0], r[1] + r[2]))(run_cli(capsys, [verb, str(path)])) for verb in ("show", "guards", "verify")}


@pytest.mark.parametrize(("name", "expect"), [
    ("dynamo_state_bytes", "_dynamo_state (line 296) is not in the canonical form, cannot be scanned"),
    ("dynamo_state_concat", "_dynamo_state (line 296) is not in the canonical form, cannot be scanned"),
    ("dynamo_state_protocol0", "_dynamo_state (line 297) would import os.system at opcode offset 0 (GLOBAL)"),
])
def test_hostile_state_spellings_fail_show_guards_verify(name, expect, capsys):
    """Each spelling the driver decoded (bytes, a sum of literals, a protocol 0 pickle) went unscanned:
    verify said ok and load ran the payload."""
    for verb, (rc, text) in _all_verbs(capsys, HOSTILE / name).items():
        assert rc == 1 and expect in text and "Traceback" not in text, (verb, text[-2000:])


STATE_LITERAL = "'" + base64.b64encode((HOSTILE / "p4_stack_global_literal.pkl").read_bytes()).decode() + "'"


@pytest.mark.parametrize("assignment", [
    f"_dynamo_state = {STATE_LITERAL}\n_dynamo_state = None",
    f"_dynamo_state = None\n_dynamo_state += {STATE_LITERAL}",
    f"_dynamo_state: str = {STATE_LITERAL}",
    f"_dynamo_state = str({STATE_LITERAL})",
    f"_dynamo_state = None\nif True:\n    _dynamo_state = {STATE_LITERAL}",
    f"_dynamo_state = None\ndef _f():\n    global _dynamo_state\n    _dynamo_state = {STATE_LITERAL}\n_f()",
    f"_dynamo_state = None\nglobals()['_dynamo_state'] = {STATE_LITERAL}",
    f"_dynamo_state = None\nglobals().update(_dynamo_state={STATE_LITERAL})",
    f"_dynamo_state = None\nexec(\"_dynamo_state = {STATE_LITERAL}\")",
    f"_dynamo_state = None\nfor _dynamo_state in [{STATE_LITERAL}]:\n    pass",
    "_dynamo_state = None\nimport os as _dynamo_state",
])
def test_any_other_spelling_of_the_state_is_a_finding(assignment, capsys, tmp_path):
    (tmp_path / "a.py").write_text(_with_state(assignment))
    rc, out, err = run_cli(capsys, ["show", str(tmp_path / "a.py")])
    assert rc == 1 and "is not in the canonical form, cannot be scanned" in err, err


def test_an_opaque_state_the_scan_cannot_finish_is_reported_and_fails_every_verb(capsys, tmp_path):
    """Such a state disappeared from the report (no imports, no top level): verify said nothing."""
    _write_pair(tmp_path, _with_state(f"_dynamo_state = {base64.b64encode(UNFINISHED).decode()!r}"))
    for verb, (rc, text) in _all_verbs(capsys, tmp_path / "a").items():
        assert rc == 1 and "could not be scanned to its end (scan stopped: MARK missing)" in text, (verb, text[-2000:])


def _write_pair(tmp_path, source: str) -> None:
    """`source` as a.py beside a copy of the hostile cache whose code_hash is re-pointed at it."""
    import hashlib

    import msgspec

    from precompile.artifact.codec import decode_header, encode_cache

    (tmp_path / "a.py").write_text(source)
    cache = (HOSTILE / "dynamo_os_system.cache").read_bytes()
    envelope, offset = decode_header(cache)
    envelope = msgspec.structs.replace(envelope, code_hash=hashlib.sha256(source.encode()).hexdigest())
    (tmp_path / "a.cache").write_bytes(encode_cache(envelope, cache[offset:]))


def test_swapped_marshalled_bytecode_fails_verify(capsys):
    rc, out, err = run_cli(capsys, ["verify", "-v", str(HOSTILE / "dynamo_bytecode_swapped")])
    assert rc == 1
    assert "FAIL  opaque state: _dynamo_bytecode['1'] (line 1188) holds 790 bytes" in out
    assert "but is labelled 859 bytes, sha256 3c7270c7c6b802345290f407044b72192a7ac9088e829bedb8bbbf4d04856c69" in out
    assert "_dynamo_bytecode['2']" in out and "the marshalled code was swapped" in out


# ---- the driver and load are as strict as inspect -----------------------------------------------

def test_the_driver_refuses_an_opaque_state_that_is_not_a_str():
    import torch

    from precompile.codegen.drivers import dynamo as driver
    from precompile.errors import PrecompileError

    versions = {"PYTHON_VERSION": tuple(sys.version_info[:2]), "TORCH_VERSION": str(torch.__version__)}
    encoded = base64.b64encode(b"\x80\x04N.")
    for metadata, state in ((versions, encoded), ({**versions, "_dynamo_frames": ()}, encoded), (versions, None),
                            (versions, " " + encoded.decode())):
        with pytest.raises(PrecompileError, match="its opaque state is (a bytes|a NoneType|not strict base64)"):
            driver.build_forward(metadata, state, artifact="a.py")


def test_the_driver_checks_marshalled_code_against_its_label_before_marshal_loads():
    import hashlib
    import marshal

    from precompile.codegen.drivers import dynamo as driver
    from precompile.errors import PrecompileError
    from precompile.artifact.opaque_state import BYTECODE_SHA256

    data = marshal.dumps(compile("x = 1", "f", "exec"))
    metadata = {"_dynamo_bytecode": {"0": base64.b64encode(data).decode()}, BYTECODE_SHA256: {"0": hashlib.sha256(data).hexdigest()}}
    assert driver._code_object(metadata, "0", "f.py", "a.py").co_filename == "f.py"
    metadata[BYTECODE_SHA256] = {"0": "0" * 64}
    with pytest.raises(PrecompileError, match="its marshalled code '0' has sha256 .* but python_code labels it 0{64}: the code was swapped"):
        driver._code_object(metadata, "0", "f.py", "a.py")
    metadata["_dynamo_bytecode"] = {"0": base64.b64encode(data)}
    with pytest.raises(PrecompileError, match="its marshalled code '0' is a bytes"):
        driver._code_object(metadata, "0", "f.py", "a.py")


@pytest.mark.parametrize("name", ["dynamo_state_bytes", "dynamo_state_concat", "dynamo_bytecode_swapped"])
def test_load_refuses_opaque_parts_that_are_not_spelled_canonically_or_do_not_match_their_labels(name, tmp_path, monkeypatch):
    """Before anything runs, whatever driver the python_code carries (the fixtures' own checks nothing):
    the payload never executes, the swapped code never serves."""
    import ast

    from precompile.errors import PrecompileError
    from precompile.serve.load import execute

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(FIXTURES))  # dynamo_models, the captured code
    source = (HOSTILE / f"{name}.py").read_text()
    expect = "the marshalled code was swapped" if name == "dynamo_bytecode_swapped" else "is not in the canonical form"
    with pytest.raises(PrecompileError, match=expect):
        execute(source, str(HOSTILE / f"{name}.py"), tree=ast.parse(source))
    assert not (tmp_path / MARKER).exists()


# ---- whatever picklescan's and fickling's deny lists name, ours flags ------------------------------

def _deny_list_globals() -> list[tuple[str, str, str]]:
    """(tool, module, name) for every entry of picklescan's and fickling's deny lists, read from the
    installed tools; a module-wide entry stands for any name in it (two probes: public and private)."""
    from fickling.analysis import UnsafeImportsML
    from fickling.fickle import UNSAFE_IMPORTS
    from picklescan.scanner import _unsafe_globals

    probes = ("Anything", "_private_helper")
    found = []
    for module, names in _unsafe_globals.items():
        listed = probes if names == "*" else (names,) if isinstance(names, str) else sorted(names)
        found += [("picklescan", module, name) for name in listed]
    found += [("fickling", module, name) for module in sorted(UNSAFE_IMPORTS) for name in probes]
    found += [("fickling", module, name) for module in sorted(UnsafeImportsML.UNSAFE_MODULES) for name in probes]
    found += [("fickling", module, name) for module, names in UnsafeImportsML.UNSAFE_IMPORTS.items() for name in names]
    return found


# fickling's ML list blocks these whole packages; Dynamo's own opaque state is built from classes in
# them. Any name of theirs is flagged ("unknown", a finding in the opaque state) unless it is on the
# reviewed list of what Dynamo pickles; their doors to code (codecache, eval_frame, ...) are dangerous.
JUDGED_IN_CONTEXT = {"torch._dynamo", "torch._inductor"}


@pytest.mark.parametrize(("tool", "module", "name"), _deny_list_globals())
def test_every_global_on_their_deny_lists_is_flagged(tool, module, name):
    """A pickle that only imports the global (GLOBAL, then STOP) is enough for the unpickler to do it."""
    data = b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n."
    risks = {imp.risk for imp in scan_pickle(data, member="x").imports}
    expect = {"unknown"} if module in JUDGED_IN_CONTEXT else {"dangerous"}
    assert risks == expect, (tool, module, name, risks)


@pytest.mark.parametrize(("module", "name"), [
    ("pydoc", "pipepager"), ("uuid", "_get_command_stdout"), ("idlelib.calltip", "get_entity"), ("ensurepip", "_run_pip"),
    ("_osx_support", "_read_output"), ("imaplib", "IMAP4_stream"),
])
def test_stdlib_gadgets_that_run_commands_are_dangerous(module, name):
    """They were "unknown": listed, not a finding, though each runs a shell command given as data."""
    assert classify(module, name) == "dangerous"


def test_getattr_reaching_a_file_system_writer_is_dangerous():
    data = b"\x80\x04" + b"cbuiltins\ngetattr\n(cpathlib\nPath\nX\x0a\x00\x00\x00write_textt" + b"R."
    (imp,) = [imp for imp in scan_pickle(data, member="x").imports if imp.name != "Path"]
    assert (imp.module, imp.name, imp.risk) == ("pathlib", "Path.write_text", "dangerous")
    assert classify("pathlib", "PurePosixPath") == "allowed" and classify("pathlib", "Path") == "unknown"


def test_partial_is_judged_by_the_callable_it_binds():
    bound = b"\x80\x02cfunctools\npartial\n(ctorch._dynamo.guards\nGuardBuilder.TENSOR_MATCH\ntR."
    assert {(imp.name, imp.risk) for imp in scan_pickle(bound, member="x").imports} == {
        ("partial", "allowed"), ("GuardBuilder.TENSOR_MATCH", "unknown")}
    computed = b"\x80\x02cfunctools\npartial\n(cbuiltins\nstr\n(tRtR."
    assert any(imp.unresolved and imp.name == "partial" for imp in scan_pickle(computed, member="x").dangerous)


# ---- what load unpickles may import only what is data-only or reviewed -----------------------------

@pytest.mark.parametrize("gadget", [b"cevil_plugin\nGadget\n)\x81", b"ccollections\nChainMap\n)\x81",
                                    b"cnumpy\nndarray\n)\x81"])
def test_an_opaque_state_importing_anything_off_the_lists_fails_every_verb(gadget, capsys, tmp_path):
    """"unknown" was listed, not a finding, though load unpickles the opaque state and runs whatever
    class it names; elsewhere (a Mega-Cache entry) such a name stays "unknown"."""
    state = base64.b64encode(b"\x80\x02" + gadget + b".").decode()
    _write_pair(tmp_path, _with_state(f"_dynamo_state = {state!r}"))
    for verb, (rc, text) in _all_verbs(capsys, tmp_path / "a").items():
        assert rc == 1 and "if unpickled: neither on the data-only list nor reviewed as part of Dynamo's state" in text, (
            verb, text[-2000:])


def test_the_captured_models_own_classes_are_reviewed_in_its_opaque_state(capsys, tmp_path):
    state = base64.b64encode(b"\x80\x02cdynamo_models\nBreakingBlock\n)\x81.").decode()
    _write_pair(tmp_path, _with_state(f"_dynamo_state = {state!r}"))
    rc, out, err = run_cli(capsys, ["verify", "-v", str(tmp_path / "a")])
    assert rc == 0 and "each on the data-only list or reviewed as part of Dynamo's state" in out, out + err


def test_the_dispatch_table_runs_every_opcode_but_stop():
    import pickletools

    from precompile.artifact.pickle_machine import DISPATCH

    assert set(DISPATCH) == {op.name for op in pickletools.opcodes} - {"STOP"}


def test_the_driver_and_template_never_spell_the_opaque_names_but_as_reads():
    """python_code includes them verbatim: a string naming `_dynamo_state` there (an error message,
    a docstring) would make every artifact's state non-canonical, and load refuse it."""
    import ast

    from precompile.codegen.drivers import source_of
    from precompile.codegen.environment import render
    from precompile.artifact.opaque_state import BYTECODE, STATE, mentions

    calls = [render("dynamo.py.j2", what="", sections=[], guard_lists=flag).splitlines()[-1] for flag in (True, False)]
    for source in (source_of("dynamo"), source_of("dynamo_checks"), source_of("source_checks"), source_of("dynamo_guards"),
                   source_of("dynamo_subgraphs"),
                   *calls):
        assert mentions(ast.parse(source), (STATE, BYTECODE)) == {STATE: [], BYTECODE: []}


def test_an_opaque_state_that_is_not_strict_base64_is_a_finding(capsys, tmp_path):
    """The driver decodes strictly and refuses it; inspect says so rather than guessing a decoding."""
    (tmp_path / "a.py").write_text(_with_state(f"_dynamo_state = ' {STATE_LITERAL[1:]}"))  # a leading space
    rc, out, err = run_cli(capsys, ["show", str(tmp_path / "a.py")])
    assert rc == 1 and "_dynamo_state (line 296) is not strict base64" in err and "do not load this artifact" in err, err


def test_torch_modules_referenced_whole_are_reviewed_in_the_opaque_state_but_not_their_main():
    from precompile.artifact.pickle_policy import MODULE, dynamo_state_reviewed

    reviewed = dynamo_state_reviewed(frozenset())
    assert reviewed("torch.distributed", MODULE) and reviewed("torch", MODULE)
    assert not reviewed("torch.utils.bottleneck.__main__", MODULE) and not reviewed("os", MODULE)
    assert not reviewed("torchvision_evil", MODULE)


def test_a_module_the_metadata_names_reviews_no_torch_function_and_no_dangerous_name():
    """FN_MODULE, FRAMES and INLINED_SOURCES are literals the writer of python_code chooses: naming
    torch._inductor.cpp_builder there must not make its run_compile_cmd (a subprocess) reviewed."""
    from precompile.artifact.pickle_policy import dynamo_state_reviewed

    reviewed = dynamo_state_reviewed(frozenset({"torch._inductor.cpp_builder", "torch.nn.modules.linear", "mymodel",
                                                "mymodel.layers"}))
    assert not reviewed("torch._inductor.cpp_builder", "run_compile_cmd")
    assert not reviewed("torch.nn.modules.linear", "init") and reviewed("torch.nn.modules.linear", "Linear")
    assert not reviewed("mymodel", "eval") and not reviewed("mymodel.layers", "system")
    assert reviewed("mymodel", "Block") and reviewed("mymodel.layers", "Config")
    payload = (b"\x80\x04\x8c\x1btorch._inductor.cpp_builder\x94\x8c\x0frun_compile_cmd\x94\x93"
               b"\x8c\x05touch\x8c\x04/tmp\x86R.")
    scan = scan_pickle(payload, member="_dynamo_state", reviewed=reviewed)
    assert scan.findings and all(imp.module != "torch._inductor.cpp_builder" or imp.risk != "data" for imp in scan.imports)


def test_a_transformers_models_own_classes_and_torch_modules_whole_are_reviewed_in_its_opaque_state():
    """An installed Llama's state names its config's and outputs' classes (their code not inlined, so no
    FRAMES or INLINED_SOURCES entry names their modules) and torch.nn.modules.linear whole (a module
    whose code it inlined): load serves it, so verify must not call it hostile (issue 51, item 3).
    The package's dangerous names, its functions and torch's other classes stay findings."""
    from precompile.artifact.pickle_policy import MODULE, dynamo_state_reviewed

    reviewed = dynamo_state_reviewed(frozenset({"transformers.models.llama.modeling_llama", "torch.nn.modules.linear"}))
    assert reviewed("torch.nn.modules.linear", MODULE) and reviewed("torch.nn.modules.linear", "Linear")
    assert reviewed("transformers.modeling_outputs", "BaseModelOutputWithPast")
    assert reviewed("transformers.models.llama.configuration_llama", "LlamaConfig")
    assert not reviewed("transformers.utils.hub", "cached_file") and not reviewed("transformers.utils", "system")
    assert not reviewed("transformers.__main__", "Gadget") and not reviewed("transformers.x", "Cls.__reduce__")
    assert not reviewed("torch._inductor.cpp_builder", "CppBuilder") and not reviewed("torchvision.io", "VideoReader")
