"""Two captures of the same thing are the same bytes: the same fn, model, inputs, torch build and
Python, captured in two fresh processes that differ in cwd, TMPDIR, OMP_NUM_THREADS and in what
Dynamo compiled before (its counters and uuids), give byte-identical python_code and caches equal
but for what docs/inspect.md names: the bundle's provenance (where torch and Python live, the
compile command's hash), the header digest that covers it, and the kernel libraries' bytes
(compared by the kernel-binaries checks, not here). The captures are shared per backend."""
from __future__ import annotations

import difflib
import json

import msgspec
import pytest

from conftest import run_fresh
from test_inspect_helpers import run_cli
from precompile.artifact.codec import decode_header, decode_payload

TRACERS = ("makefx", "dynamo")
# Bundle file kinds that are compiled binaries: their bytes (and so the payload's digest and
# compressed size) are the kernel-binaries comparison's, not this one's.
BINARY_KINDS = ("kernel", "isa-probe")

CAPTURE = r"""
import sys, torch, precompile, dynamo_cases as dc
out, backend, warm = sys.argv[1:4]
if warm == "warm":  # compile something else first: this process's Dynamo counters and uuids differ
    torch.compile(lambda x: torch._dynamo.graph_break() or x.cos(), backend="eager")(torch.ones(2))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
for name, tracer in (("makefx", precompile.MakeFxTracer()), ("dynamo", precompile.DynamoTracer())):
    with torch.no_grad(), precompile.capture(dc.break_and_scale, artifact_path=f"{out}/{name}.py",
                                             cache_path=f"{out}/{name}.cache", tracer=tracer, backend=backend) as cap:
        cap(model, torch.ones(4, 8))
def lookup(table, index):
    return table(index) * 2  # an embedding: Inductor's C++ kernel checks the index's bounds (TORCH_CHECK)
if backend == "inductor":
    with torch.no_grad(), precompile.capture(lookup, artifact_path=f"{out}/bounds.py", cache_path=f"{out}/bounds.cache",
                                             tracer=precompile.MakeFxTracer(), backend="inductor") as cap:
        cap(torch.nn.Embedding(16, 4), torch.tensor([1, 3, 5]))
"""
INDUCTOR = pytest.param("inductor", marks=pytest.mark.slow)


@pytest.fixture(scope="module", params=["eager", INDUCTOR])
def captures(request, tmp_path_factory):
    """{run: directory of its pair per tracer}, two runs of one backend, each in its own process (with
    Inductor, also the pair `bounds`, whose kernel checks its index's bounds)."""
    backend = request.param
    runs = {}
    for run, threads, warm in (("a", "1", "cold"), ("b", "2", "warm")):
        root = tmp_path_factory.mktemp(f"{backend}-{run}")
        for sub in ("out", "cwd", "tmp"):
            (root / sub).mkdir()
        proc = run_fresh(CAPTURE, str(root / "out"), backend, warm, cwd=root / "cwd",
                         env={"TMPDIR": str(root / "tmp"), "OMP_NUM_THREADS": threads})
        assert proc.returncode == 0, proc.stderr
        runs[run] = root / "out"
    return runs


def _cache(path):
    """The cache's envelope as plain data, less what docs/inspect.md names as differing between two
    captures of the same thing, and its payload's files, less the compiled binaries'."""
    data = path.read_bytes()
    envelope, offset = decode_header(data)
    files = decode_payload(envelope.bundle, data, offset) if envelope.bundle and envelope.bundle.files else {}
    plain = msgspec.to_builtins(envelope)
    plain.pop("header_sha256")  # covers the provenance
    bundle = plain.get("bundle") or {}
    bundle.pop("provenance", None)
    binaries = {entry["path"] for entry in bundle.get("files", ()) if entry["kind"] in BINARY_KINDS}
    if binaries:
        for key in ("payload_sha256", "payload_compressed_size"):
            bundle.pop(key)
        for entry in bundle["files"]:
            if entry["path"] in binaries:
                del entry["sha256"], entry["size"]
    return plain, {name: data for name, data in files.items() if name not in binaries}


@pytest.mark.parametrize("tracer", TRACERS)
def test_two_fresh_processes_write_the_same_python_code(captures, tracer):
    a, b = ((captures[run] / f"{tracer}.py").read_bytes() for run in "ab")
    changed = difflib.unified_diff(a.decode().splitlines(), b.decode().splitlines(), lineterm="", n=0)
    assert a == b, "\n".join(list(changed)[:40])


@pytest.mark.parametrize("tracer", TRACERS)
def test_two_fresh_processes_write_the_same_cache_but_for_the_build_provenance(captures, tracer):
    (envelope_a, files_a), (envelope_b, files_b) = (_cache(captures[run] / f"{tracer}.cache") for run in "ab")
    assert json.dumps(envelope_a, sort_keys=True, indent=1) == json.dumps(envelope_b, sort_keys=True, indent=1)
    assert files_a == files_b


@pytest.mark.parametrize("tracer", TRACERS)
def test_guards_json_of_the_two_captures_is_the_same(captures, tracer, capsys, monkeypatch):
    """Named as the same relative path, the two artifacts' `guards --json` agree: nothing in it comes
    from where or in which process a capture ran (the path is echoed as given)."""
    outputs = []
    for run in "ab":
        monkeypatch.chdir(captures[run])
        rc, out, err = run_cli(capsys, ["guards", "--json", tracer])
        assert rc == 0, err
        outputs.append(out)
    assert outputs[0] == outputs[1]


def test_python_code_names_no_path_of_the_capturing_process(captures):
    for run, directory in captures.items():
        for tracer in TRACERS:
            text = (directory / f"{tracer}.py").read_text()
            assert str(directory.parent) not in text and '"num_threads":' not in text, (run, tracer)


@pytest.mark.parametrize("captures", [INDUCTOR], indirect=True)
def test_captures_under_two_tmpdirs_diff_equal_in_their_kernels(captures, capsys):
    """A kernel's index bounds check names its source file (`__FILE__`), which lies in the capture's
    kernel dir under TMPDIR: mapped to a fixed name, the libraries run the same bytes whatever TMPDIR is."""
    assert "TORCH_CHECK" in (captures["a"] / "bounds.py").read_text()  # the model has the check this is about
    rc, out, err = run_cli(capsys, ["diff", str(captures["a"] / "bounds"), str(captures["b"] / "bounds"), "--fail-on", "kernels"])
    assert rc == 0, out + err
    assert "verdict: equal" in out
