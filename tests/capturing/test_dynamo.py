"""DynamoTracer: multi-frame capture served standalone in a fresh process, guard accounting,
the summary and its gates, and the refusals. Captures are shared per session (Inductor compiles)."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

import dynamo_cases
import precompile
from conftest import fresh_json, run_fresh
from precompile import PrecompileError


def _capture(directory, name, fn, calls, tracer=None, grad=False, backend="eager"):
    """The eager backend unless a test is about Inductor: it compiles nothing, so it is fast."""
    artifact, cache = directory / f"{name}.py", directory / f"{name}.cache"
    with torch.set_grad_enabled(grad), precompile.capture(
        fn, artifact_path=artifact, cache_path=cache, tracer=tracer or precompile.DynamoTracer(), backend=backend
    ) as cap:
        for args, kwargs in calls:
            cap(*args, **kwargs)
        summary = cap.summary()
    return artifact, cache, summary


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 8)


@pytest.fixture(scope="session")
def dynamo_pairs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dynamo")
    model = _model()
    x4, x6 = torch.ones(4, 8), torch.ones(6, 8)
    break_calls = [((model, x4), {}), ((model, x4), {"scale": 3.0}), ((model, x6), {})]
    pairs = {
        "break": _capture(directory, "break", dynamo_cases.break_and_scale, break_calls, backend="inductor"),
        "break_eager": _capture(directory, "break_eager", dynamo_cases.break_and_scale, break_calls),
        "global": _capture(directory, "global", dynamo_cases.uses_global, [((x4,), {})]),
        "keywords": _capture(directory, "keywords", dynamo_cases.keyword_step,
                             [((x4,), {}), ((x4,), {"bias": torch.ones(8), "alpha": 2.0})]),
    }
    return directory, pairs


SERVE = r"""
import json, sys
import torch, precompile, dynamo_cases as dc
directory = sys.argv[1]
def load(name):
    return precompile.load(f"{directory}/{name}.py", f"{directory}/{name}.cache")
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
report = {}
from torch._inductor import cpu_vec_isa
probes, build = [], cpu_vec_isa.VecISA.check_build
cpu_vec_isa.VecISA.check_build = lambda isa, code: probes.append(str(isa)) or build(isa, code)
with precompile.no_compilation():
    served = load("break")
    report["isa probes"] = probes  # the bundle fits this host: the producer's ISA list stands
    checks = []
    for x, kw in [(torch.ones(4, 8), {}), (torch.ones(4, 8), {"scale": 3.0}), (torch.ones(6, 8), {}), (torch.ones(9, 8), {})]:
        with torch.no_grad():
            checks.append(torch.allclose(served(model, x, **kw), dc.break_and_scale(model, x, **kw), atol=1e-5))
    report["break"] = checks
    with torch.no_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        # the invariance policy took the saved-tensors-hooks check out of every variant
        report["hooks"] = torch.allclose(served(model, torch.ones(4, 8)), dc.break_and_scale(model, torch.ones(4, 8)))
    eager_backend = load("break_eager")
    with torch.no_grad():
        report["break_eager"] = [
            torch.allclose(eager_backend(model, x, **kw), dc.break_and_scale(model, x, **kw), atol=1e-5)
            for x, kw in [(torch.ones(4, 8), {}), (torch.ones(4, 8), {"scale": 3.0}), (torch.ones(9, 8), {})]
        ]
    try:
        with torch.no_grad():
            served(model, torch.ones(4, 8).double())
    except precompile.PrecompileError as exc:
        report["dtype miss"] = str(exc)
    try:
        served(model, torch.ones(4, 8))  # grad enabled: captured under no_grad
    except precompile.PrecompileError as exc:
        report["grad miss"] = str(exc)
    torch.set_grad_enabled(False)  # the rest was captured under no_grad
    keywords = load("keywords")
    x, bias = torch.ones(4, 8), torch.ones(8)
    report["keywords"] = [torch.allclose(keywords(x), dc.keyword_step(x)),
                          torch.allclose(keywords(x, bias=bias, alpha=2.0), dc.keyword_step(x, bias=bias, alpha=2.0))]
    glob = load("global")
    report["global"] = torch.allclose(glob(x), dc.uses_global(x))
    torch.set_num_threads(1)  # the GLOBAL_STATE guard must not pin the thread count
    report["threads"] = torch.allclose(glob(x), dc.uses_global(x))
    dc.SCALE = 5.0  # rebinding a global the graph baked in: the call must miss, not serve stale code
    try:
        glob(x)
    except precompile.PrecompileError as exc:
        report["global miss"] = str(exc)
