"""Installed serving: a capture whose graph breaks sit inside functions the captured code calls (a
child module's forward) installs its variants onto the live code objects at load and serves through
Dynamo's frame evaluator, refusing to compile. Fresh processes throughout, as the spec's promises
are about a serving process; captures are shared per session and use the eager backend."""
from __future__ import annotations

import re
import sys

import pytest
import torch

import installed_cases as ic
import precompile
from conftest import fresh_json, run_fresh
from precompile import PrecompileError


def _capture(directory, name, fn, calls, *, grad=False, tracer=None):
    artifact, cache = directory / f"{name}.py", directory / f"{name}.cache"
    with torch.set_grad_enabled(grad), precompile.capture(
        fn, artifact_path=artifact, cache_path=cache, tracer=tracer or precompile.DynamoTracer(), backend="eager"
    ) as cap:
        for args in calls:
            cap(*args)
        summary = cap.summary()
    return artifact, cache, summary


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    directory = tmp_path_factory.mktemp("installed")
    x = torch.ones(4, 8)
    pairs = {
        "print": _capture(directory, "print", ic.run, [(ic.make("print"), x)]),
        "disabled": _capture(directory, "disabled", ic.run_holder, [(ic.make("disabled"), x)]),
        "train": _capture(directory, "train", ic.train, [(ic.make("print"), x)], grad=True),
    }
    return directory, pairs


def test_a_child_module_graph_break_captures_an_installed_artifact_that_lists_its_frames(installed):
    from precompile.artifact.pair import read_python_code

    _, pairs = installed
    for name in ("print", "disabled", "train"):
        artifact, _, summary = pairs[name]
        assert summary.complete and not summary.risky_dropped_guards, name
        meta = read_python_code(artifact).metadata
        assert meta.serving_mode == "installed", name
    meta = read_python_code(pairs["print"][0]).metadata
    roles = {frame.qualname: (frame.installed, bool(frame.resume_names)) for frame in meta.frames}
    assert roles["run"] == (False, False)  # the entry
    assert roles["Parent.forward"] == (True, False)
    assert roles["PrintingChild.forward"] == (True, False)
    assert any(resume for installed, resume in roles.values())  # the child's continuation after the print
    child = next(frame for frame in meta.frames if frame.qualname == "PrintingChild.forward")
    assert child.module == "installed_cases" and child.first_line == ic.PrintingChild.forward.__code__.co_firstlineno
    text = pairs["print"][0].read_text(encoding="utf-8")
    assert "SERVING_MODE = 'installed'" in text


def test_an_installed_artifact_hands_its_guard_lists_to_the_driver_and_its_bytecode_keeps_them(installed):
    """The pickled guard state is filtered by each variant's policy, read from GUARDS: python_code
    passes GUARDS to its driver by name, and the stored bytecode binds every name python_code binds
    (GUARDS, SUMMARY and the other literals: nothing a run-time read could tell apart is left out)."""
    from precompile.artifact.pair import read_cache

    _, pairs = installed
    artifact, cache, _ = pairs["print"]
    last = artifact.read_text(encoding="utf-8").rstrip().splitlines()[-1]
    assert last.startswith("forward = build_forward(") and last.endswith(", variant_guards=GUARDS)")
    assert read_cache(cache, 1 << 30).envelope.python_bytecode.left_out == ()


