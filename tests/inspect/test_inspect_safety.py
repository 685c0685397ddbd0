"""inspect never imports torch, never executes python_code, never unpickles; sizes are bounded."""
from __future__ import annotations

import json
import pickle
import shutil
import struct
import subprocess
import sys
import zipfile

import pytest

from test_inspect_helpers import ALL, FIXTURES, ROOT, run_cli

MARKER = "PRECOMPILE_POISON_MARKER"

_EVERY_VERB = r"""
import sys, json, os
from precompile.cli.main import main
import precompile.inspect
codes = {}
names = json.loads(sys.argv[1])
for name in names:
    path = f"fixtures/{name}"
    for argv in (["show", path], ["show", "--json", path], ["guards", path], ["verify", path],
                 ["verify", "--host", path], ["extract", path, os.path.join(sys.argv[2], name)]):
        codes[" ".join(argv[:2]) + " " + name] = main(["--color", "never", *argv])
codes["diff"] = main(["diff", "fixtures/v1/mlp", "fixtures/v1/mlp_b4"])
codes["schema"] = main(["schema"])
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.") or m in ("numpy", "jinja2"))
print(json.dumps({"heavy": heavy, "codes": codes}), file=sys.stderr)
"""


def test_no_verb_imports_torch(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", _EVERY_VERB, json.dumps(ALL), str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result["heavy"] == []
    assert set(result["codes"].values()) <= {0, 1, 2}
    assert "Traceback" not in proc.stderr


def test_poisoned_fixtures_are_really_poisonous(tmp_path):
    """The safety test below means something: unpickling these does write the marker."""
    data = zipfile.ZipFile(FIXTURES / "damaged/poisoned.cache").read("archive/data.pkl")
    raw = (FIXTURES / "damaged/poisoned_raw.pkl").read_bytes()
    for blob in (data, raw):
        code = "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"
        subprocess.run([sys.executable, "-c", code], input=blob, cwd=tmp_path, capture_output=True, timeout=30)
        assert (tmp_path / MARKER).exists()
        (tmp_path / MARKER).unlink()
    source = (FIXTURES / "damaged/poisoned.py").read_text()
    assert f"open({MARKER!r}, 'w')" in source


def test_poisoned_artifact_runs_nothing(capsys, tmp_path, monkeypatch):
    for name in ("poisoned.py", "poisoned.cache", "poisoned_raw.pkl"):
        shutil.copy(FIXTURES / "damaged" / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    argvs = [
        ["show", "poisoned"], ["show", "--json", "poisoned"], ["guards", "poisoned"], ["verify", "poisoned"],
        ["verify", "--host", "poisoned"], ["extract", "poisoned", "out"], ["diff", "poisoned", "poisoned"],
        ["show", "poisoned.py", "poisoned_raw.pkl"], ["verify", "poisoned.py", "poisoned_raw.pkl"],
        ["extract", "poisoned.py", "poisoned_raw.pkl", "out2"],
    ]
    for argv in argvs:
        rc, out, err = run_cli(capsys, argv)
        assert rc in (0, 1, 2), argv
        assert "Traceback" not in err
        assert not (tmp_path / MARKER).exists(), argv
    rc, out, err = run_cli(capsys, ["show", "poisoned"])
    assert "posix.system  FLAGGED: dangerous" in out
    assert "would import posix.system (dangerous)" in err
    rc, out, err = run_cli(capsys, ["show", "poisoned.py", "poisoned_raw.pkl"])
    assert "builtins.exec  FLAGGED: dangerous" in out


@pytest.mark.parametrize(
    ("module", "name", "risk"),
    [
        ("os", "system", "dangerous"), ("posix", "system", "dangerous"), ("nt", "system", "dangerous"),
        ("builtins", "exec", "dangerous"), ("builtins", "eval", "dangerous"), ("builtins", "getattr", "dangerous"),
        ("subprocess", "Popen", "dangerous"), ("subprocess", "check_output", "dangerous"),
        ("torch._utils", "_rebuild_tensor_v2", "allowed"), ("torch", "FloatStorage", "allowed"),
        ("collections", "OrderedDict", "allowed"), ("builtins", "set", "allowed"), ("_codecs", "encode", "allowed"),
        ("numpy.core.multiarray", "_reconstruct", "unknown"), ("mypkg", "Thing", "unknown"),
    ],
)
def test_classify(module, name, risk):
    from precompile.artifact.pickle_policy import classify

    assert classify(module, name) == risk


def test_scan_every_protocol_and_stack_global():
    from precompile.artifact.pickle_scan import scan_pickle

    class Evil:
        def __reduce__(self):
            return (subprocess.check_output, (["true"],))

    for protocol in range(0, pickle.HIGHEST_PROTOCOL + 1):
        scan = scan_pickle(pickle.dumps({"a": 1, "b": [Evil()], "c": b"xy"}, protocol=protocol), member="p")
        assert ("subprocess", "check_output", "dangerous") in {(i.module, i.name, i.risk) for i in scan.imports}, protocol
        assert scan.problem is None
        assert [f.key for f in scan.fields] == ["a", "b", "c"]
        assert scan.fields[0].summary == "1"


def test_scan_garbage_never_raises():
    import random

    from precompile.artifact.pickle_scan import scan_pickle

    rng = random.Random(0)
    for _ in range(300):
        blob = bytes([0x80, rng.randrange(6)]) + bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
        scan_pickle(blob, member="x")


def test_huge_declared_header_is_refused_before_allocation(capsys, tmp_path):
    from precompile.artifact.codec import MAGIC

    shutil.copy(FIXTURES / "v1/mlp.py", tmp_path / "h.py")
    (tmp_path / "h.cache").write_bytes(MAGIC + struct.pack("<I", 0xFFFFFFF0) + b"\x00" * 16)
    rc, out, err = run_cli(capsys, ["show", str(tmp_path / "h")])
    assert rc == 2 and "over the" in err and "limit" in err
    rc, out, err = run_cli(capsys, ["verify", str(tmp_path / "h")])
    assert rc == 2 and "over the" in out  # unreadable as a cache: trouble, as show says (docs/inspect.md, exit codes)


def test_zip_member_size_is_bounded(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("precompile.inspect.reading.reader.MAX_PICKLE_SIZE", 100)
    shutil.copy(FIXTURES / "v1/mlp.py", tmp_path / "z.py")
    with zipfile.ZipFile(tmp_path / "z.cache", "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"x": b"\x00" * 1000}))
    rc, out, err = run_cli(capsys, ["show", str(tmp_path / "z")])
    assert rc == 2 and "scan limit" in err


def test_missing_cache_is_reported(capsys, tmp_path):
    shutil.copy(FIXTURES / "v1/mlp.py", tmp_path / "only.py")
    rc, out, err = run_cli(capsys, ["show", str(tmp_path / "only.py")])
    assert rc == 0 and "cache: none given (no NAME.cache beside it); python_code shown alone" in out  # one file alone is shown
    rc, out, err = run_cli(capsys, ["show", str(tmp_path / "only.py"), str(tmp_path / "only.cache")])
    assert rc == 2 and "does not exist" in err and "pairs: cannot tell" in out