print(json.dumps(report))
"""


def test_fresh_process_serves_every_variant_and_misses_clearly(dynamo_pairs, tmp_path):
    directory, _ = dynamo_pairs
    report = fresh_json(SERVE, str(directory), env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "empty")})
    assert report["break"] == [True, True, True, True]  # x9 is served by the dynamic-shape variant
    assert report["isa probes"] == []
    assert report["break_eager"] == [True, True, True]
    assert report["hooks"] is True
    assert "no captured variant of 'break_and_scale' covers this call (2 captured)" in report["dtype miss"]
    assert "dtype mismatch. expected Float, actual Double" in report["dtype miss"]
    assert "GLOBAL_STATE changed: grad_mode" in report["grad miss"]
    assert report["keywords"] == [True, True]
    assert report["global"] is True and report["threads"] is True
    assert "no captured variant of 'uses_global' covers this call" in report["global miss"]
    assert "SCALE" in report["global miss"]


WITHOUT_CACHE = r"""
import json, sys, warnings, torch, precompile, dynamo_cases as dc
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    served = precompile.load(sys.argv[1] + "/break.py", sys.argv[1] + "/no-such.cache")
with torch.no_grad(), precompile.no_compilation():  # C++ kernel builds are not gated; Dynamo/Inductor are
    close = [torch.allclose(served(model, torch.ones(n, 8)), dc.break_and_scale(model, torch.ones(n, 8))) for n in (4, 9)]
print(json.dumps({"close": close, "warnings": [str(w.message) for w in caught if w.category is precompile.PrecompileWarning]}))
"""


def test_an_inductor_dynamo_artifact_serves_without_its_cache_from_python_code_alone(dynamo_pairs, tmp_path):
    directory, _ = dynamo_pairs
    report = fresh_json(WITHOUT_CACHE, str(directory), env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "empty")})
    assert report["close"] == [True, True]
    assert len(report["warnings"]) == 1 and report["warnings"][0].startswith("ignoring the cache:")


def test_extract_writes_each_inductor_output_module_as_its_own_file(dynamo_pairs, tmp_path, capsys):
    import ast

    from precompile.cli.main import main
    from precompile.artifact.pair import read_python_code

    directory, pairs = dynamo_pairs
    assert main(["extract", str(directory / "break"), str(tmp_path / "out")]) == 0
    capsys.readouterr()
    meta = read_python_code(pairs["break"][0]).metadata
    names = sorted(graph.forward for graph in meta.subgraphs)
    assert sorted(p.stem for p in (tmp_path / "out/subgraphs").iterdir()) == names  # no grad: no backward modules
    module = (tmp_path / "out/subgraphs" / f"{names[0]}.py").read_text()
    assert "def call(self, args):" in module and "async_compile.wait(globals())" in module
    ast.parse(module)  # a module file, as Inductor wrote it


TAIL_IN_PYTHON = r"""
import json, sys, torch, precompile, dynamo_cases as dc
served = precompile.load(sys.argv[1] + "/tail.py", sys.argv[1] + "/tail.cache")
with torch.no_grad(), precompile.no_compilation():
    y, k = served(torch.ones(3))
    dc.LIMITS["k"] = 10  # plain Python reads it live, as it did during capture
    _, k_after = served(torch.ones(3))