SERVE = r"""
import json, sys
import torch, precompile, installed_cases as ic
from torch._dynamo.utils import counters
from torch._C._dynamo.eval_frame import _debug_get_precompile_entries
from torch._dynamo.eval_frame import _stance
directory = sys.argv[1]
def load(name, **kw):
    return precompile.load(f"{directory}/{name}.py", f"{directory}/{name}.cache", **kw)
def refused(fn):
    try:
        fn()
    except precompile.PrecompileError as exc:
        return str(exc)
    return None
report = {}
x, other = torch.ones(4, 8), torch.ones(5, 8)
printing, disabled = load("print"), load("disabled")
report["stance after load"] = _stance.stance
report["installed"] = [printing.installed, disabled.installed]
report["entries on the child"] = len(_debug_get_precompile_entries(ic.PrintingChild.forward.__code__))
with precompile.no_compilation(), torch.no_grad():
    model, dmodel = ic.make("print"), ic.make("disabled")
    report["served"] = [torch.equal(printing(model, x), ic.run(model, x)), torch.equal(disabled(dmodel, x), ic.run_holder(dmodel, x))]
    report["miss"] = refused(lambda: printing(model, other))
    for stance, kwargs in [("eager_then_compile", {}), ("default", {"force_backend": "eager"}), ("fail_on_recompile", {})]:
        with torch.compiler.set_stance(stance, **kwargs):
            report[f"miss under {stance}{'+force_backend' if kwargs else ''}"] = refused(lambda: printing(model, other))
    with torch.compiler.set_stance("force_eager"):
        report["force_eager"] = torch.equal(printing(model, other), ic.run(model, other))
    with torch.compiler.set_stance("eager_on_recompile"):
        report["eager_on_recompile"] = [torch.equal(printing(model, x), ic.run(model, x)),
                                        torch.equal(printing(model, other), ic.run(model, other))]
    with printing:
        report["inside with"] = torch.equal(printing(model, x), ic.run(model, x))
    hook = model.child.register_forward_hook(lambda module, inputs, output: output * 2)
    report["hook on the child"] = refused(lambda: printing(model, x))
    hook.remove()
    printing.unload()
    report["after unload"] = torch.equal(printing(model, x), ic.run(model, x))
train = load("train")
eager_model, served_model = ic.make("print"), ic.make("print")
with precompile.no_compilation():
    losses = [(ic.train(eager_model, x).item(), train(served_model, x).item()) for _ in range(2)]
report["train losses equal"] = all(abs(a - b) < 1e-6 for a, b in losses)
report["train grads equal"] = all(
    torch.allclose(p.grad, q.grad) for p, q in zip(eager_model.parameters(), served_model.parameters()))
report["compiles"] = dict(counters["stats"])
print(json.dumps(report))
"""


def test_installed_artifacts_serve_in_a_fresh_process_with_the_stance_rules(installed):
    directory, _ = installed
    report = fresh_json(SERVE, str(directory))
    assert report["stance after load"] == "default"  # fail_on_recompile's behaviour without setting it
    assert report["installed"] == [True, True]
    assert report["entries on the child"] == 1
    assert report["served"] == [True, True]
    assert "no captured variant of 'run' covers this call (1 captured)" in report["miss"]
    assert "size mismatch at index 0. expected 4, actual 5" in report["miss"]
    assert "allow_serve_time_compiles=True" in report["miss"]
    for stance in ("eager_then_compile", "default+force_backend", "fail_on_recompile"):
        assert "size mismatch" in (report[f"miss under {stance}"] or ""), stance
    assert report["force_eager"] is True
    assert report["eager_on_recompile"] == [True, True]
    assert report["inside with"] is True and report["after unload"] is True
    # A hook registered after capture: the parent's variant misses and the call reaches the hook, a
    # frame the capture never compiled (never the hook-less graph).
    assert "the call reached <lambda>" in (report["hook on the child"] or "")
    assert report["train losses equal"] and report["train grads equal"]
    assert report["compiles"] == {}


REFUSALS = r"""
import json, sys
import torch, precompile, installed_cases as ic
directory = sys.argv[1]
def refused(fn):
    try:
        fn()
    except precompile.PrecompileError as exc:
        return str(exc)
    return None
pair = (f"{directory}/print.py", f"{directory}/print.cache")
report = {}
torch._dynamo.config.compiled_autograd = True
report["compiled autograd"] = refused(lambda: precompile.load(*pair))
report["compiled autograd, compiles allowed"] = refused(lambda: precompile.load(*pair, allow_serve_time_compiles=True))
torch._dynamo.config.compiled_autograd = False
model = ic.make("print")
with torch.no_grad():
    torch.compile(ic.run, backend="eager")(model, torch.ones(4, 8))
report["live entries"] = refused(lambda: precompile.load(*pair))
print(json.dumps(report))
"""


