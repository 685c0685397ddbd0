"""torch's own Mega-Cache, as each claimed torch writes it (fixtures/mega_cache, one blob per torch
2.11-2.14, xz-compressed): a benign blob shows clean with its kernels named, torch's own classes
reviewed kind by kind; the hostile fixture still exits 1; verify --host judges this host torch-free;
guards and plain verify say the blob is not supported; extract writes the kernels' sources; diff
compares kernels by source."""
from __future__ import annotations

import base64
import hashlib
import json
import lzma
import pickle
import zlib

import pytest
from test_inspect_helpers import FIXTURES, ROOT, run_cli

MEGA = FIXTURES / "mega_cache"
VERSIONS = ("2.11.0", "2.12.1", "2.13.0", "2.14.1")
HOSTILE = FIXTURES / "hostile" / "mega_cache_p0_entry.bin"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)
    for name in ("FORCE_COLOR", "NO_COLOR", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)


def _blob(tmp_path, name: str) -> str:
    path = tmp_path / name
    path.write_bytes(lzma.decompress((MEGA / f"{name}.xz").read_bytes()))
    return str(path)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_benign_mega_cache_of_each_torch_shows_clean_with_its_kernels_named(capsys, tmp_path, version):
    blob = _blob(tmp_path, f"torch-{version}.bin")
    rc, out, err = run_cli(capsys, ["show", blob])
    assert rc == 0, err
    assert out.rstrip().endswith("verdict: 0 findings: nothing flagged") and err == ""
    assert "kernel cpp_fused__softmax_relu_0 (cpp" in out  # the forward's kernel, by its Inductor name
    assert "(reviewed: inductor entries: dataclass holding the output module's source" in out
    kinds = {line.split()[0] for line in out.splitlines() if line.startswith("    ") and not line.startswith("     ")
             and " pickle " in line}
    assert kinds == {"inductor", "aot_autograd", "pgo"}
    if version != "2.14.1":  # 2.14 keeps only a digest of torch's sources beside each graph
        assert f"recorded torch version: {version}+" in out
    else:
        assert "recorded torch version: none in clear" in out


def test_report_counts_and_shows_the_kernels(capsys, tmp_path):
    blob = _blob(tmp_path, "torch-2.13.0.bin")
    rc, _, err = run_cli(capsys, ["report", blob, "-o", str(tmp_path / "r.html")])
    html = (tmp_path / "r.html").read_text()
    assert rc == 0, err
    assert "Kernels (0)" not in html and "cpp_fused__softmax_relu_0" in html and "cpp_fused_sum_1" in html


def test_the_hostile_mega_cache_still_exits_1(capsys):
    rc, out, err = run_cli(capsys, ["show", str(HOSTILE)])
    assert rc == 1 and "verdict: 1 finding" in out and "would import os.system (dangerous)" in err


def _mega_cache(entries: list[tuple[str, str, bytes]]) -> bytes:
    """A Mega-Cache as torch writes it, one entry per kind (crc32 | u64 version | kind, count, key, content)."""
    def raw(data: bytes) -> bytes:
        return len(data).to_bytes(8, "big") + data

    body = (1).to_bytes(8, "big")
    for kind, key, content in entries:
        body += raw(base64.b64encode(kind.encode())) + (1).to_bytes(8, "big") + raw(base64.b64encode(key.encode())) + raw(content)
    return zlib.crc32(body).to_bytes(4, "big") + body


def _text(value: str) -> bytes:
    return b"\x8c" + bytes([len(value)]) + value.encode()  # SHORT_BINUNICODE


def code_hash(source: str) -> str:
    """The key torch gives an output module, as torch/_inductor/codecache.py computes it (code_hash)."""
    return "c" + base64.b32encode(hashlib.sha256(source.strip().encode()).digest())[:51].decode().lower()


def _global(module: str, name: str) -> bytes:
    return _text(module) + _text(name) + b"\x93"  # STACK_GLOBAL