print(json.dumps({"y": torch.allclose(y, torch.ones(3).sin()), "k": [k, k_after]}))
"""


def test_a_continuation_that_compiled_nothing_runs_as_plain_python(tmp_path, capsys):
    from precompile.cli.main import main
    from precompile.artifact.pair import read_python_code

    artifact, _, summary = _capture(tmp_path, "tail", dynamo_cases.tail_in_python, [((torch.ones(3),), {})])
    assert summary.complete and summary.frames == 2 and summary.guarded_codes == 1 and not summary.uncovered_frames
    frames = read_python_code(artifact).metadata.frames
    assert [(f.variants, f.runs_as_python) for f in frames] == [(1, False), (0, True)]
    assert fresh_json(TAIL_IN_PYTHON, str(tmp_path)) == {"y": True, "k": [4, 11]}
    assert main(["--color", "never", "show", str(tmp_path / "tail")]) == 0
    assert "runs as plain Python (compiled nothing) (continuation called as __precompile_" in capsys.readouterr().out


def test_summaries_of_real_captures(dynamo_pairs):
    _, pairs = dynamo_pairs
    summary = pairs["break"][2]
    # Every identity guard Dynamo cannot serialize is checked by name here (modules, builtins,
    # graph_break), so nothing is dropped but what the invariance policy takes out.
    assert str(summary) == "2 frames (1 from graph breaks), 5 guarded codes, 5 backend graphs, 1 policy-dropped guard"
    assert summary.complete and not summary.risky_dropped_guards and summary.dropped_guards == ()
    assert ("MODULE_MATCH", "G['torch']") in summary.kept_guards
    assert ("CLOSURE_MATCH", "G['torch']._dynamo.graph_break") in summary.kept_guards
    assert ("TENSOR_MATCH", "x") in summary.kept_guards and ("TENSOR_MATCH", "model._parameters['weight']") in summary.kept_guards
    assert set(summary.kept_guards).isdisjoint(summary.dropped_guards)
    assert pairs["global"][2].frames == 1 and pairs["global"][2].resume_functions == 0


def test_python_code_states_what_was_captured_readably(dynamo_pairs):
    from precompile.artifact.pair import read_python_code

    _, pairs = dynamo_pairs
    meta = read_python_code(pairs["break"][0]).metadata
    assert meta.serving_mode == "standalone" and meta.fn_module == "dynamo_cases"
    assert [(f.name, f.variants) for f in meta.frames][0] == ("break_and_scale", 2)
    assert meta.frames[1].resume_names and meta.frames[1].variants == 3
    assert any(check == "TENSOR_MATCH x" for check in meta.guards[0].checks)
    assert meta.inlined_sources and meta.inlined_sources[0].module == "dynamo_cases"
    assert str(meta.summary) == str(pairs["break"][2])


def drop_tensor_guards(entries):
    return [entry.guard_type != "TENSOR_MATCH" for entry in entries]


def test_risky_drops_are_gated_and_diff_shows_them_first(dynamo_pairs, tmp_path, capsys):
    from precompile.cli.main import main

    directory, pairs = dynamo_pairs
    drop_scale = functools.partial(_drop_named, "SCALE")
    with pytest.raises(PrecompileError, match=r"dropped guards that matter \(1 frame .*RISKY drops \[\"\w+ G\['SCALE'\]\"\]"):
        _capture(tmp_path, "gated", dynamo_cases.uses_global, [((torch.ones(4, 8),), {})],
                 tracer=precompile.DynamoTracer(guard_filter_fn=drop_scale))
    assert not (tmp_path / "gated.py").exists()
    # A drop that neither told variants apart nor hangs off configuration is listed, not refused.
    artifact, _, summary = _capture(
        tmp_path, "dropped", dynamo_cases.uses_global, [((torch.ones(4, 8),), {})],
        tracer=precompile.DynamoTracer(guard_filter_fn=drop_tensor_guards),
    )
    assert ("TENSOR_MATCH", "x") in summary.dropped_guards and summary.risky_dropped_guards == ()
    assert main(["--color", "never", "diff", str(directory / "global"), str(tmp_path / "dropped")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("guards (")
    assert any(line.startswith("  ~ TENSOR_MATCH x: kept in uses_global#0 -> dropped") for line in out), out
    # what the dropped guard checked is no longer checked of that input
    assert "  - x: kept in uses_global#0: Tensor torch.float32 on cpu, size (4, 8), stride (8, 1), requires_grad=False" in out
    _capture(tmp_path, "risky", dynamo_cases.uses_global, [((torch.ones(4, 8),), {})],
             tracer=precompile.DynamoTracer(guard_filter_fn=drop_scale, require_no_risky_drops=False))
    assert main(["--color", "never", "diff", str(directory / "global"), str(tmp_path / "risky")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[3].startswith("  ~ CONSTANT_MATCH G['SCALE']: kept in uses_global#0: ") and out[3].endswith("-> risky_dropped: G['SCALE'] == 2.0"), out  # the risky drop first
    assert main(["--color", "never", "guards", str(tmp_path / "risky")]) == 0
    assert "G['SCALE'] (RISKY)" in capsys.readouterr().out


def _drop_named(name, entries):
    return [name not in entry.name for entry in entries]


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda x: x, "cannot capture a lambda"),
        (functools.partial(dynamo_cases.uses_global), "not a functools.partial"),
        (torch.nn.Linear(2, 2), "CALLS the model, not the model itself"),
        (dynamo_cases.uses_global.__get__(1), "captures a Python function, got method"),
    ],
)
def test_functions_a_standalone_artifact_cannot_rebuild_are_refused_up_front(tmp_path, fn, message):
    with pytest.raises(PrecompileError, match=message):
        precompile.capture(fn, artifact_path=tmp_path / "m.py", cache_path=tmp_path / "m.cache")


def test_closures_nested_and_main_functions_are_refused(tmp_path):
    scale = 2.0

    def closure(x):
        return x * scale

    def nested(x):
        return x

    options = dict(artifact_path=tmp_path / "m.py", cache_path=tmp_path / "m.cache")
    with pytest.raises(PrecompileError, match=r"closes over \['scale'\]"):
        precompile.capture(closure, **options)
    with pytest.raises(PrecompileError, match="a nested function; define it at module level"):
        precompile.capture(nested, **options)
    exec_namespace = {"__name__": "__main__"}
    exec("def step(x):\n    return x\n", exec_namespace)
    with pytest.raises(PrecompileError, match="defined in __main__, which a serving process cannot import"):
        precompile.capture(exec_namespace["step"], **options)


def test_nothing_else_compiled_in_the_block_leaks_into_the_artifact(tmp_path):
    from precompile.artifact.pair import read_python_code

    other = torch.compile(dynamo_cases.keyword_step, backend="eager")
    with torch.no_grad(), precompile.capture(dynamo_cases.uses_global, artifact_path=tmp_path / "m.py",
                                             cache_path=tmp_path / "m.cache", backend="eager") as cap:
        other(torch.ones(3))
        cap(torch.ones(3))
        other(torch.ones(5), alpha=3.0)
    meta = read_python_code(tmp_path / "m.py").metadata
    assert [frame.name for frame in meta.frames] == ["uses_global"]
    assert {graph.frame for graph in meta.subgraphs} == {"uses_global"} and meta.summary.backend_graphs == 1


def test_two_dynamo_captures_may_not_overlap(tmp_path):
    first = precompile.capture(dynamo_cases.uses_global, artifact_path=tmp_path / "a.py", cache_path=tmp_path / "a.cache")
    second = precompile.capture(dynamo_cases.keyword_step, artifact_path=tmp_path / "b.py", cache_path=tmp_path / "b.cache")
    with pytest.raises(PrecompileError, match="nothing was captured"):
        with first:
            with pytest.raises(PrecompileError, match="another DynamoTracer capture is active"):
                second.__enter__()


def test_a_capture_that_fails_to_start_leaves_no_capture_active(tmp_path, monkeypatch):
    def broken_reset():
        raise RuntimeError("reset failed")

    monkeypatch.setattr(torch._dynamo, "reset", broken_reset)
    with pytest.raises(RuntimeError, match="reset failed"):
        with precompile.capture(dynamo_cases.uses_global, artifact_path=tmp_path / "a.py",
                                cache_path=tmp_path / "a.cache", backend="eager"):
            pass
    monkeypatch.undo()
    artifact, _, summary = _capture(tmp_path, "b", dynamo_cases.uses_global, [((torch.ones(3),), {})])
    assert artifact.exists() and summary.complete  # not "another DynamoTracer capture is active"


LOAD_BESIDE_LIVE_COMPILE = r"""
import json, re, sys, torch, precompile, dynamo_cases as dc
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
with torch.no_grad():
    live = torch.compile(dc.break_and_scale)(model, torch.ones(4, 8))  # a live compile mints continuation names
    served = precompile.load(sys.argv[1] + "/break.py", sys.argv[1] + "/break.cache")
    report = {"served": torch.allclose(served(model, torch.ones(4, 8)), live, atol=1e-5),
              "live again": torch.allclose(torch.compile(dc.break_and_scale)(model, torch.ones(4, 8)), live)}