SERVE_UNDER_MODES = r"""
import json, sys
import torch, precompile, installed_cases as ic
served = precompile.load(f"{sys.argv[1]}/modes.py", f"{sys.argv[1]}/modes.cache")  # loaded outside both modes
model, x = ic.make("print"), torch.ones(4, 8)
bfloat16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
report = {}
for name, mode in (("autocast", bfloat16), ("inference_mode", torch.inference_mode), ("neither", torch.no_grad)):
    with torch.no_grad(), mode(), precompile.no_compilation():
        try:
            report[name] = torch.equal(served(model, x), ic.run(model, x))
        except precompile.PrecompileError as exc:
            report[name] = str(exc)
print(json.dumps(report))
"""


@pytest.mark.compat
def test_an_installed_variant_serves_the_inference_mode_and_autocast_it_was_captured_under(tmp_path):
    """torch rebuilds an installed variant's guards at load; they are built under the dispatch state
    its call ran under (VariantGuards.dispatch_modes), as Dynamo built them at capture, not under the
    loading process's: loaded outside both modes, each variant serves its own, and a call under
    neither misses."""
    from precompile.artifact.pair import read_python_code

    model, x = ic.make("print"), torch.ones(4, 8)
    artifact, cache = tmp_path / "modes.py", tmp_path / "modes.cache"
    with torch.no_grad(), precompile.capture(ic.run, artifact_path=artifact, cache_path=cache,
                                             tracer=precompile.DynamoTracer(), backend="eager") as cap:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            cap(model, x)
        with torch.inference_mode():
            cap(model, x)
    meta = read_python_code(artifact).metadata
    assert meta.serving_mode == "installed"
    assert {variant.dispatch_modes for variant in meta.guards} == {("autocast:cpu",), ("inference_mode",)}
    report = fresh_json(SERVE_UNDER_MODES, str(tmp_path))
    assert report["autocast"] is True and report["inference_mode"] is True
    assert "no captured variant" in report["neither"]
    # The miss on the inference_mode variant names the mode it was captured under, as a standalone
    # artifact's does, and drops torch's hint about dynamic parameters (not the cause of this miss).
    assert "dispatch key set mismatch" in report["neither"] and "(captured under inference_mode;" in report["neither"]
    assert "force_parameter_static_shapes" not in report["neither"]


SERVE_AUTOCAST_BREAK = r"""
import json, sys
import torch, precompile, installed_cases as ic
served = precompile.load(f"{sys.argv[1]}/break.py", f"{sys.argv[1]}/break.cache")
torch.manual_seed(0)
model, x = torch.nn.Linear(8, 8), torch.ones(4, 8)
with torch.no_grad(), precompile.no_compilation():
    got, expected = served(model, x), ic.breaks_under_autocast(model, x)
print(json.dumps([torch.equal(got, expected), str(got.dtype)]))
"""


def test_a_graph_break_inside_an_autocast_block_is_served_installed(tmp_path):
    """Dynamo's code that re-enters the autocast block after the break holds torch.bfloat16 as a
    constant, which a standalone artifact's marshalled code cannot hold: the capture serves it
    installed (pickled code) rather than failing with marshal's error."""
    from precompile.artifact.pair import read_python_code

    torch.manual_seed(0)
    model, x = torch.nn.Linear(8, 8), torch.ones(4, 8)
    with torch.no_grad(), precompile.capture(ic.breaks_under_autocast, artifact_path=tmp_path / "break.py",
                                             cache_path=tmp_path / "break.cache", tracer=precompile.DynamoTracer(),
                                             backend="eager") as cap:
        cap(model, x)
    assert read_python_code(tmp_path / "break.py").metadata.serving_mode == "installed"
    assert fresh_json(SERVE_AUTOCAST_BREAK, str(tmp_path)) == [True, "torch.bfloat16"]


