"""A MakeFx artifact serves what fn computes or refuses: a tensor that existed before the call is
refused at capture whatever its size, and every Python value the trace read (torch's global state,
model attributes down to plain objects, module globals) is checked on each served call, naming both
values; what a served call cannot reach (a closure cell) is warned about and listed, not checked."""
from __future__ import annotations

import ast
import json
import warnings

import pytest
import state_cases as sc
import torch

import precompile
from precompile import CallMismatch, CaptureRefused
from precompile.cli.main import main


def _capture(directory, fn, *args, grad=False, name="m"):
    artifact, cache = directory / f"{name}.py", directory / f"{name}.cache"
    with torch.set_grad_enabled(grad), precompile.capture(
        fn, artifact_path=artifact, cache_path=cache, tracer=precompile.MakeFxTracer(), backend="eager"
    ) as cap:
        cap(*args)
    return artifact, cache


@pytest.mark.parametrize(("fn", "args", "named"), [
    (sc.adds_global, lambda: (torch.ones(3),), r"global state_cases\.G \(shape \(3,\)"),
    (sc.closes_over_tensor(torch.ones(3)), lambda: (torch.ones(3),), r"closure cell t of .*closes_over_tensor.*closed \(shape \(3,\)"),
    (sc.reads_table, lambda: (sc.Block(), torch.ones(2, 4)), r"attribute model 0\.table \(not a registered buffer\) \(shape \(4,\)"),
])
def test_a_small_tensor_that_existed_before_the_call_is_refused(tmp_path, fn, args, named):
    with pytest.raises(CaptureRefused, match=named + r".*existed before the call.*register_buffer"):
        _capture(tmp_path, fn, *args())
    assert not (tmp_path / "m.py").exists()


def test_a_tensor_fn_creates_from_data_is_rendered_and_served(tmp_path):
    artifact, cache = _capture(tmp_path, sc.adds_fresh, torch.zeros(3))
    assert "torch.tensor([1.0, 2.0, 3.0]" in artifact.read_text()
    assert torch.equal(precompile.load(artifact, cache)(torch.zeros(3)), torch.tensor([1.0, 2.0, 3.0]))


@pytest.fixture(scope="module")
def block_pair(tmp_path_factory):
    return _capture(tmp_path_factory.mktemp("block"), sc.step, sc.Block(), torch.ones(2, 4))


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: setattr(m, "scale", 0.5), r"args\[0\]\.scale is 0\.5 but the artifact was captured with 1\.0"),
    (lambda m: setattr(m, "mode", "b"), r"args\[0\]\.mode is 'b' but the artifact was captured with 'a'"),
    (lambda m: setattr(m, "kind", sc.Mode.B), r"args\[0\]\.kind is state_cases\.Mode\.B = 'b' but .* state_cases\.Mode\.A = 'a'"),
    (lambda m: setattr(m, "repeats", 2), r"args\[0\]\.repeats is 2 but .* with 1"),
    (lambda m: setattr(m, "scale", 1), r"args\[0\]\.scale is 1 but .* with 1\.0"),  # an int is not the float
    (lambda m: m.train(False), r"args\[0\]\.drop\.training is False but .* with True"),
    (lambda m: setattr(m.settings, "shift", 0.5), r"args\[0\]\.settings\.shift is 0\.5 but .* with 0\.25"),
    (lambda m: setattr(m, "settings", sc.Settings()) or setattr(m.settings, "use_shift", False),
     r"args\[0\]\.settings\.use_shift is False but .* with True"),
    (lambda m: setattr(sc, "FLAG", False), r"global state_cases\.FLAG is False but .* with True"),
    (lambda m: setattr(sc, "K", 5), r"global state_cases\.K is 5 but .* with 3"),
    (lambda m: setattr(sc, "DTYPE", torch.float64), r"global state_cases\.DTYPE is torch\.float64 but .* torch\.float32"),
])
def test_a_served_call_refuses_state_its_trace_read_once_it_changed(block_pair, monkeypatch, change, message):
    monkeypatch.setattr(sc, "FLAG", sc.FLAG)
    monkeypatch.setattr(sc, "K", sc.K)
    monkeypatch.setattr(sc, "DTYPE", sc.DTYPE)
    served = precompile.load(*block_pair)
    model, x = sc.Block(), torch.ones(2, 4)
    with torch.no_grad():
        assert torch.allclose(served(model, x), sc.step(model, x))  # validated: later calls take the fast path
        change(model)
        with pytest.raises(CallMismatch, match=message):
            served(model, x)