# A name the artifact must bind, already bound to something else, is still refused.
source = open(sys.argv[1] + "/break_eager.py", encoding="utf-8").read()
taken = re.search(r"__precompile_[0-9a-f]{12}_resume_\d+_\d+", source).group(0)
setattr(dc, taken, object())
try:
    precompile.load(sys.argv[1] + "/break_eager.py", sys.argv[1] + "/break_eager.cache")
    report["taken"] = "loaded"
except precompile.PrecompileError as exc:
    report["taken"] = str(exc)
print(json.dumps(report))
"""


def test_a_graph_breaking_artifact_serves_beside_a_live_compile_and_never_clobbers_a_bound_name(dynamo_pairs):
    """The artifact's minted names are its own (renamed at capture), so a live compile that minted
    Dynamo's names first does not stop it; a name of its own bound to something else still does."""
    directory, _ = dynamo_pairs
    report = fresh_json(LOAD_BESIDE_LIVE_COMPILE, str(directory))
    assert report["served"] is True and report["live again"] is True
    assert "already binds" in report["taken"] and "load the artifact in a fresh process" in report["taken"]


LIVE_COMPILE_AFTER_LOAD = r"""
import json, re, sys, torch, precompile, dynamo_cases as dc
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
x = torch.ones(4, 8)
served = precompile.load(sys.argv[1] + "/break_eager.py", sys.argv[1] + "/break_eager.cache")
seeded = [name for name in vars(dc) if name.startswith("__precompile_")]
dynamo_named = [name for name in vars(dc) if re.match(r"__(?:builtins_dict__|resume_at_\d+|compiled_fn)_\d+", name)]
with torch.no_grad():
    live = torch.compile(dc.break_and_scale, backend="eager")(model, x * 2)  # mints continuations too
    again = served(model, x)
print(json.dumps({"seeded": len(seeded), "dynamo named": dynamo_named,
                  "live": torch.allclose(live, dc.break_and_scale(model, x * 2)),
                  "served": torch.allclose(again, dc.break_and_scale(model, x))}))
"""