GRAPH_REDUCER = _global("torch.fx.graph_module", "reduce_graph_module")
COMPILED_FX_GRAPH = b"\x80\x04" + _global("torch._inductor.output_code", "CompiledFxGraph") + b")\x81."  # cls.__new__(cls)
CALLED_REDUCER = (b"\x80\x04" + GRAPH_REDUCER + b"}" + _text("_code") + _text("import os; os.system('id')") + b"s"
                  + _text("") + b"\x86R.")  # reduce_graph_module({"_code": ...}, "") while unpickling
STORED_REDUCER = b"\x80\x04}" + _text("fn") + GRAPH_REDUCER + b"s."  # {"fn": reduce_graph_module}, as SerializedGraphModule holds it


@pytest.mark.parametrize(("kind", "content", "expected"), [
    ("inductor", COMPILED_FX_GRAPH, 0),
    ("pgo", COMPILED_FX_GRAPH, 1),  # reviewed for inductor (and AOTAutograd) entries only
    ("aot_autograd", STORED_REDUCER, 0),  # torch calls it at load, on the graph code shown
    ("inductor", STORED_REDUCER, 1),
    ("aot_autograd", CALLED_REDUCER, 1),  # called while unpickling: a finding wherever it sits
], ids=["graph-in-inductor", "graph-in-pgo", "stored-reducer-in-aot", "stored-reducer-in-inductor", "called-reducer-in-aot"])
def test_a_reviewed_name_is_allowed_only_where_it_was_reviewed(capsys, tmp_path, kind, content, expected):
    path = tmp_path / "mc.bin"
    path.write_bytes(_mega_cache([(kind, "k", content)]))
    rc, out, err = run_cli(capsys, ["show", str(path)])
    assert rc == expected, (out, err)
    if content is CALLED_REDUCER:
        assert "torch.fx.graph_module.reduce_graph_module at offset" in out and "REDUCE calls it while unpickling" in out


P4 = b"\x80\x04"
GRAPH = _global("torch._inductor.output_code", "CompiledFxGraph")
GRAPH_NAME = "torch._inductor.output_code.CompiledFxGraph"
SCHEMAS = "torch._functorch._aot_autograd.schemas"
SOURCE = "torch._dynamo.source"
ORDERED_SET = _global("torch.utils._ordered_set", "OrderedSet")
# The shapes torch's own pickling writes for a reviewed class, each allowed where its review says.
BUILT_SHAPES = {
    "newobj-then-build": (P4 + GRAPH + b")\x81}(" + _text("cache_key") + _text(code_hash("x = 1")) + _text("source_code")
                          + _text("x = 1") + b"ub.", "inductor"),  # the module's key: torch's hash of its source
    "newobj-ex-trivial": (P4 + GRAPH + b")}\x92.", "inductor"),
    "reconstructor-on-object": (b"\x80\x02" + _global("copyreg", "_reconstructor") + GRAPH + _global("builtins", "object")
                                + b"N\x87R}b.", "inductor"),
    "enum-by-value": (P4 + _global(SCHEMAS, "MutationType") + b"K\x01\x85R.", "aot_autograd"),
    "ordered-set-of-a-list": (P4 + ORDERED_SET + b"](K\x01K\x02e\x85R.", "inductor"),
    "source-by-its-fields": (P4 + _global(SOURCE, "AttrSource") + _global(SOURCE, "LocalSource") + _text("x") + b"\x85R"
                             + _text("weight") + b"\x86R.", "aot_autograd"),
}
# Any other call of a reviewed class: (content, kind, the class named, what the finding says it does).
HOSTILE_SHAPES = {
    "reduce-with-a-path": (P4 + GRAPH + _text("/tmp/graph.py") + b"\x85R.", "inductor", GRAPH_NAME,
                           "REDUCE calls it with 1 argument ('/tmp/graph.py')"),
    "newobj-with-arguments": (P4 + GRAPH + _text("x") + b"\x85\x81.", "inductor", GRAPH_NAME,
                              "NEWOBJ builds it with 1 argument ('x')"),
    "newobj-ex-with-keywords": (P4 + GRAPH + b")}" + _text("current_callable") + _text("x") + b"s\x92.", "inductor",
                                GRAPH_NAME, "NEWOBJ_EX builds it with no arguments and keywords dict (1 keys)"),
    "copyreg-newobj-with-arguments": (P4 + _global("copyreg", "__newobj__") + GRAPH + _text("x") + b"\x86R.", "inductor",
                                      GRAPH_NAME, "copyreg.__newobj__ builds it with 1 argument ('x')"),
    "reconstructor-on-a-reviewed-base": (b"\x80\x02" + _global("copyreg", "_reconstructor")
                                         + _global("torch._inductor.utils", "BoxedBool") + GRAPH + _text("x") + b"\x87R.",
                                         "inductor", GRAPH_NAME, "copyreg._reconstructor calls it as the base of"),
    "rebuild-from-type": (P4 + _global("torch._tensor", "_rebuild_from_type_v2") + b"(" + GRAPH + _global("torch", "Tensor")
                          + _text("x") + b"\x85}tR.", "aot_autograd",
                          GRAPH_NAME, "torch._tensor._rebuild_from_type_v2 calls it with 1 argument ('x')"),
    "inst-protocol-0": (b"(S'x'\nitorch._inductor.output_code\nCompiledFxGraph\n.", "inductor", GRAPH_NAME,
                        "INST calls it with 1 argument ('x')"),
    "enum-functional-api": (P4 + _global(SCHEMAS, "MutationType") + _text("Evil") + _text("A B") + b"\x86R.", "aot_autograd",
                            f"{SCHEMAS}.MutationType", "REDUCE calls it with 2 arguments ('Evil', 'A B')"),
    "ordered-set-of-a-string": (P4 + ORDERED_SET + _text("abc") + b"\x85R.", "inductor",
                                "torch.utils._ordered_set.OrderedSet", "REDUCE calls it with 1 argument ('abc')"),
    "tensor-called": (P4 + _global("torch", "Tensor") + b")R.", "aot_autograd", "torch.Tensor",
                      "REDUCE calls it with no arguments"),
    "pgo-state-called": (P4 + _global("torch._dynamo.pgo", "CodeState") + _text("x") + b"\x85R.", "pgo",
                         "torch._dynamo.pgo.CodeState", "REDUCE calls it with 1 argument ('x')"),
}


