"""backend="inductor": fresh-process round trips from the frozen kernel bundle, the JIT fallback,
and what degrades with a warning. The captures are shared per session (Inductor costs ~15 s each)."""
from __future__ import annotations

import warnings

import msgspec
import pytest
import torch

import precompile
from cases import CASES
from conftest import run_fresh
from precompile import PrecompileError, PrecompileWarning
from precompile.artifact import codec
from precompile.artifact.pair import parse_cache
from test_roundtrip import serve_in_fresh_process


def test_primed_round_trips_compile_nothing_and_skip_inductor(captured_inductor, tmp_path):
    """An empty Inductor cache dir, under no_compilation(): every case serves, equal to eager."""
    inductor_imported = serve_in_fresh_process(
        captured_inductor, "no_compilation", env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "empty")}
    )
    assert inductor_imported == []  # kernels loaded straight from the bundle: no Inductor, no compiler
    assert any((tmp_path / "empty").rglob("*.main.so"))  # primed into Inductor's layout for a JIT fallback


COLD_LOAD = r"""
import sys, warnings
import torch, precompile
from cases import CASES
warnings.simplefilter("ignore", precompile.PrecompileWarning)
case = CASES["plain_function"]
if sys.argv[3] == "no_compilation":
    with precompile.no_compilation():
        try:
            precompile.load(sys.argv[1], sys.argv[2])
        except precompile.PrecompileError as exc:
            print("refused:", exc)
else:
    served = precompile.load(sys.argv[1], sys.argv[2])(*case.args())
    eager = case.fn(*case.args())
    print("served:", all(torch.allclose(a, b) for a, b in zip(served["parts"], eager["parts"])) and torch.allclose(served["sum"], eager["sum"]))
"""


def test_without_its_cache_file_the_artifact_jit_compiles_or_refuses(captured_inductor, tmp_path):
    artifact, _ = captured_inductor["plain_function"]
    missing = tmp_path / "deleted.cache"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cold")}
    refused = run_fresh(COLD_LOAD, str(artifact), str(missing), "no_compilation", env=env)
    assert refused.returncode == 0, refused.stderr
    assert "refused: no_compilation() is active and a C++ kernel would be built" in refused.stdout
    served = run_fresh(COLD_LOAD, str(artifact), str(missing), "jit", env=env)
    assert served.returncode == 0, served.stderr
    assert "served: True" in served.stdout


def _copy(pair, tmp_path, name):
    artifact, cache = tmp_path / f"{name}.py", tmp_path / f"{name}.cache"
    artifact.write_bytes(pair[0].read_bytes())
    cache.write_bytes(pair[1].read_bytes())
    return artifact, cache


def test_a_bundle_that_does_not_fit_this_host_warns_and_jit_compiles(captured_inductor, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "jit"))
    artifact, cache = _copy(captured_inductor["plain_function"], tmp_path, "elsewhere")
    parsed = parse_cache(cache, cache.read_bytes())
    keys = {**parsed.envelope.bundle.keys, "torch": "2.13.0+cu130"}  # another build of the same release
    envelope = msgspec.structs.replace(parsed.envelope, bundle=msgspec.structs.replace(parsed.envelope.bundle, keys=keys))
    cache.write_bytes(codec.encode_cache(envelope, cache.read_bytes()[parsed.payload_offset :]))
    with pytest.warns(PrecompileWarning, match=r"does not fit this host: torch is '.+' here but '2.13.0\+cu130' where it was captured.*JIT"):
        runnable = precompile.load(artifact, cache)
    case = CASES["plain_function"]
    assert torch.allclose(runnable(*case.args())["sum"], case.fn(*case.args())["sum"])


def test_a_bundle_whose_payload_was_altered_is_never_used(captured_inductor, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "jit"))
    artifact, cache = _copy(captured_inductor["plain_function"], tmp_path, "altered")
    data = bytearray(cache.read_bytes())
    data[-20] ^= 0x01
    cache.write_bytes(bytes(data))
    with pytest.warns(PrecompileWarning, match="ignoring the kernel bundle: .*payload does not match its recorded sha256"):
        runnable = precompile.load(artifact, cache)
    case = CASES["plain_function"]
    assert torch.allclose(runnable(*case.args())["sum"], case.fn(*case.args())["sum"])