def test_a_live_compile_after_loading_never_mints_a_name_the_artifact_holds(dynamo_pairs):
    """Every name the artifact seeds is prefixed by the artifact: none is a name Dynamo's counter mints."""
    directory, _ = dynamo_pairs
    report = fresh_json(LIVE_COMPILE_AFTER_LOAD, str(directory))
    assert report["seeded"] >= 3 and report["dynamo named"] == []
    assert report["live"] is True and report["served"] is True


def test_the_eager_backend_renders_a_small_tensor_constant_as_a_literal(tmp_path):
    """(Large ones are refused: tests/capturing/test_constants.py.)"""
    artifact, _, _ = _capture(tmp_path, "constant", dynamo_cases.adds_a_constant, [((torch.ones(2),), {})])
    assert "torch.tensor([1.0, 2.0], dtype = torch.float32" in artifact.read_text()


EDITED_MODULE = "def step(x):\n    return x.sin() * {factor}\n"

LOAD_EDITED = r"""
import sys, precompile
sys.path.insert(0, sys.argv[1])
try:
    precompile.load(sys.argv[1] + "/edited.py", sys.argv[1] + "/edited.cache")
    print("loaded")
except precompile.PrecompileError as exc:
    print("refused:", exc)
"""


def test_an_inlined_source_that_changed_since_capture_is_refused_at_load(tmp_path, monkeypatch):
    """A file whose inlined spans are unchanged passes by their hash; any other file has its inlined
    ranges hashed line by line, so an edit elsewhere in the file still serves, even one that moves the
    spans or shifts a range's text to other lines (the same code), and an edit inside a range refuses."""
    import hashlib
    import importlib

    from precompile.artifact.metadata import InlinedFile
    from precompile.artifact.pair import read_python_code

    (tmp_path / "edited_module.py").write_text(EDITED_MODULE.format(factor=2))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("edited_module")
    artifact, _, _ = _capture(tmp_path, "edited", module.step, [((torch.ones(3),), {})])
    captured_bytes = (tmp_path / "edited_module.py").read_bytes()
    span = (0, len(captured_bytes))  # the two lines of step are the whole file
    assert InlinedFile(module="edited_module", sha256=hashlib.sha256(captured_bytes).hexdigest(), spans=(span,)) in (
        read_python_code(artifact).metadata.inlined_files)
    proc = run_fresh(LOAD_EDITED, str(tmp_path))
    assert proc.stdout.strip() == "loaded", proc.stderr
    (tmp_path / "edited_module.py").write_text(EDITED_MODULE.format(factor=2) + "# edited after capture\n")
    proc = run_fresh(LOAD_EDITED, str(tmp_path))
    assert proc.stdout.strip() == "loaded", proc.stderr
    (tmp_path / "edited_module.py").write_text("# a line above moves step's lines\n" + EDITED_MODULE.format(factor=2))
    proc = run_fresh(LOAD_EDITED, str(tmp_path))
    assert proc.stdout.strip() == "loaded", proc.stderr
    (tmp_path / "edited_module.py").write_text(EDITED_MODULE.format(factor=3))
    proc = run_fresh(LOAD_EDITED, str(tmp_path))
    assert "refused:" in proc.stdout and "edited_module.step (lines 1-2 at capture) changed since capture" in proc.stdout, proc.stderr


