"""Dynamo subgraphs compiled with Inductor are served the MakeFx way: each output module is called
directly through the kernel runtime (frozen kernels, no torch._inductor, no AOTAutograd), a training
subgraph's forward and backward modules through an autograd.Function in python_code; a training
subgraph whose AOTAutograd wrappers regenerate an aliased output keeps torch's fx GraphModule in the
Dynamo state, which load refuses to unpickle (it rebuilds itself from source), so capture refuses it."""
from __future__ import annotations

import ast

import pytest
import torch

import dynamo_cases
import precompile
from conftest import dynamo_modules_read, fresh_json
from precompile.examples.transformer import make_demo, run
from precompile.artifact.pair import parse_cache, read_python_code


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _capture(directory, name, fn, calls, grad, tracer=None):
    artifact, cache = directory / f"{name}.py", directory / f"{name}.cache"
    with torch.set_grad_enabled(grad), precompile.capture(
        fn, artifact_path=artifact, cache_path=cache, tracer=tracer or precompile.DynamoTracer(), backend="inductor"
    ) as cap:
        captured = [cap(*args) for args in calls]
    return artifact, captured


@pytest.fixture(scope="session")
def lowered(tmp_path_factory):
    """Inductor captures shared by the tests below (each compiles for seconds)."""
    directory = tmp_path_factory.mktemp("lowered")
    model, x = make_demo()
    train_model, _ = make_demo()
    train_model.train()
    mlp = _mlp()
    artifacts = {
        "demo": _capture(directory, "demo", run, [(model, x)], grad=False),
        "demo_train": _capture(directory, "demo_train", dynamo_cases.transformer_train_step, [(train_model, x)], grad=True),
        "mlp_break": _capture(directory, "mlp_break", dynamo_cases.train_with_break,
                              [(mlp, torch.ones(4, 8)), (mlp, torch.ones(6, 8))], grad=True,
                              tracer=precompile.DynamoTracer(dynamic=True)),
    }
    return directory, artifacts


def _subgraphs(artifact):
    return read_python_code(artifact).metadata.subgraphs


def test_each_subgraph_is_lowered_and_a_training_one_pairs_its_modules(lowered):
    _, artifacts = lowered
    for name in ("demo", "demo_train", "mlp_break"):
        assert {graph.served_by for graph in _subgraphs(artifacts[name][0])} == {"inductor_runtime"}, name
    assert [bool(graph.backward) for graph in _subgraphs(artifacts["demo_train"][0])] == [True, False]
    source = artifacts["mlp_break"][0].read_text(encoding="utf-8")
    (remainder,) = [line for line in source.splitlines() if line.startswith("# ") and "opaque-remainder:" in line]
    assert "AOTAutograd" not in remainder, remainder  # nothing left for AOTAutograd to wrap
    tree = ast.parse(source)
    bound = {node.targets[0].id: node.value for node in tree.body if isinstance(node, ast.Assign)
             and isinstance(node.targets[0], ast.Name)}
    for graph in _subgraphs(artifacts["mlp_break"][0]):
        call = bound[graph.forward]
        assert isinstance(call, ast.Call) and call.func.id == ("autograd_subgraph" if graph.backward else "inductor_subgraph")
    # the argmax the loss graph returns takes no gradient; dynamic sizes reach the backward module
    assert "non_differentiable=(1,)" in source


def test_a_subgraph_aotautograd_must_wrap_is_refused_at_capture_with_the_remedy(tmp_path):
    """Its Dynamo state would pickle torch's fx GraphModule, which rebuilds itself from source when
    unpickled: verify calls that code in an opaque blob and load refuses it, so nothing is written."""
    with pytest.raises(precompile.CaptureRefused, match=r"(?s)load refuses to unpickle: .*would import torch\."
                       r".*an output that aliases an input or another output.*\.clone\(\).*MakeFxTracer"):
        _capture(tmp_path, "aliased", dynamo_cases.weight_and_its_transpose,
                 [(torch.ones(3, 3, requires_grad=True), torch.ones(3, 3))], grad=True)
    assert not list(tmp_path.iterdir())



@pytest.mark.parametrize(("imported", "remedy"), [
    ("torch.fx.graph_module.reduce_graph_module", "return a copy of such an output (`.clone()`)"),
    ("torch._functorch._aot_autograd.functional_utils.ViewMetaSequence", "return a copy of such an output (`.clone()`)"),
    ("torch._dynamo.guards.GuardsStatePickler._unpickle_module", "define the class at module level"),
    ("torch._dynamo.guards.GuardsStatePickler._unpickle_code", f"torch {torch.__version__} writes it into the state"),
])
def test_a_refused_dynamo_state_gets_the_remedy_of_what_it_would_import(imported, remedy):
    """Only an import from AOTAutograd's graph says to clone an aliased output: the others would send
    the user after an output that is not there."""
    from precompile.capturing.pipeline import _unpicklable_remedy

    said = _unpicklable_remedy(f"_dynamo_state (line 9) would import {imported} at opcode offset 3 (STACK_GLOBAL)")
    assert remedy in said and "MakeFxTracer" in said
    assert ("AOTAutograd" in said) == imported.startswith(("torch.fx.", "torch._functorch."))