@pytest.mark.parametrize("case", BUILT_SHAPES)
def test_a_reviewed_class_built_the_way_torch_pickles_it_is_clean(capsys, tmp_path, case):
    content, kind = BUILT_SHAPES[case]
    path = tmp_path / "mc.bin"
    path.write_bytes(_mega_cache([(kind, "k", content)]))
    rc, out, err = run_cli(capsys, ["show", str(path)])
    assert rc == 0, (out, err)


@pytest.mark.parametrize("case", HOSTILE_SHAPES)
def test_any_other_call_of_a_reviewed_class_is_a_finding_naming_the_class_and_the_call(capsys, tmp_path, case):
    content, kind, name, call = HOSTILE_SHAPES[case]
    path = tmp_path / "mc.bin"
    path.write_bytes(_mega_cache([(kind, "k", content)]))
    rc, out, err = run_cli(capsys, ["show", str(path)])
    assert rc == 1, (out, err)
    finding = next((line for line in out.splitlines() if f"{name} at offset" in line), "")
    assert call in finding, out
    assert f"would import {name} (dangerous) if unpickled: {call}" in err


def test_the_committed_blob_calling_a_reviewed_class_exits_1_naming_the_call(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(HOSTILE.parent))
    from make_hostile import CONTAINERS

    called = HOSTILE.parent / "mega_cache_graph_called.bin"
    assert called.read_bytes() == CONTAINERS[called.name]  # the script writes it; never unpickle it
    rc, out, err = run_cli(capsys, ["show", str(called)])
    assert rc == 1 and "verdict: 1 finding" in out
    assert (f"would import {GRAPH_NAME} (dangerous) if unpickled: REDUCE calls it with 1 argument "
            "('/tmp/PRECOMPILE_POISON_MARKER.py'); torch builds it only by copyreg reconstruction") in err