def test_installed_load_refuses_compiled_autograd_live_entries_and_disabled_dynamo(installed):
    directory, _ = installed
    report = fresh_json(REFUSALS, str(directory))
    assert "compiled_autograd is enabled" in report["compiled autograd"]
    assert "compiled_autograd is enabled" in report["compiled autograd, compiles allowed"]
    assert "already has live Dynamo cache entries" in report["live entries"]
    assert "load the artifact in a fresh process" in report["live entries"]
    code = f"import precompile; precompile.load({str(directory / 'print.py')!r}, {str(directory / 'print.cache')!r})"
    proc = run_fresh(code, env={"TORCHDYNAMO_DISABLE": "1"})
    assert proc.returncode == 1
    assert "Dynamo is disabled here (TORCHDYNAMO_DISABLE=1" in proc.stderr


EDITABLE = '''
import torch

class Child(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.linear(x)
        print("break")
        return y * 2


def run(model, x):
    return model(x) + 1
'''


RESTYLED_SERVE = r"""
import json, sys, torch, precompile, edited_model
served = precompile.load(sys.argv[1], sys.argv[2])
model, x = edited_model.Child(), torch.ones(2, 8)
with torch.no_grad():  # as captured
    print(json.dumps(torch.equal(served(model, x), edited_model.run(model, x))))
"""


def test_installed_load_refuses_a_frame_whose_source_changed_since_capture(tmp_path, monkeypatch):
    """An edit is refused; the same code moved down its file, with a comment and a blank line inside the
    frame Dynamo installs onto, is the same code (its line table aside) and serves."""
    package = tmp_path / "src"
    package.mkdir()
    (package / "edited_model.py").write_text(EDITABLE)
    monkeypatch.syspath_prepend(str(package))
    import edited_model

    try:
        artifact, cache, _ = _capture(tmp_path, "edited", edited_model.run, [(edited_model.Child(), torch.ones(2, 8))])
    finally:
        sys.modules.pop("edited_model", None)
    (package / "edited_model.py").write_text("# a comment line moves the code down\n" + EDITABLE.replace(
        "        y = self.linear(x)\n", "        # a comment and a blank line inside the frame\n\n        y = self.linear( x )\n"))
    proc = run_fresh(RESTYLED_SERVE, str(artifact), str(cache), env={"PYTHONPATH": f"{package}"})
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "true", proc.stderr
    (package / "edited_model.py").write_text(EDITABLE.replace("y * 2", "y * 3"))
    code = f"import precompile; precompile.load({str(artifact)!r}, {str(cache)!r})"
    proc = run_fresh(code, env={"PYTHONPATH": f"{package}"})
    assert proc.returncode == 1, proc.stderr
    assert "changed since capture" in proc.stderr and "capture the artifact again" in proc.stderr


COMPILES = r"""
import json, sys
import torch, precompile, installed_cases as ic
from torch._dynamo.utils import counters
directory = sys.argv[1]
served = precompile.load(f"{directory}/print.py", f"{directory}/print.cache", allow_serve_time_compiles=True)
calls = {}
for name, value in list(vars(ic).items()):  # count the captured variants' compiled graphs being called
    if name.startswith("__compiled_fn") and hasattr(value, "__precompile_artifact__"):
        def counting(*args, _name=name, _fn=value, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _fn(*args, **kwargs)
        counting.__precompile_artifact__ = value.__precompile_artifact__
        setattr(ic, name, counting)
torch._dynamo.config.recompile_limit = 1
model, report = ic.make("print"), {}
with torch.no_grad():
    report["miss compiles"] = torch.equal(served(model, torch.ones(5, 8)), ic.run(model, torch.ones(5, 8)))
    report["graphs after miss"] = counters["stats"]["unique_graphs"]
    report["captured first"] = torch.equal(served(model, torch.ones(4, 8)), ic.run(model, torch.ones(4, 8)))
    report["captured calls"] = sum(calls.values())
    report["past limit"] = torch.equal(served(model, torch.ones(7, 8)), ic.run(model, torch.ones(7, 8)))
    report["graphs after limit"] = counters["stats"]["unique_graphs"]
print(json.dumps(report))
"""