def test_a_shape_mismatch_is_a_precompile_error_and_another_layout_is_copied_into_the_captured_one(captured_inductor):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecompileWarning)
        runnable = precompile.load(*captured_inductor["mlp_batchnorm"])
    model, x = CASES["mlp_batchnorm"].args()
    transposed = x.t().contiguous().t()  # same shape and values, other strides
    with torch.set_grad_enabled(CASES["mlp_batchnorm"].grad):  # the grad mode it was captured in
        with pytest.raises(PrecompileError, match=r"input args\[1\]: expected shape \(6, 8\), got \(7, 8\)"):
            runnable(model, torch.ones(7, 8))
        assert torch.allclose(runnable(model, transposed), model(x), atol=1e-5)
        assert torch.allclose(runnable(model, transposed.contiguous()), model(x), atol=1e-5)


def test_the_cache_records_what_keys_its_kernels(captured_inductor):
    _, cache = captured_inductor["train_step"]
    bundle = parse_cache(cache, cache.read_bytes()).envelope.bundle
    assert {f.kind for f in bundle.files} >= {"kernel", "kernel-source", "isa-probe"}
    assert set(bundle.keys) >= {"torch", "torch_git", "cxx11_abi", "python", "python_abi", "machine", "isa", "cpu_flags"}
    assert set(bundle.provenance) >= {"torch_dir", "python_include", "compiler", "compiler_command_sha256", "precompiled_headers"}
    assert not set(bundle.keys) & set(bundle.provenance)  # paths are never requirements
    assert bundle.provenance["precompiled_headers"] == "on"
    assert set(bundle.kernels.values()) == {f.path for f in bundle.files if f.kind == "kernel"}


def linear_relu(model, x):
    return model(x)


def test_a_dim_marked_unbacked_serves_any_size(tmp_path):
    from torch._dynamo.decorators import mark_unbacked

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(6, 8)
    mark_unbacked(x, 0)
    with torch.no_grad(), precompile.capture(
        linear_relu, artifact_path=tmp_path / "u.py", cache_path=tmp_path / "u.cache", tracer=precompile.MakeFxTracer()
    ) as cap:
        assert cap(model, x).shape == (6, 4)
    runnable = precompile.load(tmp_path / "u.py", tmp_path / "u.cache")
    assert runnable.metadata.inputs[0].shape == (None, 8)
    with torch.no_grad():
        for n in (1, 3, 100):
            y = torch.randn(n, 8)
            assert torch.allclose(runnable(model, y), model(y), atol=1e-5)
    with pytest.raises(PrecompileError, match=r"input args\[1\]: expected shape \(\*, 8\) \(\* = any size\), got \(3, 9\)"):
        runnable(model, torch.randn(3, 9))


def test_unbacked_marks_are_refused_with_eager_and_when_the_graph_guards_on_them(tmp_path):
    from torch._dynamo.decorators import mark_unbacked

    x = torch.randn(6, 8)
    mark_unbacked(x, 0)
    options = dict(artifact_path=tmp_path / "u.py", cache_path=tmp_path / "u.cache", tracer=precompile.MakeFxTracer())
    with pytest.raises(PrecompileError, match=r"args\[1\] has dims \[0\] marked with mark_unbacked, which only backend='inductor' supports"):
        with torch.no_grad(), precompile.capture(linear_relu, backend="eager", **options) as cap:
            cap(torch.nn.Linear(8, 4), x)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16)).eval()
    with pytest.raises(PrecompileError, match="fn needs to guard on a dim marked with mark_unbacked"):
        with torch.no_grad(), precompile.capture(linear_relu, **options) as cap:
            cap(model, x)
    assert not (tmp_path / "u.py").exists()


def scale_rows(x, w):
    return (x * w).relu().sum(dim=1)


def test_dims_after_the_first_can_be_marked_unbacked(tmp_path):
    """Dims 1 and 2 of one input marked in one capture (one compile): any size of either serves."""
    from torch._dynamo.decorators import mark_unbacked

    x, w = torch.randn(2, 5, 3), torch.randn(2, 1, 1)
    mark_unbacked(x, 1)
    mark_unbacked(x, 2)
    with precompile.capture(
        scale_rows, artifact_path=tmp_path / "d.py", cache_path=tmp_path / "d.cache", tracer=precompile.MakeFxTracer()
    ) as cap:
        cap(x, w)
    runnable = precompile.load(tmp_path / "d.py", tmp_path / "d.cache")
    assert runnable.metadata.inputs[0].shape == (2, None, None)
    for rows, cols in ((1, 1), (7, 3), (4, 11)):
        y = torch.randn(2, rows, cols)
        assert torch.allclose(runnable(y, w), scale_rows(y, w))