def test_verify_host_fails_a_reviewed_class_called_with_arguments(capsys, tmp_path):
    content, kind, name, call = HOSTILE_SHAPES["reduce-with-a-path"]
    path = tmp_path / "mc.bin"
    path.write_bytes(_mega_cache([(kind, "k", content)]))
    rc, out, err = run_cli(capsys, ["verify", "--host", str(path)])
    assert rc == 1 and f"FAIL  mega-cache pickle: inductor k would import {name} (dangerous) if unpickled: {call}" in out


def test_guards_says_a_mega_cache_is_not_supported(capsys, tmp_path):
    blob = _blob(tmp_path, "torch-2.13.0.bin")
    rc, out, err = run_cli(capsys, ["guards", blob])
    assert rc == 2 and out == "" and f"guards is not supported for Mega-Cache {blob}: it holds no guards" in err


def test_plain_verify_judges_a_mega_cache_as_show_does(capsys, tmp_path):
    """verify without --host judges the container and each scan (show calls the blob clean: so does
    verify, exit 0), and fails a hostile entry (1); the host's checks are --host's alone."""
    blob = _blob(tmp_path, "torch-2.13.0.bin")
    assert run_cli(capsys, ["show", blob])[0] == 0
    rc, out, err = run_cli(capsys, ["verify", "--json", blob])
    report = json.loads(out)
    assert rc == 0 and report["ok"] and not report["host"], err
    assert {check["name"] for check in report["checks"]} == {"mega-cache container", "mega-cache pickles",
                                                              "mega-cache code torch runs"}
    content, kind, name, call = HOSTILE_SHAPES["reduce-with-a-path"]
    hostile = tmp_path / "mc.bin"
    hostile.write_bytes(_mega_cache([(kind, "k", content)]))
    rc, out, err = run_cli(capsys, ["verify", str(hostile)])
    assert rc == 1 and f"FAIL  mega-cache pickle: inductor k would import {name} (dangerous) if unpickled: {call}" in out


def test_verify_host_judges_the_recorded_keys_against_this_host(capsys, tmp_path, monkeypatch):
    import precompile.inspect.verify.mega_cache_host as host

    blob = _blob(tmp_path, "torch-2.13.0.bin")
    monkeypatch.setattr(host, "host_torch_version", lambda: "2.13.0+cpu")
    monkeypatch.setattr(host.shutil, "which", lambda name: f"/usr/bin/{name}")
    rc, out, err = run_cli(capsys, ["verify", "--host", "--json", blob])
    checks = {check["name"]: check for check in json.loads(out)["checks"]}
    assert rc == 0, err
    assert checks["host torch"]["status"] == "ok" and checks["host torch"]["expected"] == "2.13.0+cpu"
    assert checks["host devices"]["status"] == "ok" and checks["host C++ compiler"]["status"] == "ok"
    assert checks["host CPU ISA"]["status"] == "skip" and checks["host python"]["status"] == "skip"
    monkeypatch.setattr(host, "host_torch_version", lambda: "2.14.1")
    rc, out, err = run_cli(capsys, ["verify", "--host", blob])
    assert rc == 1 and "FAIL  host torch: torch 2.13.0+cpu wrote this Mega-Cache, this host has torch 2.14.1: every entry would miss" in out
    monkeypatch.setattr(host, "host_torch_version", lambda: "2.13.0+cpu")
    monkeypatch.setattr(host.shutil, "which", lambda name: None)
    rc, out, err = run_cli(capsys, ["verify", "--host", blob])
    assert rc == 1 and "FAIL  host C++ compiler: load compiles this blob's C++ kernels with g++" in out
    rc, out, err = run_cli(capsys, ["verify", "--host", str(HOSTILE)])
    assert rc == 1 and "FAIL  mega-cache pickle: inductor evil would import os.system (dangerous)" in out


def test_extract_writes_each_kernel_source_by_its_inductor_name(capsys, tmp_path):
    blob = _blob(tmp_path, "torch-2.11.0.bin")
    rc, _, err = run_cli(capsys, ["extract", blob, str(tmp_path / "out")])
    kernels = tmp_path / "out" / "mega_cache" / "kernels"
    assert rc == 0, err
    source = (kernels / "cpp_fused__softmax_relu_0.cpp").read_text()
    assert source.startswith("#include") and 'extern "C"' in source
    assert (kernels / "cpp_fused_sum_1.cpp").exists()
    assert any(p.name.endswith("-wrapper-1.py") for p in (tmp_path / "out" / "mega_cache" / "code").iterdir())