def test_a_forward_captured_under_no_grad_serves_under_grad_as_eager_does(block_pair):
    """Grad mode changes no value a forward computes: with grad on, the call records autograd as eager's does."""
    served = precompile.load(*block_pair)
    model, x = sc.Block(), torch.ones(2, 4)
    with torch.no_grad():
        served(model, x)  # validated: the next call takes the fast path
    with torch.enable_grad():
        out, eager = served(model, x), sc.step(model, x)
    assert torch.allclose(out, eager) and eager.requires_grad and out.requires_grad


def test_state_set_back_serves_again_and_a_new_model_is_checked_in_full(block_pair):
    served = precompile.load(*block_pair)
    model, x = sc.Block(), torch.ones(2, 4)
    with torch.no_grad():
        served(model, x)
        model.scale = 2.0
        with pytest.raises(CallMismatch):
            served(model, x)
        model.scale = 1.0
        assert torch.allclose(served(model, x), sc.step(model, x))
        other = sc.Block()
        other.mode = "b"
        with pytest.raises(CallMismatch, match=r"args\[0\]\.mode is 'b'"):
            served(other, x)


def test_a_dict_or_list_attribute_changed_in_place_is_refused(tmp_path):
    served = precompile.load(*_capture(tmp_path, sc.step, sc.Table(), torch.ones(2)))
    model = sc.Table()
    assert torch.equal(served(model, torch.ones(2)), sc.step(model, torch.ones(2)))  # validated: the fast path next
    model.weights["a"] = 3.0
    with pytest.raises(CallMismatch, match=r"args\[0\]\.weights is \{'a': 3\.0\} but .* with \{'a': 2\.0\}"):
        served(model, torch.ones(2))
    model.weights["a"] = 2.0
    model.offsets.append(5.0)
    with pytest.raises(CallMismatch, match=r"args\[0\]\.offsets is \[1\.0, 5\.0\] but .* with \[1\.0\]"):
        served(model, torch.ones(2))


@pytest.mark.parametrize(("model", "change", "message"), [
    (sc.ViaGetattr, lambda m: setattr(m, "gain", 3.0), r"args\[0\]\.gain is 3\.0"),
    (sc.ViaComprehension, lambda m: setattr(m, "gain", 3.0), r"args\[0\]\.gain is 3\.0"),
    (sc.ViaModule, lambda m: setattr(sc.settings_module, "SCALE", 3.0), r"global state_settings\.SCALE is 3\.0"),
    (sc.ViaModule, lambda m: setattr(m, "act", torch.nn.Sigmoid()),
     r"args\[0\]\.act\.__class__ is class torch\.nn\.modules\.activation\.Sigmoid but .*activation\.Tanh"),
    (sc.Odd, lambda m: m.order.update({"a": m.order.pop("a")}), r"args\[0\]\.order is \{'b': 2\.0, 'a': 1\.0\}"),
    (sc.Odd, lambda m: m.order.update({"a": 1}), r"args\[0\]\.order is \{'a': 1, 'b': 2\.0\}"),  # an int for the float
    (sc.Odd, lambda m: setattr(m, "huge", 10**5000 + 1), r"args\[0\]\.huge is <4155 characters, sha256 [0-9a-f]{64}> but"),
])
def test_state_read_other_than_by_a_plain_attribute_load_is_checked(tmp_path, monkeypatch, model, change, message):
    monkeypatch.setattr(sc.settings_module, "SCALE", sc.settings_module.SCALE)
    served = precompile.load(*_capture(tmp_path, sc.step, model(), torch.ones(2)))
    instance = model()
    assert torch.allclose(served(instance, torch.ones(2)), sc.step(instance, torch.ones(2)))  # the fast path next
    change(instance)
    with pytest.raises(CallMismatch, match=message):
        served(instance, torch.ones(2))


def test_a_call_that_changes_state_it_read_is_refused_at_capture(tmp_path):
    with pytest.raises(CaptureRefused, match=r"fn changed args\[0\]\.calls during the captured call \(0 -> 1\)"):
        _capture(tmp_path, sc.step, sc.Counter(), torch.ones(2))


