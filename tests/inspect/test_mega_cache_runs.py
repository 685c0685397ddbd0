"""The fields of a Mega-Cache entry torch runs: a guard expression (eval'd when the entry is looked
up), an output stride (eval'd at load) and where cache_key sends the output module's file (written
and imported at load). Each is shown as what will run; anything torch itself would not write there
is a finding in show and verify --host, naming the entry, the field and the text, escaped. The
expressions are never evaluated here: a canary file they would touch must not appear."""
from __future__ import annotations

import json
import pickletools

import pytest

from test_inspect_helpers import ROOT, run_cli
from test_mega_cache_entries import GRAPH, P4, _blob, _global, _mega_cache, _text, code_hash

from precompile.inspect.formats.mega_cache import entry_contents

MODULE = "async_compile = AsyncCompile()\ndef call(args):\n    return args\n"
TORCH_GUARDS = [  # as ShapeGuardPythonPrinter writes them, joined by produce_guards_expression
    "2 <= L['t0'] and L['t0'] <= 4096",
    "L['t1'] == L['t0'] and L['t0'] % 2 == 0 and not (L['t2'] == 3)",
    "(L['t0'] // 8) % 4 != 0 or -L['t1'] + 2*L['t0'] >= math.floor(torch.sym_float(L['t0']) / 2)",
    "max(L['t0'], 1) <= min(L['t1'], 2**10) and abs(L['t0']) < math.inf and (1 if L['t0'] > 2 else 0) == 1",
]


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _graph(**fields: bytes) -> bytes:
    """A CompiledFxGraph as torch pickles it: NEWOBJ of the class, then a BUILD of these fields."""
    return P4 + GRAPH + b")\x81}(" + b"".join(_text(name) + value for name, value in fields.items()) + b"ub."


def _str(value: str) -> bytes:
    data = value.encode("utf-8", "surrogatepass")
    return b"X" + len(data).to_bytes(4, "little") + data  # BINUNICODE


def _module(source: str = MODULE) -> dict[str, bytes]:
    return {"cache_key": _str(code_hash(source)), "source_code": _str(source)}


def _show(capsys, tmp_path, content: bytes, kind: str = "inductor") -> tuple[int, str, str]:
    path = tmp_path / "mc.bin"
    path.write_bytes(_mega_cache([(kind, "k", content)]))
    return run_cli(capsys, ["show", str(path)])


def _replaced(content: bytes, old: str, new: str) -> bytes:
    """The pickle with every string `old` written as `new` (its frames dropped: they are optional)."""
    ops = list(pickletools.genops(content))
    out = b""
    for (op, arg, pos), following in zip(ops, [*ops[1:], (None, None, len(content))]):
        if op.name != "FRAME":
            out += _str(new) if arg == old and "UNICODE" in op.name else content[pos:following[2]]
    return out


def test_a_real_inductor_entry_whose_guard_expression_runs_code_is_a_finding(capsys, tmp_path):
    # The output module stays benign and the scan clean: only the guard torch evaluates at lookup changes.
    with open(_blob(tmp_path, "torch-2.13.0.bin"), "rb") as handle:
        entries = entry_contents(handle.read())
    canary = tmp_path / "CANARY"
    hostile = f"__import__('pathlib').Path({str(canary)!r}).touch() or 2 <= L['t0']  # \u202e"  # a comment is valid there
    guarded = next(i for i, (kind, _, content) in enumerate(entries) if kind == "inductor" and b"2 <= L['t0']" in content)
    kind, key, content = entries[guarded]
    old = next(arg for op, arg, _ in pickletools.genops(content) if isinstance(arg, str) and arg.startswith("2 <= L['t0']"))
    entries[guarded] = (kind, key, _replaced(content, old, hostile))
    path = tmp_path / "hostile.bin"
    path.write_bytes(_mega_cache(entries))
    rc, out, err = run_cli(capsys, ["show", str(path)])
    assert rc == 1, (out, err)
    finding = f"Mega-Cache inductor {key}: guards_expr (set at opcode offset "
    assert finding in out and finding in err and "verdict: 1 finding" in out
    line = next(line for line in out.splitlines() if finding in line)
    assert "is not a guard expression torch writes: a call of __import__('pathlib').Path(" in line
    assert line.endswith(f"it holds: {hostile[:-1]}\\u202e") and "\u202e" not in out + err  # escaped, as every renderer does
    assert "guard expression torch evaluates at lookup (guards_expr): 2 <= L['t0']" in out  # the other entries' own
    rc, out, err = run_cli(capsys, ["verify", "--host", str(path)])
    assert rc == 1 and f"FAIL  mega-cache code torch runs: {finding}" in out
    rc, out, _ = run_cli(capsys, ["verify", "--host", "--json", str(path)])
    runs = [check for check in json.loads(out)["checks"] if check["name"] == "mega-cache code torch runs"]
    assert [check["actual"] for check in runs] == ["guards_expr"] and runs[0]["status"] == "fail"
    assert not canary.exists()