def aliasing(model, x):
    return model(x), x, x.t(), model.weight, x.view(-1)[:3]


def test_outputs_that_alias_inputs_and_parameters(tmp_path):
    model, x = torch.nn.Linear(4, 2), torch.randn(3, 4)
    with torch.no_grad(), precompile.capture(
        aliasing, artifact_path=tmp_path / "a.py", cache_path=tmp_path / "a.cache", tracer=precompile.MakeFxTracer()
    ) as cap:
        cap(model, x)
    with torch.no_grad():
        served = precompile.load(tmp_path / "a.py", tmp_path / "a.cache")(model, x)
        expected = aliasing(model, x)
    for got, want in zip(served, expected):
        assert torch.equal(got, want) or torch.allclose(got, want, atol=1e-6)
    assert served[1].data_ptr() == x.data_ptr() and served[3].data_ptr() == model.weight.data_ptr()


def identity(x):
    return x


def test_a_graph_with_nothing_to_compile_is_refused_with_the_remedy(tmp_path):
    with pytest.raises(PrecompileError, match="nothing to compile in this graph .* capture it with backend='eager'"):
        with precompile.capture(
            identity, artifact_path=tmp_path / "i.py", cache_path=tmp_path / "i.cache", tracer=precompile.MakeFxTracer()
        ) as cap:
            cap(torch.ones(2, 3))
    assert not (tmp_path / "i.py").exists()


def add_rows(x, y):
    return (x + y).relu()


def test_unbacked_dims_sharing_a_shape_id_must_agree_and_stay_within_bounds(tmp_path):
    import inspect

    from torch._dynamo.decorators import mark_unbacked

    if "max" not in inspect.signature(mark_unbacked).parameters:
        pytest.skip(f"torch {torch.__version__}'s mark_unbacked takes no min/max bounds")
    x, y = torch.randn(5, 4), torch.randn(5, 4)
    mark_unbacked(x, 0, shape_id="rows", min=2, max=64)
    mark_unbacked(y, 0, shape_id="rows")
    with precompile.capture(
        add_rows, artifact_path=tmp_path / "s.py", cache_path=tmp_path / "s.cache", tracer=precompile.MakeFxTracer()
    ) as cap:
        cap(x, y)
    runnable = precompile.load(tmp_path / "s.py", tmp_path / "s.cache")
    first, second = runnable.metadata.inputs
    assert first.unbacked[0].symbol == second.unbacked[0].symbol and first.unbacked[0].min == 2
    for n in (2, 7, 64):
        a, b = torch.randn(n, 4), torch.randn(n, 4)
        assert torch.allclose(runnable(a, b), add_rows(a, b))
    with pytest.raises(PrecompileError, match=r"input args\[1\] has size 6 in dim 0 but args\[0\] has 7 .* shape_id 'rows'"):
        runnable(torch.randn(7, 4), torch.randn(6, 4))
    with pytest.raises(PrecompileError, match=r"input args\[0\] has size 65 in dim 0, outside the mark_unbacked bounds \[2, 64\]"):
        runnable(torch.randn(65, 4), torch.randn(65, 4))


def test_a_marked_dim_inductor_must_guard_on_while_lowering_is_refused_naming_the_route(tmp_path):
    """GPT-2's graph traces with its batch marked, but Inductor's lowering views a tensor whose size
    holds the mark and must guard on it (`224*u0 < 2`): a refusal naming the guard, not torch's raw
    GuardOnDataDependentSymNode (its message names DynamoTracer's dynamic shapes)."""
    import transformers
    from torch._dynamo.decorators import mark_unbacked

    with torch.random.fork_rng():
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=99)
        config._attn_implementation = "eager"
        model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 99, (2, 7))
    mark_unbacked(ids, 0)
    options = dict(artifact_path=tmp_path / "g.py", cache_path=tmp_path / "g.cache", tracer=precompile.MakeFxTracer())
    # torch 2.13+ traces it and Inductor's lowering guards; torch 2.11's trace itself needs the size
    with pytest.raises(PrecompileError, match=r"(lowering the graph with Inductor|fn) needs to guard on a dim marked "
                                              r"with mark_unbacked.*u0"):
        with torch.no_grad(), precompile.capture(lambda m, i: m(i).logits, **options) as cap:
            cap(model, ids)
    assert not (tmp_path / "g.py").exists()