def test_a_closure_cell_is_warned_about_listed_and_kept(tmp_path, capsys):
    with pytest.warns(precompile.PrecompileWarning, match=r"closure cell k of state_cases\.make_closure\.<locals>\.closed = 2.*cannot check"):
        artifact, cache = _capture(tmp_path, sc.make_closure(2), sc.Block(), torch.ones(2, 4))
    assert main(["guards", "--json", str(artifact), str(cache)]) == 0
    report = json.loads(capsys.readouterr().out)
    closure = [s for s in report["guards"]["specializations"] if s["kind"] == "closure"]
    assert closure == [{"kind": "closure", "path": "state_cases.make_closure.<locals>.closed: k", "value": "2", "risky": True}]
    assert any("closure cell k" in item for item in report["guards"]["not_checked"])


def test_guards_lists_and_diff_compares_what_the_trace_read(tmp_path, capsys):
    first = _capture(tmp_path, sc.step, sc.Block(), torch.ones(2, 4), name="a")
    model = sc.Block()
    model.scale = 0.5
    second = _capture(tmp_path, sc.step, model, torch.ones(2, 4), name="b")
    assert main(["guards", *map(str, first)]) == 0
    out = capsys.readouterr().out
    assert "grad_mode" not in out  # a forward's values do not depend on it
    assert "requires_grad" not in out  # a call autograd records carries autograd (the autograd-graph section)
    for line in ("attribute    args[0].scale", "attribute    args[0].drop.training",
                 "attribute    args[0].settings.shift", "global       state_cases.FLAG"):
        assert line in out, out
    assert main(["diff", "--stat", "--fail-on", "guards", *map(str, first), *map(str, second)]) == 1
    out = capsys.readouterr().out
    assert "guards" in out
    assert main(["diff", "--json", *map(str, first), *map(str, second)]) == 1
    report = json.loads(capsys.readouterr().out)
    changed = {(e["section"], e["key"]): e for e in report["entries"]}
    entry = changed[("guards", "attribute args[0].scale")]
    assert (entry.get("a"), entry.get("b")) == ("1.0", "0.5"), entry


def test_nothing_is_warned_for_a_function_that_reads_only_its_arguments(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _capture(tmp_path, sc.step, sc.Block(), torch.ones(2, 4))


def _doubled(module, inputs, output):
    return output * 2


def _tripled(module, inputs, output):
    return output * 3


def test_a_hook_registered_replaced_or_removed_after_capture_is_refused(tmp_path):
    """The trace runs the module's hooks and the served graph holds what they did, calling none: a call
    whose hooks differ from the captured ones would silently skip (or repeat) them."""
    model, x = sc.Block(), torch.ones(2, 4)
    served = precompile.load(*_capture(tmp_path, sc.step, model, x, name="plain"))
    with torch.no_grad():
        served(model, x)
        handle = model.lin.register_forward_hook(_doubled)
        with pytest.raises(CallMismatch, match=r"hooks are args\[0\]\.lin forward hook test_makefx_reads\._doubled but the "
                                               r"artifact was captured with none"):
            served(model, x)
        handle.remove()
        served(model, x)
        handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda module, inputs: None)
        try:
            with pytest.raises(CallMismatch, match="global forward pre hook"):
                served(model, x)
        finally:
            handle.remove()
        handle = model.lin.register_forward_hook(_doubled)
        hooked = precompile.load(*_capture(tmp_path, sc.step, model, x, name="hooked"))
        assert torch.equal(hooked(model, x), sc.step(model, x))  # the captured hook, still there: served as eager
        handle.remove()
        model.lin.register_forward_hook(_tripled)
        with pytest.raises(CallMismatch, match=r"forward hook test_makefx_reads\._tripled but the artifact was captured with "
                                               r"args\[0\]\.lin forward hook test_makefx_reads\._doubled"):
            hooked(model, x)