def test_allow_serve_time_compiles_compiles_a_miss_serves_captured_variants_first_and_honours_the_limit(installed):
    directory, _ = installed
    report = fresh_json(COMPILES, str(directory))
    assert report["miss compiles"] is True and report["graphs after miss"] > 0
    assert report["captured first"] is True and report["captured calls"] > 0
    assert report["past limit"] is True
    assert report["graphs after limit"] == report["graphs after miss"]  # past recompile_limit: eager


MAIN_CHILD = r"""
import sys, torch, precompile, installed_cases as ic
class MainChild(ic.PrintingChild):  # defined in __main__: no serving process can import it
    def forward(self, x):
        y = self.linear(x)
        print("main")
        return y
with precompile.capture(ic.run, artifact_path=sys.argv[1] + "/main.py", cache_path=sys.argv[1] + "/main.cache",
                        backend="eager") as cap:
    cap(ic.Parent(MainChild()), torch.ones(2, 8))
"""


def test_a_frame_an_installed_artifact_cannot_find_by_name_is_refused_at_write_time(tmp_path):
    script = tmp_path / "capture_main.py"
    script.write_text(MAIN_CHILD)
    as_script = run_fresh(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", str(tmp_path))
    assert as_script.returncode == 1
    assert "must find again by module and qualified name" in as_script.stderr
    assert "MainChild.forward (defined in __main__" in as_script.stderr
    as_string = run_fresh(MAIN_CHILD, str(tmp_path))  # code with no source file at all
    assert as_string.returncode == 1
    assert "precompile.CaptureRefused: the call compiled a frame the artifact cannot record" in as_string.stderr
    assert not (tmp_path / "main.py").exists() and not (tmp_path / "main.cache").exists()


def _drop(*names):
    return lambda entries: [not any(name in entry.name for name in names) for entry in entries]


def test_a_custom_filter_drop_is_listed_not_refused_unless_it_tells_variants_apart_or_is_configuration(tmp_path):
    x4, x6 = torch.ones(4, 8), torch.ones(6, 8)
    _, _, one_call = _capture(tmp_path, "one", ic.flagged, [(x4, 2.0)], tracer=precompile.DynamoTracer(guard_filter_fn=_drop("scale")))
    assert any(source == "scale" for _, source in one_call.dropped_guards)
    assert one_call.risky_dropped_guards == ()
    assert (tmp_path / "one.py").exists()

    with pytest.raises(PrecompileError, match=r"dropped guards that matter .*RISKY drops \[.*scale"):
        _capture(tmp_path, "apart", ic.flagged, [(x4, 2.0), (x6, 3.0)],
                 tracer=precompile.DynamoTracer(guard_filter_fn=_drop("scale"), dynamic=False))
    assert not (tmp_path / "apart.py").exists()

    with pytest.raises(PrecompileError, match=r"RISKY drops \[.*G\['FLAG'\]"):
        _capture(tmp_path, "flag", ic.flagged, [(x4, 2.0)], tracer=precompile.DynamoTracer(guard_filter_fn=_drop("FLAG")))


def test_inspect_presents_installed_frames(installed, capsys):
    from precompile.cli.main import main

    directory, _ = installed
    assert main(["--color", "never", "show", str(directory / "print")]) == 0
    out = capsys.readouterr().out
    assert "serving mode installed" in out
    assert "PrintingChild.forward in installed_cases: 1 variants (installed onto installed_cases.PrintingChild.forward, line" in out
    assert "run in installed_cases: 1 variants (entry, line" in out
    assert main(["--color", "never", "guards", str(directory / "print")]) == 0
    assert "frame PrintingChild.forward variant 0:" in capsys.readouterr().out
    assert main(["--color", "never", "diff", str(directory / "print"), str(directory / "disabled")]) == 1
    out = capsys.readouterr().out
    assert "PrintingChild.forward" in out and "DisabledHelperChild.forward" in out


HF = r"""
import json, sys
import torch, precompile, installed_cases as ic
from torch._dynamo.utils import counters
directory = sys.argv[1]
model = ic.tiny_llama()
ids = torch.arange(6).reshape(1, 6) % 64
with precompile.no_compilation(), torch.no_grad():
    served = precompile.load(f"{directory}/llama.py", f"{directory}/llama.cache")
    equal = torch.equal(served(model, ids), ic.llama_logits(model, ids))
print(json.dumps({"installed": served.installed, "equal": equal, "compiles": dict(counters["stats"])}))
"""


@pytest.mark.compat
def test_a_transformers_model_with_a_graph_break_in_a_layer_serves_installed(tmp_path):
    """On 2.15 Dynamo's guard pickler writes the functions transformers' decorators wrap by value (their
    code objects): the capture writes them as Dynamo's placeholder instead, so verify's strict scan of
    the state passes and load puts the live ones back. On 2.11 Dynamo cannot find transformers'
    gradient-checkpointing forward (made inside __init_subclass__) by name: the capture is refused."""
    pytest.importorskip("transformers")
    model = ic.tiny_llama()
    ids = torch.arange(6).reshape(1, 6) % 64
    if torch.__version__.startswith("2.11."):
        with torch.no_grad(), pytest.raises(precompile.CaptureRefused, match=r"cannot record .*forward_with_checkpointing.*MakeFxTracer"):
            _capture(tmp_path, "llama", ic.llama_logits, [(model, ids)])
        return
    with torch.no_grad():
        _, _, summary = _capture(tmp_path, "llama", ic.llama_logits, [(model, ids)])
    assert summary.complete and not summary.risky_dropped_guards
    report = fresh_json(HF, str(tmp_path))
    assert report == {"installed": True, "equal": True, "compiles": {}}
    from precompile.cli.main import main  # served, so not hostile (issue 51, item 3: "_dynamo_state would import ...")

    assert main(["verify", str(tmp_path / "llama")]) == 0


FUNCTION_MODULE = r"""
import json, sys
import torch, precompile, installed_cases as ic
from torch._dynamo.utils import counters
directory = sys.argv[1]
x = torch.ones(4, 8)
model = ic.make_function_module(reduces_itself=True)
with precompile.no_compilation(), torch.no_grad():
    served = precompile.load(f"{directory}/function_module.py", f"{directory}/function_module.cache")
    equal = torch.equal(served(model, x), ic.run(model, x))
print(json.dumps({"installed": served.installed, "equal": equal, "compiles": dict(counters["stats"])}))
"""


def test_a_module_of_a_local_class_that_pickles_itself_reads_back_as_its_class_and_serves_installed(tmp_path):
    """kernels' use_kernelized_func (a dependency of transformers from 5.25.0: Llama's attention) keeps
    a module of a class made inside a function in a plain attribute; Dynamo guards what its forward
    closes over through its type. Dynamo's guard pickler writes such a module as a bare nn.Module,
    whose forward closes over nothing: the capture has it written by the class's own __reduce__."""
    with torch.no_grad():
        _, _, summary = _capture(tmp_path, "function_module", ic.run, [(ic.make_function_module(reduces_itself=True), torch.ones(4, 8))])
    assert summary.complete and not summary.risky_dropped_guards
    assert fresh_json(FUNCTION_MODULE, str(tmp_path)) == {"installed": True, "equal": True, "compiles": {}}


@pytest.mark.compat
def test_a_kept_guard_the_pickled_guard_state_cannot_read_back_refuses_the_installed_capture_naming_it(tmp_path):
    """The same module without a __reduce__ of its own reads back as a bare nn.Module: the capture is
    refused, naming the guard, rather than the artifact at load (`'NoneType' object is not subscriptable`)."""
    with torch.no_grad(), pytest.raises(precompile.CaptureRefused) as refused:
        _capture(tmp_path, "bare", ic.run, [(ic.make_function_module(reduces_itself=False), torch.ones(4, 8))])
    message = str(refused.value)
    if torch.__version__.startswith(("2.11.", "2.12.")):  # refused by load's policy on the bare module, or torch's build of the guards
        assert ("GuardsStatePickler._unpickle_module" in message and "define the class at module level" in message
                or "torch cannot build its guards from the saved state" in message and "a class at module level" in message)
        assert "AOTAutograd" not in message
        return
    assert ("FunctionModuleChild.forward), variant 0: SEQUENCE_LENGTH dict(type(self._funcs['scaled']).__dict__)"
            "['forward'].__closure__[0].cell_contents.__defaults__") in message
    assert "reads back nothing" in message and "guard_filter_fn" in message


TYPE_CHECKING = r"""
import json, sys
import torch, precompile, installed_cases as ic
from torch._dynamo.utils import counters
directory = sys.argv[1]
x = torch.ones(4, 8)
model = ic.make_type_checking()
with precompile.no_compilation(), torch.no_grad():
    served = precompile.load(f"{directory}/type_checking.py", f"{directory}/type_checking.cache")
    equal = torch.equal(served(model, x), ic.run(model, x))
print(json.dumps({"installed": served.installed, "equal": equal, "compiles": dict(counters["stats"])}))
"""


def test_a_global_dynamo_bound_by_id_is_seeded_by_name_so_a_fresh_process_serves_installed(tmp_path):
    """`type(y) is torch.Tensor` after a graph break in a child (longformer's attention): Dynamo guards
    G['_<id>_c<n>'].Tensor, a global named by an object id of the capturing process; the artifact binds
    that name to the module it held, by the module's name, when it loads."""
    with torch.no_grad():
        artifact, _, summary = _capture(tmp_path, "type_checking", ic.run, [(ic.make_type_checking(), torch.ones(4, 8))])
    assert summary.complete
    assert re.search(r"G\['_\d+_c\d+'\]\.Tensor", artifact.read_text())
    report = fresh_json(TYPE_CHECKING, str(tmp_path))
    assert report == {"installed": True, "equal": True, "compiles": {}}


LIBRARY_SETTING = r"""
import json, sys
import torch, precompile, installed_cases as ic, installed_settings as settings
directory, change, when = sys.argv[1:4]
def changed():
    if change == "scale":
        settings.SCALE = 3.0
    elif change == "fast path":
        settings.FAST_PATH = False
    elif change == "dtype":
        settings.DTYPE = torch.float64
    elif change == "unbound":
        del ic.settings
    elif change == "weights":
        settings.WEIGHTS = [1.5, 2.0]
    elif change == "limit":
        settings.LIMIT = 0.5
    elif change == "class attribute":
        ic.SettingBase.OFFSET = 2.0
    elif change == "default":
        ic.shifted.__defaults__ = (0.25,)
def served_or_missed():
    try:
        return "served equal" if torch.equal(served(model, x), ic.run(model, x)) else "served DIFFERENT"
    except precompile.CallMismatch as exc:
        return str(exc)
if when == "before load":
    changed()
try:
    served = precompile.load(f"{directory}/setting.py", f"{directory}/setting.cache")
except precompile.PrecompileError as exc:
    print(json.dumps({"load": str(exc)}))
    sys.exit()
model, x = ic.make_library_setting(), torch.ones(4, 8)
report = {}
with precompile.no_compilation(), torch.no_grad():
    report["first call"] = served_or_missed()
    if when == "after the first call":
        changed()
        report["after the change"] = served_or_missed()
print(json.dumps(report))
"""


@pytest.mark.compat
def test_a_library_setting_read_through_its_module_is_checked_against_the_capture_in_installed_mode(tmp_path):
    """A child reads, around a graph break, `settings.SCALE`, a bool, a dtype, a list's length, an
    infinite float and `math.pi` through their modules, an inherited class attribute and a function's default.
    torch rebuilds those guards at load from the serving process's module, class and function, so,
    before the by-name lines pinned the captured values, each changed before load served the code
    that baked in the old one; and the pickled guard state imported the modules by name, which load's
    policy refused for `math` and a module outside the captured package. Now it captures, verifies,
    serves unchanged settings, and misses on each one changed, before load or after a served call; a
    module the serving frame no longer binds is a load refusal naming it."""
    from precompile.cli.main import main

    with torch.no_grad():
        artifact, _, summary = _capture(tmp_path, "setting", ic.run, [(ic.make_library_setting(), torch.ones(4, 8))])
    assert summary.complete
    assert "CONSTANT_MATCH G['settings'].SCALE == 2.0" in artifact.read_text(encoding="utf-8")
    assert main(["verify", str(tmp_path / "setting")]) == 0  # the strict scan: no module imported by name
    report = fresh_json(LIBRARY_SETTING, str(tmp_path), "nothing", "before load")
    assert report == {"first call": "served equal"}
    for change, captured in [("scale", "G['settings'].SCALE == 2.0"), ("fast path", "G['settings'].FAST_PATH == True"),
                             ("dtype", "G['settings'].DTYPE is torch:float32"), ("weights", "len(G['settings'].WEIGHTS) == 1"),
                             ("limit", "G['settings'].LIMIT == float('inf')"),
                             ("class attribute", "type(L['self']).__mro__[1].__dict__['OFFSET'] == 1.0"),
                             ("default", "G['shifted'].__defaults__[0] == 0.5")]:
        if change == "default" and torch.__version__.startswith("2.11."):
            continue  # torch 2.11's Dynamo guards no global function's defaults: torch.compile too serves a changed one stale
        report = fresh_json(LIBRARY_SETTING, str(tmp_path), change, "before load")
        assert captured in report["first call"], (change, report)
    report = fresh_json(LIBRARY_SETTING, str(tmp_path), "unbound", "before load")
    assert "its guards read module installed_settings through the global 'settings', which module 'installed_cases' does not bind" in report["load"]
    report = fresh_json(LIBRARY_SETTING, str(tmp_path), "scale", "after the first call")
    assert report["first call"] == "served equal"
    assert "G['settings'].SCALE == 2.0 (this call's G['settings'].SCALE is 3.0)" in report["after the change"], report


def test_a_variant_whose_guards_torch_cannot_build_again_is_refused_at_write_time(tmp_path, monkeypatch):
    """A numpy scalar read through a module, around a graph break: the capture used to write an
    artifact that every load refused (torch's own build of the guards fails on the placeholder its
    pickler saved for the tensor Dynamo made of it); now the capture builds them as load will and
    refuses, naming the frame and torch's error."""
    import installed_settings

    np = pytest.importorskip("numpy")
    monkeypatch.setattr(installed_settings, "NPF", np.float32(2.0), raising=False)
    with torch.no_grad(), pytest.raises(precompile.CaptureRefused, match=r"NumpySettingChild.*torch cannot build its guards from the saved state"):
        _capture(tmp_path, "numpy", ic.run, [(ic.Parent(ic.NumpySettingChild()), torch.ones(4, 8))])