TRAIN = r"""
import json, sys, torch, precompile, dynamo_cases as dc
torch.manual_seed(0)
served_model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
torch.manual_seed(0)
eager_model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
step = precompile.load(sys.argv[1] + "/train.py", sys.argv[1] + "/train.cache")
x = torch.ones(4, 8)
with precompile.no_compilation():
    losses = [(step(served_model, x).item(), dc.train_step(eager_model, x).item()) for _ in range(2)]
grads = all(torch.allclose(a.grad, b.grad) for a, b in zip(served_model.parameters(), eager_model.parameters()))
try:
    with torch.no_grad():
        step(served_model, x)
    miss = ""
except precompile.PrecompileError as exc:
    miss = str(exc)
print(json.dumps({"losses": losses, "grads": grads, "miss": miss}))
"""


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_a_training_step_serves_its_backward_and_accumulates_grads_like_eager(tmp_path, backend):
    from precompile.artifact.pair import read_python_code

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    artifact, _, _ = _capture(tmp_path, "train", dynamo_cases.train_step, [((model, torch.ones(4, 8)), {})],
                              grad=True, backend=backend)
    report = fresh_json(TRAIN, str(tmp_path), env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "empty")})
    assert all(abs(a - b) < 1e-6 for a, b in report["losses"])
    assert report["grads"] is True  # two calls: .grad accumulated twice, as eager
    assert "GLOBAL_STATE changed: grad_mode" in report["miss"]
    subgraphs = read_python_code(artifact).metadata.subgraphs
    # Inductor lowers the loss graph's backward into python_code beside its forward (the continuation
    # after .backward() only detaches); eager's ATen ops carry autograd themselves.
    assert [bool(graph.backward) for graph in subgraphs] == [backend == "inductor", False]


SERVE_EDITED = r"""
import json, sys, torch, precompile, dynamo_cases as dc
artifact = sys.argv[1]
source = open(artifact).read()
edited = source
for original, edit in zip(sys.argv[3::2], sys.argv[4::2]):
    edited = edited.replace(original, edit)
assert edited != source
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
x = torch.ones(4, 8)
with torch.no_grad():
    if sys.argv[2] == "as captured":
        served = precompile.load(artifact, artifact[:-3] + ".cache")  # primes the kernel cache dir
    else:
        namespace = {"__file__": "edited.py"}
        exec(compile(edited, "edited.py", "exec"), namespace)
        served = namespace["forward"]
    out = served(model, x)
    try:  # another artifact of the same function cannot share this process
        exec(compile(edited if sys.argv[2] == "as captured" else source, "other.py", "exec"), {"__file__": "other.py"})
        refused = ""
    except precompile.PrecompileError as exc:
        refused = str(exc)
print(json.dumps({"captured": torch.allclose(out, dc.break_and_scale(model, x)),
                  "cos": torch.allclose(out, (model(x) * 2.0).cos()), "other artifact": refused}))
"""


@pytest.mark.parametrize(
    ("name", "edits"),
    [
        ("break_eager", ["torch.ops.aten.sin.default", "torch.ops.aten.cos.default"]),
        ("break", [".sin()", ".cos()", "std::sin(", "std::cos("]),
    ],
)
def test_what_serves_is_the_subgraph_source_python_code_shows(dynamo_pairs, tmp_path, name, edits):
    """Edit a subgraph's source in python_code (sin -> cos) and the edit is what runs, from a kernel
    cache dir the unedited artifact warmed: nothing comes from a compile cache or the pickle."""
    directory, _ = dynamo_pairs
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    artifact = str(directory / f"{name}.py")
    captured = fresh_json(SERVE_EDITED, artifact, "as captured", *edits, env=env)
    edited = fresh_json(SERVE_EDITED, artifact, "edited", *edits, env=env)
    assert (captured["captured"], captured["cos"]) == (True, False)
    assert (edited["captured"], edited["cos"]) == (False, True)
    for report in (captured, edited):
        assert "already binds" in report["other artifact"] and "load the artifact in a fresh process" in report["other artifact"]