def test_a_benign_blob_shows_its_guard_expressions_and_module_files_and_verify_host_counts_them(capsys, tmp_path):
    blob = _blob(tmp_path, "torch-2.14.1.bin")
    rc, out, err = run_cli(capsys, ["show", blob])
    assert rc == 0, err
    assert "      guard expression torch evaluates at lookup (guards_expr): 2 <= L['t0'] and L['t0'] <= 4096" in out
    assert "      output module file load writes and imports: <inductor cache>/cl/ccljxotz5zl3mam2yjnpvburf4jhxq5d4x644qv3oimfmuvmc265.py" in out
    rc, out, err = run_cli(capsys, ["verify", "--host", "--json", blob])
    check = next(check for check in json.loads(out)["checks"] if check["name"] == "mega-cache code torch runs")
    assert check["status"] == "ok" and check["actual"] == "3 guard expressions, 3 output module files"


@pytest.mark.parametrize("guard", TORCH_GUARDS)
@pytest.mark.parametrize("kind", ["inductor", "aot_autograd"])
def test_a_guard_expression_as_torch_writes_it_is_shown_not_flagged(capsys, tmp_path, guard, kind):
    rc, out, err = _show(capsys, tmp_path, _graph(guards_expr=_str(guard), **_module()), kind)
    assert rc == 0, (out, err)
    assert f"guard expression torch evaluates at lookup (guards_expr): {guard}" in out


@pytest.mark.parametrize(("guard", "why"), [
    ("__import__('os').system('id') or True", "a call of __import__('os').system at column 1"),
    ("L['t0'].__class__.__bases__", "the attribute L['t0'].__class__.__bases__"),
    ("L['t0'] > 2 and (lambda: 0)()", "a call of lambda: 0 at column 17"),
    ("torch.load('/tmp/x') or True", "a call of torch.load"),
    ("L['__builtins__']", "the subscript L['__builtins__']"),
    ("open", "the name open"),
    ("2 <= L['t0'] if 'x' else 1", "a str constant"),
    ("[c for c in ()] == []", "a ListComp expression"),
    ("max(L['t0'], key=print)", "a call of max at column 1 with keyword or starred arguments"),
    ("2 <= L['t0']; import os", "not one Python expression (invalid syntax"),
    ("(x := 1)", "a NamedExpr expression"),
    ("L['t0'] in (1, 2)", "a Compare expression"),
])
def test_a_guard_expression_torch_would_not_write_is_a_finding_naming_why(capsys, tmp_path, guard, why):
    rc, out, err = _show(capsys, tmp_path, _graph(guards_expr=_str(guard), **_module()))
    assert rc == 1, (out, err)
    assert "Mega-Cache inductor k: guards_expr (set at opcode offset " in err and why in err


def test_output_strides_are_read_as_code_torch_evaluates(capsys, tmp_path):
    strides = b"](" + b"(" + _str("4") + _str("1") + b"t(" + _str("s0*s1") + _str("1") + b"tNe"  # [("4", "1"), ("s0*s1", "1"), None]
    rc, out, err = _show(capsys, tmp_path, _graph(output_strides=strides, **_module()))
    assert rc == 0, (out, err)
    assert "output stride torch evaluates at load (output_strides[1][0]): s0*s1" in out and "(output_strides[0][0])" not in out
    hostile = b"](" + _str("__import__('os').getpid()") + b"\x85e"
    rc, out, err = _show(capsys, tmp_path, _graph(output_strides=hostile, **_module()))
    assert rc == 1 and "output_strides[0][0] (set at opcode offset" in err and "not a stride expression torch writes" in err


@pytest.mark.parametrize(("fields", "why"), [
    ({"cache_key": _str("/tmp/evil"), "source_code": _str(MODULE)}, "cache_key (set at opcode offset"),
    ({"cache_key": _str(code_hash("x = 1")), "source_code": _str(MODULE)}, "not torch's hash of the source_code beside it"),
    ({"cache_key": _str(code_hash(MODULE))}, "source_code (set at opcode offset"),
    ({"source_code": _str(MODULE)}, "cache_key (set at opcode offset"),
])
def test_a_cache_key_that_sends_the_module_elsewhere_is_a_finding(capsys, tmp_path, fields, why):
    rc, out, err = _show(capsys, tmp_path, _graph(**fields))
    assert rc == 1, (out, err)
    assert why in err


def test_an_output_module_is_shown_as_code_whatever_it_holds(capsys, tmp_path):
    source = "import os\nos.system('id')\n"  # no AsyncCompile line: read as code because load imports it
    rc, out, err = _show(capsys, tmp_path, _graph(**_module(source)))
    assert rc == 0, (out, err)
    assert "code loading runs: 0 kernels, 1 output modules, 0 graph modules" in out
    rc, _, err = run_cli(capsys, ["extract", str(tmp_path / "mc.bin"), str(tmp_path / "out")])
    written = [path.read_text() for path in (tmp_path / "out" / "mega_cache" / "code").iterdir()]
    assert rc == 0 and written == [source], err