SERVE = r"""
import json, sys
import torch, precompile, dynamo_cases as dc
from precompile.examples.transformer import make_demo, run
directory = sys.argv[1]
before = set(sys.modules)
report = {}
def load(name):
    return precompile.load(f"{directory}/{name}.py", f"{directory}/{name}.cache")
def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
def same_grads(a, b):
    return all(torch.allclose(p.grad, q.grad, atol=1e-5) for p, q in zip(a.parameters(), b.parameters()))
with precompile.no_compilation():
    model, x = make_demo()
    with torch.no_grad():
        report["demo"] = torch.allclose(load("demo")(model, x), run(model, x), atol=1e-5)
    step = load("demo_train")
    served_model, eager_model = make_demo()[0].train(), make_demo()[0].train()
    losses = [(step(served_model, x).item(), dc.transformer_train_step(eager_model, x).item()) for _ in range(2)]
    report["demo_train"] = all(abs(a - b) < 1e-5 for a, b in losses) and same_grads(served_model, eager_model)
    # before mlp_break, whose own code calls torch._dynamo.graph_break() (which imports Dynamo)
    report["new modules"] = sorted(m for m in set(sys.modules) - before
                                   if m.startswith(("torch._dynamo", "torch._inductor", "torch._functorch")))
    report["absent"] = [m for m in ("torch._functorch.aot_autograd", "torch._inductor.compile_fx",
                                    "torch._inductor.async_compile", "torch._inductor.codecache") if m not in sys.modules]
    step = load("mlp_break")
    served_mlp, eager_mlp = mlp(), mlp()
    checks = []
    for n in (4, 6, 9):  # 9: served by the dynamic variant
        (loss, picked), (eager_loss, eager_picked) = step(served_mlp, torch.ones(n, 8)), dc.train_with_break(eager_mlp, torch.ones(n, 8))
        checks.append(torch.allclose(loss, eager_loss) and torch.equal(picked, eager_picked)
                      and not loss.requires_grad and same_grads(served_mlp, eager_mlp))
    report["mlp_break"] = checks
print(json.dumps(report))
"""


def test_lowered_artifacts_serve_like_eager_in_a_fresh_process_without_dynamo_inductor_or_aotautograd(lowered, tmp_path):
    directory, _ = lowered
    report = fresh_json(SERVE, str(directory), env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "empty")})
    assert report["demo"] is True
    assert report["demo_train"] is True  # two steps: losses and accumulated grads equal eager's
    assert report["mlp_break"] == [True, True, True]
    if any(dynamo_modules_read(directory / f"{name}.py") for name in ("demo", "demo_train")):
        assert "torch._dynamo" in report["new modules"]  # the bytecode itself reads a Dynamo polyfill module
    else:
        assert report["new modules"] == []
        assert len(report["absent"]) == 4


def test_the_capture_serves_what_the_artifact_will_run(lowered):
    """A capture call runs the lowered sections themselves: results and gradients equal eager's."""
    _, artifacts = lowered
    model, x = make_demo()
    with torch.no_grad():
        assert torch.allclose(artifacts["demo"][1][0], run(model, x), atol=1e-5)
    (loss, picked), _ = artifacts["mlp_break"][1]
    eager = _mlp()
    eager_loss, eager_picked = dynamo_cases.train_with_break(eager, torch.ones(4, 8))
    assert torch.allclose(loss, eager_loss) and torch.equal(picked, eager_picked)


def test_each_kernel_is_built_once_with_the_precompiled_header(lowered):
    """Lowering builds each kernel with precompiled headers; the capture then runs its sections on
    those libraries, found by source, rather than asking Inductor again under the served driver's
    build key (headers off), which would build every kernel a second time into the bundle."""
    _, artifacts = lowered
    built = 0
    for name, (artifact, _) in artifacts.items():
        cache = artifact.with_suffix(".cache")
        bundle = parse_cache(cache, cache.read_bytes()).envelope.bundle
        libraries = [f.path for f in bundle.files if f.kind == "kernel"]
        assert sorted(set(bundle.kernels.values())) == sorted(libraries), name
        assert bundle.provenance["precompiled_headers"] == "on", name
        built += len(libraries)
    assert built >= 4


def test_extract_reads_lowered_output_modules_without_running_them(lowered, tmp_path, capsys):
    from precompile.cli.main import main

    _, artifacts = lowered
    artifact = artifacts["demo_train"][0]
    assert main(["extract", str(artifact.with_suffix("")), str(tmp_path / "out")]) == 0
    capsys.readouterr()
    (graph_0, graph_1) = _subgraphs(artifact)
    names = sorted(p.stem for p in (tmp_path / "out/subgraphs").iterdir())
    assert names == sorted([graph_0.forward, graph_0.backward, graph_1.forward])
    for name in names:
        module = (tmp_path / "out/subgraphs" / f"{name}.py").read_text()
        assert "def call(self, args):" in module
        ast.parse(module)


def test_show_says_how_each_subgraph_is_served(lowered, capsys):
    from precompile.cli.main import main

    _, artifacts = lowered
    capsys.readouterr()
    assert main(["--color", "never", "show", str(artifacts["mlp_break"][0].with_suffix(""))]) == 0
    assert "served directly by the kernel runtime" in " ".join(capsys.readouterr().out.split())