def test_readable_parts_of_a_dynamo_artifact_are_locked(dynamo_pairs, snapshot):
    """Header, metadata (frames, guard listings, summary) and driver; the opaque state differs per capture."""
    import re

    from snapshot_extensions import TorchVersionedSource

    from precompile.inspect.diff.process_ids import mask_process_ids

    _, pairs = dynamo_pairs
    source = pairs["break_eager"][0].read_text(encoding="utf-8")
    # Marshalled code is elided (its bytes follow the interpreter's marshal), the blobs' comments stay.
    readable = re.sub(r"(\n    # [^\n]*\n    '[0-9.]+': \()\n(?:        '[^']*'\n)+    \),", r"\1<marshalled code elided>),", source)
    readable = mask_process_ids(readable)  # the one mask `precompile diff` uses too
    readable = re.sub(r"(\d+ bytes, sha256 )[0-9a-f]{64}", r"\1<sha256>", readable)
    # File hashes and span offsets change with edits to dynamo_cases.py; the modules and span counts stay locked.
    readable = re.sub(r"^INLINED_FILES = .*?\n(?=[A-Z_]+ = )",
                      lambda block: re.sub(r"\(\d+, \d+\)", "(<start>, <end>)", re.sub(r"[0-9a-f]{64}", "<file sha256>", block.group(0))),
                      readable, flags=re.S | re.M)
    assert "INLINED_FILES = ({'module': 'dynamo_cases',\n  'sha256': '<file sha256>',\n  'spans': ((<start>, <end>), (<start>, <end>))}" in readable
    assert "\n_dynamo_state = None\n" in readable  # nothing is pickled: every guard rendered, code marshalled
    assert readable == snapshot.use_extension(TorchVersionedSource)


DYNAMIC = r"""
import json, sys, torch, precompile, dynamo_cases as dc
served = precompile.load(sys.argv[1] + "/dyn.py", sys.argv[1] + "/dyn.cache")
with torch.no_grad(), precompile.no_compilation():
    print(json.dumps([torch.allclose(served(torch.ones(n, 3)), dc.uses_global(torch.ones(n, 3))) for n in (2, 5, 40)]))
"""


def test_dynamic_true_serves_other_sizes_from_one_variant(tmp_path):
    _, _, summary = _capture(tmp_path, "dyn", dynamo_cases.uses_global, [((torch.ones(4, 3),), {})],
                             tracer=precompile.DynamoTracer(dynamic=True))
    assert summary.guarded_codes == 1
    assert fresh_json(DYNAMIC, str(tmp_path)) == [True, True, True]


def test_a_frame_past_recompile_limit_runs_eager_and_is_listed_as_truncated(tmp_path):
    calls = [((torch.ones(n, 3),), {}) for n in (2, 3, 4)]
    artifact, _, summary = _capture(tmp_path, "limit", dynamo_cases.uses_global, calls,
                                    tracer=precompile.DynamoTracer(recompile_limit=1, dynamic=False))
    assert artifact.exists()  # the limit is the caller's choice: no gate refuses it
    assert summary.truncated == ("uses_global (dynamo_cases.py:15)",)
    assert ">=1 TRUNCATED: ['uses_global (dynamo_cases.py:15)']" in str(summary) and not summary.complete


def _fixture_copy(tmp_path, replace=None):
    fixtures = Path(__file__).resolve().parent.parent.parent / "fixtures" / "v1"
    source = (fixtures / "dynamo_rows.py").read_text(encoding="utf-8")
    if replace:
        source = source.replace(*replace)
    (tmp_path / "rows.py").write_text(source, encoding="utf-8")
    return tmp_path / "rows.py", tmp_path / "absent.cache"


def test_loading_on_another_python_or_torch_or_without_the_captured_module_is_refused(tmp_path):
    import warnings

    artifact, cache = _fixture_copy(tmp_path, ("PYTHON_VERSION = (3, 11)", "PYTHON_VERSION = (3, 10)"))
    with warnings.catch_warnings(), pytest.raises(PrecompileError, match=r"captured on Python 3.10 and this is Python 3.11"):
        warnings.simplefilter("ignore", precompile.PrecompileWarning)
        precompile.load(artifact, cache)
    artifact, cache = _fixture_copy(tmp_path, ("TORCH_VERSION = '2.13.0+cpu'", "TORCH_VERSION = '2.12.1+cu126'"))
    with warnings.catch_warnings(), pytest.raises(
        PrecompileError, match=r"captured with torch 2\.12\.1\+cu126 and this is torch .*serve it with that torch"
    ):
        warnings.simplefilter("ignore", precompile.PrecompileWarning)
        precompile.load(artifact, cache)
    artifact, cache = _fixture_copy(tmp_path, ("TORCH_VERSION = '2.13.0+cpu'", f"TORCH_VERSION = {torch.__version__!r}"))
    with warnings.catch_warnings(), pytest.raises(PrecompileError, match=r"module 'dynamo_models', which cannot be imported here"):
        warnings.simplefilter("ignore", precompile.PrecompileWarning)
        precompile.load(artifact, cache)