@pytest.mark.parametrize(("model", "change", "serve_under", "message"), [
    (sc.Aliased, lambda m: setattr(m.knobs, "flag", False), torch.no_grad, r"args\[0\]\.knobs\.flag is False but the artifact was captured with True"),
    (sc.Aliased, lambda m: setattr(m.knobs, "act", torch.tanh), torch.no_grad,
     r"args\[0\]\.knobs\.act is function torch\.\S*tanh but the artifact was captured with function torch\.\S*relu"),
    (sc.Aliased, lambda m: setattr(m.knobs, "boost", True), torch.no_grad,
     r"args\[0\]\.knobs\.boost is True but the artifact was captured with missing"),
    (sc.AsksGradMode, lambda m: None, torch.enable_grad, "grad_mode is True but the artifact was captured under False"),
    (sc.AsksInferenceMode, lambda m: None, torch.inference_mode, "inference_mode is True but the artifact was captured under False"),
])
def test_state_read_through_an_alias_a_function_or_a_mode_query_is_checked(tmp_path, model, change, serve_under, message):
    """`knobs = self.knobs; knobs.flag` (and `getattr(knobs, "boost", None)`, which it lacks), a function kept as a setting, and a branch on
    torch.is_grad_enabled() / is_inference_mode_enabled() of a model nothing of which requires grad:
    each served silently the captured branch before."""
    m, x = model(), torch.ones(2, 4)
    served = precompile.load(*_capture(tmp_path, sc.step, m, x))
    change(m)
    with serve_under(), pytest.raises(CallMismatch, match=message):
        served(m, x)


def test_a_model_that_asks_no_mode_captured_under_no_grad_serves_under_inference_mode(tmp_path):
    m, x = sc.Block(), torch.ones(2, 4)
    m.requires_grad_(False)
    served = precompile.load(*_capture(tmp_path, sc.step, m, x))
    with torch.inference_mode():
        assert torch.equal(served(m, x), sc.step(m, x))


def test_a_set_attribute_changed_in_place_is_refused(tmp_path):
    """A set spells by its members (sorted), so a member discarded after capture is a change."""
    m, x = sc.Block(), torch.ones(2, 4)
    m.modes = {"a", "b"}
    fn = sc.reads_modes
    served = precompile.load(*_capture(tmp_path, fn, m, x))
    with torch.no_grad():
        assert torch.equal(served(m, x), fn(m, x))
        m.modes.discard("a")
        with pytest.raises(CallMismatch, match=r"args\[0\]\.modes is set\(\{'b'\}\) but the artifact was captured with set\(\{'a', 'b'\}\)"):
            served(m, x)


@pytest.mark.parametrize(("model", "change", "message"), [
    (sc.CallsHelper, lambda m: setattr(m, "helper", lambda y: y - 1),
     r"args\[0\]\.helper is function test_makefx_reads\.\S*<lambda> \(code [0-9a-f]{12}\) but the artifact was captured with method state_cases\.CallsHelper\.helper"),
    (sc.CallsHelper, lambda m: setattr(sc.CallsHelper, "helper", lambda self, y: y - 1),
     r"args\[0\]\.helper is method test_makefx_reads\.\S*<lambda> \(code [0-9a-f]{12}\) but the artifact was captured with method state_cases\.CallsHelper\.helper"),
    (sc.OptionalExtra, lambda m: setattr(m, "extra", 2.0), r"args\[0\]\.extra is 2\.0 but the artifact was captured with missing"),
    (sc.AsksBackendFlag, lambda m: setattr(torch.backends.mkldnn, "enabled", False),
     r"global torch\.backends\.mkldnn\.enabled is False but the artifact was captured with True"),
])
def test_a_method_replaced_an_attribute_added_or_a_backend_flag_flipped_after_capture_is_refused(tmp_path, monkeypatch, model, change, message):
    """Each served the captured computation silently before: a method replaced on the instance or
    its class, an attribute the trace found absent (`getattr(self, "extra", None)`) set after, a
    branch on torch.backends.mkldnn.enabled."""
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", True)
    monkeypatch.setattr(sc.CallsHelper, "helper", sc.CallsHelper.helper)
    m, x = model(), torch.ones(2, 4)
    served = precompile.load(*_capture(tmp_path, sc.step, m, x))
    with torch.no_grad():
        assert torch.equal(served(m, x), sc.step(m, x))
        assert torch.equal(served(m, x), sc.step(m, x))  # the fast path of later calls
        change(m)
        with pytest.raises(CallMismatch, match=message):
            served(m, x)