def test_diff_of_two_blobs_names_the_kernel_that_differs(capsys, tmp_path):
    relu, sigmoid = _blob(tmp_path, "torch-2.13.0.bin"), _blob(tmp_path, "torch-2.13.0-sigmoid.bin")
    rc, out, err = run_cli(capsys, ["diff", relu, sigmoid])
    assert rc == 1, err
    assert "kernel cpp_fused__softmax_relu_0 (removed)" in out and "kernel cpp_fused__softmax_sigmoid_0 (added)" in out
    rc, out, err = run_cli(capsys, ["diff", "--json", _blob(tmp_path, "torch-2.14.1.bin"), relu])
    assert json.loads(out)["kernels"] == []  # 2.13 and 2.14 generate these kernels alike: only the entries differ


def test_precompile_entries_name_their_kernels_and_system_but_are_not_reviewed(capsys, tmp_path, monkeypatch):
    # torch 2.14 with TORCH_CACHING_PRECOMPILE=1: Dynamo's entry nests its guards and the user's own
    # classes (here __main__.Tiny), which no list reviews; its SystemInfo records Python and torch.
    import precompile.inspect.verify.mega_cache_host as host

    blob = _blob(tmp_path, "torch-2.14.1-precompile.bin")
    rc, out, err = run_cli(capsys, ["show", blob])
    assert rc == 1 and "would import __main__.Tiny (unknown)" in err
    assert "recorded torch version: 2.14.1+" in out and "recorded python version: 3." in out
    precompile = out[out.index("\n    precompile "):]
    assert "kernel cpp_fused__softmax_relu_0 (cpp" in precompile  # read from the pickles nested in it
    recorded_python = next(line for line in out.splitlines() if "recorded python version" in line).split(": ")[1]
    monkeypatch.setattr(host.platform, "python_version", lambda: recorded_python)
    rc, out, err = run_cli(capsys, ["verify", "--host", "--json", blob])
    listed = json.loads(out)["checks"]
    checks = {check["name"]: check for check in listed}
    assert rc == 1 and checks["host python"]["status"] == "ok"
    pickles = [check["message"] for check in listed if check["name"] == "mega-cache pickle"]
    assert len(pickles) == len(set(pickles)) and any("__main__.Tiny" in message for message in pickles)  # each name once
    monkeypatch.setattr(host.platform, "python_version", lambda: "3.99.0")
    rc, out, err = run_cli(capsys, ["verify", "--host", blob])
    assert rc == 1 and f"FAIL  host python: its precompile entries were written under Python {recorded_python}" in out


TRITON_MODULE = """# AOT ID: ['0_inference']
from torch._inductor.async_compile import AsyncCompile
async_compile = AsyncCompile()


triton_poi_fused_relu_0 = async_compile.triton('triton_poi_fused_relu_0', '''
import triton

@triton.jit
def triton_poi_fused_relu_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    tmp0 = tl.load(in_ptr0 + xindex)
''', device_str='cuda')


async_compile.wait(globals())
del async_compile
"""


def test_a_triton_kernel_is_named_and_extracted_like_a_cpp_one(capsys, tmp_path):
    # The CUDA form of an output module (no GPU here to write one): the source string Inductor binds.
    path = tmp_path / "mc.bin"
    path.write_bytes(_mega_cache([("inductor", "k", pickle.dumps({"source_code": TRITON_MODULE}, protocol=4))]))
    rc, out, err = run_cli(capsys, ["show", str(path)])
    assert rc == 0, err
    assert "code loading runs: 1 kernels, 1 output modules, 0 graph modules" in out and "kernel triton_poi_fused_relu_0 (triton" in out
    rc, _, err = run_cli(capsys, ["extract", str(path), str(tmp_path / "out")])
    source = (tmp_path / "out" / "mega_cache" / "kernels" / "triton_poi_fused_relu_0.py").read_text()
    assert rc == 0 and source.startswith("import triton") and "def triton_poi_fused_relu_0(" in source