def test_dropped_slots_carry_their_rendered_check_without_process_ids(dynamo_pairs):
    _, pairs = dynamo_pairs
    from precompile.capturing.dynamo.guard_accounting import render_check

    rendered = {(t, s): check for t, s, check in pairs["break"][2].dropped_guard_code}
    assert rendered[("AUTOGRAD_SAVED_TENSORS_HOOKS", "")].endswith("top_saved_tensors_hooks ids == None")
    assert set(rendered) <= {*pairs["break"][2].dropped_guards, *pairs["break"][2].policy_dropped_guards}
    assert render_check("___check_obj_id(G['torch'], 140234567890123)") == "___check_obj_id(G['torch'], <id>)"


def test_guard_slots_are_accounted_per_variant_and_the_policy_drops_what_every_variant_held(dynamo_pairs):
    from precompile.artifact.pair import read_python_code

    _, pairs = dynamo_pairs
    summary = pairs["break"][2]
    assert summary.policy_dropped_guards == (("AUTOGRAD_SAVED_TENSORS_HOOKS", ""),)
    assert "1 policy-dropped guard" in str(summary)
    assert ("AUTOGRAD_SAVED_TENSORS_HOOKS", "") not in summary.kept_guards
    variants = read_python_code(pairs["break"][0]).metadata.guards
    assert all(v.policy_dropped == ("AUTOGRAD_SAVED_TENSORS_HOOKS",) for v in variants)
    assert not any(check.startswith("AUTOGRAD_SAVED_TENSORS_HOOKS") for v in variants for check in v.checks)
    entry = [v for v in variants if v.frame == "break_and_scale"]
    resume = [v for v in variants if v.frame != "break_and_scale"]
    # The entry looked up torch._dynamo.graph_break; the continuation never touched the torch module.
    # Dynamo cannot serialize those identity guards: each variant checks them by name instead.
    assert all("MODULE_MATCH G['torch'] is torch:" in v.by_name for v in entry)
    assert all("CLOSURE_MATCH G['torch']._dynamo.graph_break is torch._dynamo.decorators:graph_break" in v.by_name
               for v in entry)
    assert all("MODULE_MATCH G['torch']" in v.checks and not v.dropped for v in entry)
    assert not any(line.startswith("MODULE_MATCH G['torch']") for v in resume for line in v.by_name)


def test_precompile_guards_lists_what_each_variant_does_not_check(dynamo_pairs, capsys):
    from precompile.cli.main import main

    directory, _ = dynamo_pairs
    assert main(["--color", "never", "guards", str(directory / "break_eager"), "--frame", "break_and_scale"]) == 0
    out = capsys.readouterr().out
    assert "frame break_and_scale variant 1: kept " in out
    assert "  kept           MODULE_MATCH     G['torch']" in out  # checked by name
    assert "  policy_dropped AUTOGRAD_SAVED_TENSORS_HOOKS   torch._functorch.aot_autograd.utils.top_saved_tensors_hooks" in out
    assert "  - AUTOGRAD_SAVED_TENSORS_HOOKS\n" in out  # under "NOT checked"


def test_the_policy_drops_only_eligible_slots_identical_in_every_variant():
    from precompile.capturing.dynamo.guard_accounting import policy_drops

    hooks, builtin, tensor = ("AUTOGRAD_SAVED_TENSORS_HOOKS", ""), ("BUILTIN_MATCH", "G['len']"), ("TENSOR_MATCH", "x")
    assert policy_drops([{hooks: "none", tensor: "t"}, {hooks: "none", tensor: "t"}]) == {hooks}
    assert policy_drops([{builtin: "id 1"}, {builtin: "id 2"}]) == set()  # told the variants apart
    assert policy_drops([{builtin: "id 1"}, {}]) == set()  # not held by every variant
    assert policy_drops([{tensor: "t"}]) == set()  # shape-bearing: never eligible
    assert policy_drops([]) == set()


def test_wont_generalize_lists_bare_names_only_ever_pinned():
    from precompile.capturing.dynamo.guard_accounting import wont_generalize
    from precompile.artifact.metadata import VariantGuards

    def variants(*checks):
        return [VariantGuards(frame="f", variant=i, checks=c) for i, c in enumerate(checks)]

    assert wont_generalize(variants(("CONSTANT_MATCH scale", "TENSOR_MATCH x"), ("CONSTANT_MATCH scale",))) == ("scale",)
    assert wont_generalize(variants(("CONSTANT_MATCH scale",), ("TYPE_MATCH scale",))) == ()  # another variant serves any float
    assert wont_generalize(variants(("CONSTANT_MATCH self.eps",))) == ()  # not a bare name