def test_a_closure_held_by_a_model_attribute_is_checked_by_it_without_a_warning(tmp_path, recwarn):
    """The cell of `self.act = make_act(0.5)` is spelled with the attribute, so a served call checks it:
    no warning that it cannot, and no separate unchecked record for `precompile guards` to list."""
    import changed_state_cases as cases

    model, x = cases.build("closure")
    artifact, cache = _capture(tmp_path, cases.step, model, x)
    assert not [w for w in recwarn if issubclass(w.category, precompile.PrecompileWarning)]
    records = ast.literal_eval(next(n.value for n in ast.parse(artifact.read_text()).body if isinstance(n, ast.Assign)
                                    and getattr(n.targets[0], "id", None) == "SPECIALIZED"))
    assert not [r for r in records if r["kind"] == "closure"]
    assert any(r["name"] == "act" and "closing over k=0.5" in r["value"] for r in records)
    served = precompile.load(artifact, cache)
    fresh, x = cases.build("closure")
    served(fresh, x)
    fresh.act.__closure__[0].cell_contents = 2.0
    with pytest.raises(CallMismatch, match=r"args\[0\]\.act is function .*closing over k=2\.0"):
        served(fresh, x)


def test_a_library_registry_of_classes_filled_by_imports_is_listed_not_checked(tmp_path):
    """A process that imported more of a library (a registry of its output classes grown) serves as
    one that imported less: the registry's contents name the imports, not a setting."""
    import changed_state_cases as cases

    artifact, cache = _capture(tmp_path, sc.step, cases.ReadsRegistry(), torch.ones(2))
    records = ast.literal_eval(next(n.value for n in ast.parse(artifact.read_text()).body if isinstance(n, ast.Assign)
                                    and getattr(n.targets[0], "id", None) == "SPECIALIZED"))
    assert [r.get("checked", True) for r in records if r["name"] == "OUTPUT_TYPES"] == [False]
    served = precompile.load(artifact, cache)
    cases.OUTPUT_TYPES.add(dict)
    try:
        assert torch.equal(served(cases.ReadsRegistry(), torch.ones(2)), torch.full((2,), 2.0))
    finally:
        cases.OUTPUT_TYPES.discard(dict)


CONFIGURED_CAPTURE = r"""
import sys, torch, precompile, library_cases as lc
with precompile.capture(lc.configured_step, artifact_path=sys.argv[1] + ".py", cache_path=sys.argv[1] + ".cache",
                        tracer=precompile.MakeFxTracer(), backend="eager") as cap:
    cap(lc.ConfiguredModel(), torch.ones(2, 4))
"""
CONFIGURED_SERVE = r"""
import json, sys, torch, precompile, library_cases as lc
served, model = precompile.load(sys.argv[1] + ".py", sys.argv[1] + ".cache"), lc.ConfiguredModel()
with precompile.no_compilation():
    same = torch.equal(served(model, torch.ones(2, 4)), model(torch.ones(2, 4)))
print(json.dumps([same, model._internal_dict["_use_default_values"]]))
"""


def test_a_diffusers_config_listing_defaults_in_set_order_serves_under_any_hash_seed(tmp_path):
    """diffusers keeps the arguments a model left at their defaults as a list made from a set: its order is
    the process's string hash seed's, and the trace reads the whole config on every submodule lookup.
    Spelled sorted, an artifact captured under one seed serves under others (every unet2d and Flux
    artifact was refused in any other process)."""
    from conftest import run_fresh

    out = str(tmp_path / "configured")
    proc = run_fresh(CONFIGURED_CAPTURE, out, env={"PYTHONHASHSEED": "1"})
    assert proc.returncode == 0, proc.stderr
    orders = set()
    for seed in ("2", "3", "4", "5"):
        proc = run_fresh(CONFIGURED_SERVE, out, env={"PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr
        same, order = json.loads(proc.stdout.strip().splitlines()[-1])
        assert same, seed
        orders.add(tuple(order))
    assert len(orders) > 1, "the seeds gave one order: the test shows nothing"
    tree = ast.parse((tmp_path / "configured.py").read_text())
    records = ast.literal_eval(next(n.value for n in tree.body if isinstance(n, ast.Assign)
                                    and getattr(n.targets[0], "id", None) == "SPECIALIZED"))
    (config,) = [r["value"] for r in records if r["name"] == "_internal_dict"]
    assert "'_use_default_values': ['alpha', 'delta', 'epsilon', 'gamma']" in config