@pytest.mark.parametrize("state", [
    b"(" + _text("guards_expr") + _str("open") + b"l",  # a list: no dict to read fields from
    b"}(" + _global("_codecs", "encode") + _text("guards_expr") + _text("latin1") + b"\x86R" + _str("1") + b"u",  # bytes key
])
def test_a_state_the_reader_cannot_follow_is_a_finding_in_a_reviewed_entry(capsys, tmp_path, state):
    rc, out, err = _show(capsys, tmp_path, P4 + GRAPH + b")\x81" + state + b"b.")
    assert rc == 1, (out, err)
    assert "(state) (set at opcode offset" in err


@pytest.mark.parametrize("upstream", ["fixtures/upstream", "fixtures/upstream/torch-2.15"])
def test_verify_of_an_upstream_pair_fails_a_guard_expression_in_its_artifact(capsys, tmp_path, upstream):
    # torch.compiler.precompile's cache (a torch.save zip) whose `artifact` Mega-Cache runs code at lookup.
    import zipfile

    source = zipfile.ZipFile(ROOT / upstream / "inductor.cache")
    data = source.read("archive/data.pkl")
    artifact = next(arg for op, arg, _ in pickletools.genops(data) if isinstance(arg, str) and len(arg) > 1000)
    hostile = _mega_cache([("inductor", "k", _graph(guards_expr=_str("__import__('os').getpid() > 0"), **_module()))])
    cache = tmp_path / "inductor.cache"
    with zipfile.ZipFile(cache, "w") as target:
        for member in source.infolist():
            target.writestr(member, _replaced(data, artifact, hostile.decode("latin-1")) if member.filename == "archive/data.pkl"
                            else source.read(member))
    rc, out, err = run_cli(capsys, ["verify", str(ROOT / upstream / "inductor.py"), str(cache)])
    assert rc == 1, (out, err)
    assert "FAIL  cache code torch runs: cache " in out and "Mega-Cache inductor k: guards_expr (set at opcode offset" in out
    assert [line.strip().split(":")[0] for line in out.splitlines() if line.strip().startswith("FAIL")] == ["FAIL  cache code torch runs"]


def test_a_real_entry_whose_output_module_lacks_the_async_compile_line_is_shown_extracted_and_counted(capsys, tmp_path):
    """Issue 52, finding 2: torch imports an entry's source_code (written to the path its cache_key
    names) whatever lines it holds, so the module is recognised by those fields, not by the
    `async_compile = AsyncCompile()` line Inductor writes: without that line it is still shown,
    extracted and counted by verify --host (it was hidden before ca653f3: no code, verify 0)."""
    with open(_blob(tmp_path, "torch-2.13.0.bin"), "rb") as handle:
        entries = entry_contents(handle.read())
    index, (kind, key, content) = next((i, entry) for i, entry in enumerate(entries)
                                       if entry[0] == "inductor" and b"async_compile = AsyncCompile()" in entry[2])
    old = next(arg for _, arg, _ in pickletools.genops(content) if isinstance(arg, str) and "async_compile = AsyncCompile()\n" in arg)
    canary = tmp_path / "CANARY"
    marker = f"__import__('pathlib').Path({str(canary)!r}).touch()"
    new = marker + "\n" + old.replace("async_compile = AsyncCompile()\n", "async_compile = __import__('torch._inductor.async_compile').AsyncCompile()\n")
    assert "async_compile = AsyncCompile()" not in new
    content = _replaced(_replaced(content, old, new), code_hash(old), code_hash(new))  # torch's key for the new text
    entries[index] = (kind, key, content)
    path = tmp_path / "unmarked.bin"
    path.write_bytes(_mega_cache(entries))
    rc, out, err = run_cli(capsys, ["show", str(path)])
    assert rc == 0, (out, err)
    assert f"output module file load writes and imports: <inductor cache>/{code_hash(new)[1:3]}/{code_hash(new)}.py" in out
    rc, _, err = run_cli(capsys, ["extract", str(path), str(tmp_path / "out")])
    written = [path.read_text() for path in (tmp_path / "out" / "mega_cache" / "code").rglob("*") if path.is_file()]
    assert rc == 0 and any(text.startswith(marker) for text in written), err
    rc, out, _ = run_cli(capsys, ["verify", "--host", "--json", str(path)])
    check = next(check for check in json.loads(out)["checks"] if check["name"] == "mega-cache code torch runs")
    assert check["status"] == "ok" and "3 output module files" in check["actual"], check
    assert not canary.exists()


@pytest.mark.parametrize(("source", "why"), [
    (b"C" + bytes([len(MODULE)]) + MODULE.encode(), "source_code (set at opcode offset"),  # SHORT_BINBYTES: no text to show
    (b"N", "source_code (set at opcode offset"),  # None
])
def test_an_output_module_whose_code_cannot_be_shown_is_a_finding_of_show_and_verify_host(capsys, tmp_path, source, why):
    rc, out, err = _show(capsys, tmp_path, _graph(cache_key=_str(code_hash(MODULE)), source_code=source))
    assert rc == 1 and why in err and "not a string beside a cache_key" in err, (out, err)
    rc, out, _ = run_cli(capsys, ["verify", "--host", str(tmp_path / "mc.bin")])
    assert rc == 1 and "FAIL  mega-cache code torch runs: Mega-Cache inductor k: source_code (set at opcode offset" in out, out
