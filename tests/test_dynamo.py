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


def _capture(directory, name, fn, calls, tracer=None, grad=False):
    artifact, cache = directory / f"{name}.py", directory / f"{name}.cache"
    with torch.set_grad_enabled(grad), precompile.capture(
        fn, artifact_path=artifact, cache_path=cache, tracer=tracer or precompile.DynamoTracer()
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
    pairs = {
        "break": _capture(directory, "break", dynamo_cases.break_and_scale,
                          [((model, x4), {}), ((model, x4), {"scale": 3.0}), ((model, x6), {})]),
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
with precompile.no_compilation():
    served = load("break")
    checks = []
    for x, kw in [(torch.ones(4, 8), {}), (torch.ones(4, 8), {"scale": 3.0}), (torch.ones(6, 8), {}), (torch.ones(9, 8), {})]:
        with torch.no_grad():
            checks.append(torch.allclose(served(model, x, **kw), dc.break_and_scale(model, x, **kw), atol=1e-5))
    report["break"] = checks
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
    assert "no captured variant of 'break_and_scale' covers this call (2 captured)" in report["dtype miss"]
    assert "dtype mismatch. expected Float, actual Double" in report["dtype miss"]
    assert "GLOBAL_STATE changed: grad_mode" in report["grad miss"]
    assert report["keywords"] == [True, True]
    assert report["global"] is True and report["threads"] is True
    assert "no captured variant of 'uses_global' covers this call" in report["global miss"]
    assert "SCALE" in report["global miss"]


def test_summaries_of_real_captures(dynamo_pairs):
    _, pairs = dynamo_pairs
    summary = pairs["break"][2]
    assert str(summary).startswith("2 frames (1 from graph breaks), 5 guarded codes, 5 backend graphs, dropped guards {")
    assert summary.complete and not summary.risky_dropped_guards
    assert ("MODULE_MATCH", "G['torch']") in summary.dropped_guards
    assert ("TENSOR_MATCH", "x") in summary.kept_guards and ("TENSOR_MATCH", "model._parameters['weight']") in summary.kept_guards
    assert set(summary.kept_guards).isdisjoint(summary.dropped_guards)
    assert pairs["global"][2].frames == 1 and pairs["global"][2].resume_functions == 0


def test_python_code_states_what_was_captured_readably(dynamo_pairs):
    from precompile.schema.pair import read_python_code

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
    from precompile.cli import main

    directory, pairs = dynamo_pairs
    with pytest.raises(PrecompileError, match=r"dropped guards that matter \(1 frame .*RISKY drops \['TENSOR_MATCH x'\]"):
        _capture(tmp_path, "gated", dynamo_cases.uses_global, [((torch.ones(4, 8),), {})],
                 tracer=precompile.DynamoTracer(guard_filter_fn=drop_tensor_guards))
    assert not (tmp_path / "gated.py").exists()
    artifact, _, summary = _capture(
        tmp_path, "risky", dynamo_cases.uses_global, [((torch.ones(4, 8),), {})],
        tracer=precompile.DynamoTracer(guard_filter_fn=drop_tensor_guards, require_no_risky_drops=False),
    )
    assert summary.risky_dropped_guards == (("TENSOR_MATCH", "x"),)
    assert main(["--color", "never", "diff", str(directory / "global"), str(tmp_path / "risky")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("guards (")
    assert out[3] == "  ~ TENSOR_MATCH x: kept in uses_global#0 -> risky_dropped"
    assert main(["--color", "never", "guards", str(tmp_path / "risky")]) == 0
    assert "  - TENSOR_MATCH x (RISKY)" in capsys.readouterr().out


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
    with pytest.raises(PrecompileError, match="supports backend='inductor' only so far"):
        precompile.capture(dynamo_cases.uses_global, backend="eager", **options)


def test_two_dynamo_captures_may_not_overlap(tmp_path):
    first = precompile.capture(dynamo_cases.uses_global, artifact_path=tmp_path / "a.py", cache_path=tmp_path / "a.cache")
    second = precompile.capture(dynamo_cases.keyword_step, artifact_path=tmp_path / "b.py", cache_path=tmp_path / "b.cache")
    with pytest.raises(PrecompileError, match="nothing was captured"):
        with first:
            with pytest.raises(PrecompileError, match="another DynamoTracer capture is active"):
                second.__enter__()


LOAD_BESIDE_LIVE_COMPILE = r"""
import sys, torch, precompile, dynamo_cases as dc
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
with torch.no_grad():
    torch.compile(dc.break_and_scale)(model, torch.ones(4, 8))  # a live compile mints continuation names
try:
    precompile.load(sys.argv[1] + "/break.py", sys.argv[1] + "/break.cache")
    print("loaded")
except precompile.PrecompileError as exc:
    print("refused:", exc)
"""


def test_a_graph_breaking_artifact_refuses_to_load_beside_a_live_compile(dynamo_pairs):
    directory, _ = dynamo_pairs
    proc = run_fresh(LOAD_BESIDE_LIVE_COMPILE, str(directory))
    assert proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout and "load the artifact in a fresh process" in proc.stdout


def test_a_graph_break_inside_a_child_module_is_refused_with_the_frame_names(tmp_path):
    with pytest.raises(PrecompileError, match=r"reaches only by an ordinary call: \['forward \(dynamo_cases\)'.*installed"):
        _capture(tmp_path, "child", dynamo_cases.calls_child, [((dynamo_cases.BreakingBlock(), torch.ones(2, 8)), {})])
    assert not (tmp_path / "child.py").exists()


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
    import importlib

    (tmp_path / "edited_module.py").write_text(EDITED_MODULE.format(factor=2))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("edited_module")
    _capture(tmp_path, "edited", module.step, [((torch.ones(3),), {})])
    proc = run_fresh(LOAD_EDITED, str(tmp_path))
    assert proc.stdout.strip() == "loaded", proc.stderr
    (tmp_path / "edited_module.py").write_text(EDITED_MODULE.format(factor=3))
    proc = run_fresh(LOAD_EDITED, str(tmp_path))
    assert "refused:" in proc.stdout and "edited_module lines 1-3 changed since capture" in proc.stdout, proc.stderr


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


def test_a_training_step_serves_its_backward_and_accumulates_grads_like_eager(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    _capture(tmp_path, "train", dynamo_cases.train_step, [((model, torch.ones(4, 8)), {})], grad=True)
    report = fresh_json(TRAIN, str(tmp_path), env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "empty")})
    assert all(abs(a - b) < 1e-6 for a, b in report["losses"])
    assert report["grads"] is True  # two calls: .grad accumulated twice, as eager
    assert "GLOBAL_STATE changed: grad_mode" in report["miss"]


@pytest.mark.skipif(not torch.__version__.startswith("2.13."), reason="goldens are rendered by torch 2.13")
def test_readable_parts_of_a_dynamo_artifact_are_locked(dynamo_pairs, snapshot):
    """Header, metadata (frames, guard listings, summary) and driver; the opaque state differs per capture."""
    import re

    from snapshot_extensions import PythonSourceSnapshot

    _, pairs = dynamo_pairs
    source = pairs["break"][0].read_text(encoding="utf-8")
    readable = re.sub(r"(# 2\. Opaque state: [^\n]*\n# =+\n)_dynamo_state = \(.*?\n\)\n", r"\1<opaque state elided>\n", source, flags=re.S)
    readable = re.sub(r"pickled \(\d+ bytes, sha256 [0-9a-f]{64}\)", "pickled (<size>, <sha256>)", readable)
    assert "_dynamo_state" not in readable.split("# 3. Driver")[0]
    assert readable == snapshot.use_extension(PythonSourceSnapshot)


DYNAMIC = r"""
import json, sys, torch, precompile, dynamo_cases as dc
served = precompile.load(sys.argv[1] + "/dyn.py", sys.argv[1] + "/dyn.cache")
with torch.no_grad():
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
    fixtures = Path(__file__).resolve().parent.parent / "fixtures" / "v1"
    source = (fixtures / "dynamo_rows.py").read_text(encoding="utf-8")
    if replace:
        source = source.replace(*replace)
    (tmp_path / "rows.py").write_text(source, encoding="utf-8")
    return tmp_path / "rows.py", tmp_path / "absent.cache"


def test_loading_on_another_python_or_without_the_captured_module_is_refused(tmp_path):
    import warnings

    artifact, cache = _fixture_copy(tmp_path, ("PYTHON_VERSION = (3, 11)", "PYTHON_VERSION = (3, 10)"))
    with warnings.catch_warnings(), pytest.raises(PrecompileError, match=r"captured on Python 3.10 and this is Python 3.11"):
        warnings.simplefilter("ignore", precompile.PrecompileWarning)
        precompile.load(artifact, cache)
    artifact, cache = _fixture_copy(tmp_path)
    with warnings.catch_warnings(), pytest.raises(PrecompileError, match=r"module 'dynamo_models', which cannot be imported here"):
        warnings.simplefilter("ignore", precompile.PrecompileWarning)
        precompile.load(artifact, cache)


def test_dropped_slots_carry_their_rendered_check_without_process_ids(dynamo_pairs):
    _, pairs = dynamo_pairs
    rendered = {(t, s): check for t, s, check in pairs["break"][2].dropped_guard_code}
    assert rendered[("MODULE_MATCH", "G['torch']")].startswith("___check_obj_id(G['torch'], <id>)")
    assert set(rendered) <= set(pairs["break"][2].dropped_guards)


def test_wont_generalize_lists_bare_names_only_ever_pinned():
    from precompile.runtime.dynamo import wont_generalize
    from precompile.schema.metadata import VariantGuards

    def variants(*checks):
        return [VariantGuards(frame="f", variant=i, checks=c) for i, c in enumerate(checks)]

    assert wont_generalize(variants(("CONSTANT_MATCH scale", "TENSOR_MATCH x"), ("CONSTANT_MATCH scale",))) == ("scale",)
    assert wont_generalize(variants(("CONSTANT_MATCH scale",), ("TYPE_MATCH scale",))) == ()  # another variant serves any float
    assert wont_generalize(variants(("CONSTANT_MATCH self.eps",))) == ()  # not a bare name
