"""The guards a standalone Dynamo artifact renders into python_code decide exactly as torch's own guard
manager does, built from the same guard state (the differential test), and serving such an artifact
imports neither torch._dynamo nor torch._inductor nor AOTAutograd."""
from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import math
import re
import sys
import types
from pathlib import Path

import msgspec
import pytest
import torch

import dynamo_cases
import precompile
from conftest import dynamo_modules_read, fresh_json, run_fresh
from precompile.examples import transformer


def _capture(directory, name, fn, calls, grad=False, tracer=None, mode=contextlib.nullcontext):
    """`mode`: what the calls run under (inference_mode, autocast), at capture and when served here."""
    artifact, cache = directory / f"{name}.py", directory / f"{name}.cache"
    with torch.set_grad_enabled(grad), mode(), precompile.capture(
        fn, artifact_path=artifact, cache_path=cache, tracer=tracer or precompile.DynamoTracer(), backend="eager"
    ) as cap:
        for args, kwargs in calls:
            cap(*args, **kwargs)
        entry = cap._dynamo.package.cache_entry()
    return {"artifact": artifact, "cache": cache, "entry": entry, "calls": calls, "grad": grad, "fn": fn, "mode": mode}


def _inference_tensor(value):
    with torch.inference_mode():
        return value.clone()


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 8)


@pytest.fixture(scope="session")
def captured(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dynamo_guards")
    model = _linear()
    x4, x6 = torch.ones(4, 8), torch.ones(6, 8)
    demo, demo_x = transformer.make_demo()
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return {
        "break": _capture(directory, "break", dynamo_cases.break_on_item,
                          [((model, x4), {}), ((model, x4 * 2), {}), ((model, x6), {})]),
        "global": _capture(directory, "global", dynamo_cases.uses_global, [((x4,), {}), ((x6,), {})]),
        "keywords": _capture(directory, "keywords", dynamo_cases.keyword_step,
                             [((x4,), {}), ((x4,), {"bias": torch.ones(8), "alpha": 2.0})]),
        "dynamic": _capture(directory, "dynamic", dynamo_cases.uses_global, [((x4,), {}), ((torch.ones(5, 8),), {})],
                            tracer=precompile.DynamoTracer(dynamic=True)),
        "demo": _capture(directory, "demo", transformer.run, [((demo, demo_x), {})]),
        "mlp": _capture(directory, "mlp", dynamo_cases.calls_model, [((mlp, x4), {})]),
        "train": _capture(directory, "train", dynamo_cases.train_step, [((_linear(), x4), {})], grad=True),
        # Under inference_mode a plain input and an inference tensor are two variants, as in torch.compile.
        "inference": _capture(directory, "inference", dynamo_cases.calls_model,
                              [((mlp, _inference_tensor(x4)), {}), ((mlp, x4), {})], mode=torch.inference_mode),
        "autocast": _capture(directory, "autocast", dynamo_cases.calls_model, [((mlp, x4), {})],
                             mode=lambda: torch.autocast("cpu", dtype=torch.bfloat16)),
    }


def _exec_artifact(path):
    namespace = {"__file__": str(path)}
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)  # noqa: S102 - our own artifact
    return namespace


def test_every_capture_here_renders_every_guard_and_pickles_nothing(captured):
    for name, capture in captured.items():
        text = capture["artifact"].read_text(encoding="utf-8")
        assert "\n_dynamo_state = None\n" in text, name
        assert "opaque remainder below" not in text, name


# -- the differential test -------------------------------------------------------------------------


class _Sub(torch.nn.Linear):
    pass


def _tensor_mutations(value):
    yield "float64", value.double()
    yield "float16", value.half()
    yield "a storage offset", torch.ones(value.numel() + 1)[1:].view(value.shape)
    yield "a copy", value.detach().clone()
    if value.dim():
        yield "dim 0 = 2", torch.ones(2, *value.shape[1:])
        yield "dim 0 = 0", torch.ones(0, *value.shape[1:])
        yield "a strided view", torch.ones(value.shape[0] * 2, *value.shape[1:])[::2]
    yield "dim 0 + 1", torch.ones(value.shape[0] + 1, *value.shape[1:]) if value.dim() else value + 1
    yield "dim 0 = 1", torch.ones(1, *value.shape[1:]) if value.dim() else value
    yield "dim 0 = 9", torch.ones(9, *value.shape[1:]) if value.dim() else value
    yield "extra dim", value.unsqueeze(0)
    yield "requires_grad flipped", value.detach().clone().requires_grad_(not value.requires_grad)
    if value.dim() == 2:
        yield "transposed layout", value.t().contiguous().t()
        yield "dim 1 + 1", torch.ones(value.shape[0], value.shape[1] + 1)
    yield "meta", value.to("meta")
    with torch.inference_mode(not value.is_inference()):
        yield "inference tensor flipped", value.clone()
    yield "a float", 1.0
    yield "int64", value.long()
    marked = value.detach().clone()
    marked._dynamo_dynamic_indices = {0}
    yield "marked dynamic", marked
    yield "a Parameter", torch.nn.Parameter(value.detach().clone(), requires_grad=False)


def _module_mutations(module):
    yield "float64", copy.deepcopy(module).double()
    hooked = copy.deepcopy(module)
    hooked.register_forward_hook(lambda *args: None)
    yield "forward hook", hooked
    patched = copy.deepcopy(module)
    patched.forward = patched.forward
    yield "forward in __dict__", patched
    frozen = copy.deepcopy(module).requires_grad_(False)
    yield "params frozen", frozen
    first = next((m for m in module.modules() if isinstance(m, torch.nn.Linear)), None)
    if first is not None:
        unbiased = copy.deepcopy(module)
        target = next(m for m in unbiased.modules() if isinstance(m, torch.nn.Linear))
        target.bias = None
        yield "a bias removed", unbiased
    if type(module) is torch.nn.Linear:
        other = copy.copy(module)
        other.__class__ = _Sub
        yield "a subclass", other
    children = getattr(module, "_modules", {})
    for key, child in children.items():
        if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)) and len(child) > 1:
            fewer = copy.deepcopy(module)
            del fewer._modules[key]._modules[str(len(child) - 1)]
            yield f"{key} shortened", fewer
            reordered = copy.deepcopy(module)
            inner = reordered._modules[key]._modules
            items = list(inner.items())
            inner.clear()
            inner.update(reversed(items))
            yield f"{key} keys reordered", reordered


def _value_mutations(value):
    if isinstance(value, bool) or value is None:
        yield "True", True
        yield "None", None
        yield "0", 0
        return
    if isinstance(value, (int, float)):
        yield "+1", value + 1
        yield "as int", int(value)
        yield "as float", float(value)
        yield "nan", math.nan
        yield "None", None
        yield "a tensor", torch.tensor(float(value))


def _mutations(base):
    yield "as captured", base
    tensors = [k for k, v in base.items() if isinstance(v, torch.Tensor)]
    for key, value in base.items():
        if isinstance(value, torch.Tensor):
            found = _tensor_mutations(value)
        elif isinstance(value, torch.nn.Module):
            found = _module_mutations(value)
        else:
            found = _value_mutations(value)
        for label, changed in found:
            yield f"{key}: {label}", {**base, key: changed}
    if len(tensors) > 1:
        yield "aliased tensors", {**base, tensors[1]: base[tensors[0]]}


@contextlib.contextmanager
def _default_dtype(dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@contextlib.contextmanager
def _deterministic():
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


@contextlib.contextmanager
def _module_global(name, value):
    before = getattr(dynamo_cases, name)
    setattr(dynamo_cases, name, value)
    try:
        yield
    finally:
        setattr(dynamo_cases, name, before)


_CONTEXTS = {
    "as captured": contextlib.nullcontext,
    "grad mode flipped": lambda: torch.set_grad_enabled(not torch.is_grad_enabled()),
    "default dtype float64": lambda: _default_dtype(torch.float64),
    "deterministic algorithms": _deterministic,
    "autocast": lambda: torch.autocast("cpu"),
    "autocast off": lambda: torch.autocast("cpu", enabled=False),
    "inference_mode": torch.inference_mode,
    "outside inference_mode": lambda: torch.inference_mode(False),
    "under torch.device('cpu')": lambda: torch.device("cpu"),
    "module global SCALE = 3.0": lambda: _module_global("SCALE", 3.0),
    "module global SCALE = 2 (an int)": lambda: _module_global("SCALE", 2),
}


def _record_locals(namespace):
    """Wrap the artifact's dispatcher so every frame's bound arguments are recorded as calls reach it."""
    seen = []
    frame_class = namespace["_Frame"]
    call = frame_class.call

    def recording(self, closure, args, kwargs):
        seen.append((self, self.bind(*args, **kwargs)))
        return call(self, closure, args, kwargs)

    frame_class.call = recording
    return seen


def _torch_verdict(guards, f_locals):
    try:
        return bool(guards.check(f_locals))
    except Exception:  # noqa: BLE001 - a check that cannot run is a miss, as in the rendered guards
        return False


@pytest.mark.parametrize("name", ["break", "global", "keywords", "dynamic", "demo", "mlp", "train", "inference", "autocast"])
def test_rendered_guards_decide_exactly_as_torchs_guard_manager(captured, name):
    from torch._dynamo.package import SerializedCode

    capture = captured[name]
    namespace = _exec_artifact(capture["artifact"])
    seen = _record_locals(namespace)
    with torch.set_grad_enabled(capture["grad"]), capture["mode"]():
        for args, kwargs in capture["calls"]:
            namespace["forward"](*args, **kwargs)
    tables = namespace["_dynamo_frames"]
    listed = {(v["frame"], v["variant"]): v for v in namespace["GUARDS"]}
    checked, disagreements, verdicts = 0, [], set()
    bases = {}
    for frame, f_locals in seen:
        bases.setdefault(frame.label, (frame, []))[1].append(f_locals)
    for index, (code, table, described) in enumerate(zip(capture["entry"].codes, tables, namespace["FRAMES"])):
        if described.get("runs_as_python") or described["qualname"] not in bases:
            continue
        frame, base_locals = bases[described["qualname"]]
        original = SerializedCode.to_code_object(code.python_code)
        pairs = []
        for variant, function in enumerate(table["guards"]):
            meta = listed[(described["qualname"], variant)]
            # Dynamo built the variant's guards under the capture's mode: torch's are built so here, under
            # the real mode, not under the driver's rebuilt dispatch state, which the rendered guards use.
            namespace["dispatch_key_sets"] = lambda modes: (torch._C._dispatch_tls_local_include_set(),
                                                        torch._C._dispatch_tls_local_exclude_set())
            with capture["mode"]():
                torch_guards, _, _ = namespace["_torch_guards"](
                    code.guarded_codes[variant].guards_state, original, frame.scope,
                    frozenset(meta["policy_dropped"]), meta["by_name"], "artifact")
            pairs.append((variant, namespace[function], torch_guards))
        for base in base_locals:
            for label, f_locals in _mutations(base):
                for context_name, context in _CONTEXTS.items():
                    with torch.no_grad() if not capture["grad"] else torch.enable_grad(), capture["mode"](), context():
                        for variant, rendered, torch_guards in pairs:
                            ours = rendered(f_locals, frame.scope) is None
                            theirs = _torch_verdict(torch_guards, f_locals)
                            checked += 1
                            verdicts.add(theirs)
                            if ours != theirs:
                                disagreements.append(f"{described['qualname']} variant {variant}, {label}, {context_name}: "
                                                     f"rendered {ours}, torch {theirs} ({rendered(f_locals, frame.scope)})")
    assert not disagreements, "\n".join(disagreements[:20])
    assert checked >= 200, checked
    assert verdicts == {True, False}  # the generated calls both match and miss


# -- serving without Dynamo -----------------------------------------------------------------------

SERVE_WITHOUT_DYNAMO = r"""
import json, sys
import torch
sys.path.insert(0, sys.argv[2])
import dynamo_cases as dc
from precompile.examples import transformer

def load(name):
    path = f"{sys.argv[1]}/{name}.py"
    namespace = {"__file__": path}
    exec(compile(open(path, encoding="utf-8").read(), path, "exec"), namespace)
    return namespace["forward"]

torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
demo, demo_x = transformer.make_demo()
torch.manual_seed(1)
mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
report = {}
with torch.no_grad():
    served = load("break")
    report["break"] = [torch.allclose(served(model, x), dc.break_on_item(model, x))
                       for x in (torch.ones(4, 8), torch.ones(4, 8) * 2, torch.ones(6, 8), torch.ones(9, 8))]
    report["demo"] = torch.allclose(load("demo")(demo, demo_x), transformer.run(demo, demo_x), atol=1e-5)
    report["mlp"] = torch.allclose(load("mlp")(mlp, torch.ones(4, 8)), dc.calls_model(mlp, torch.ones(4, 8)))
report["imported"] = sorted(m for m in ("torch._dynamo", "torch._inductor", "torch._functorch.aot_autograd") if m in sys.modules)
print(json.dumps(report))
"""


def test_a_standalone_eager_artifact_serves_without_importing_dynamo_inductor_or_aot_autograd(captured):
    """Plain exec of python_code (only torch needed) in a fresh process: the demo transformer, an MLP
    and a graph break with its continuation, served equal to eager, and none of those modules loaded."""
    directory = captured["break"]["artifact"].parent
    report = fresh_json(SERVE_WITHOUT_DYNAMO, str(directory), str(dynamo_cases.__file__.rsplit("/", 1)[0]))
    assert report["break"] == [True, True, True, True]
    assert report["demo"] is True and report["mlp"] is True
    if any(dynamo_modules_read(captured[name]["artifact"]) for name in ("break", "demo", "mlp")):
        assert "torch._dynamo" in report["imported"]  # the bytecode itself reads a Dynamo polyfill module
    else:
        assert report["imported"] == []


SERVE_UNDER_MODES = r"""
import json, sys
import torch
import precompile
sys.path.insert(0, sys.argv[2])
import dynamo_cases as dc

torch.manual_seed(1)
mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
x = torch.ones(4, 8)
with torch.inference_mode():
    x_inference = x.clone()
def load(name):
    return precompile.load(f"{sys.argv[1]}/{name}.py", f"{sys.argv[1]}/{name}.cache")
def served(fn, mode, *args):
    with torch.no_grad(), mode(), precompile.no_compilation():
        try:
            return torch.allclose(fn(*args), dc.calls_model(*args))
        except precompile.PrecompileError as exc:
            return str(exc)
bfloat16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
with torch.inference_mode():  # a server that loads in inference mode serves calls outside it
    plain = load("mlp")
report = {"plain": served(plain, torch.no_grad, mlp, x),
          "plain under inference_mode": served(plain, torch.inference_mode, mlp, x)}
inference, autocast = load("inference"), load("autocast")  # loaded outside the modes they serve under
report["inference"] = [served(inference, torch.inference_mode, mlp, t) for t in (x_inference, x)]
report["inference outside it"] = served(inference, torch.no_grad, mlp, x)
report["autocast"] = served(autocast, bfloat16, mlp, x)
print(json.dumps(report))
"""


def test_a_variant_serves_the_inference_mode_and_autocast_it_was_captured_under_wherever_it_was_loaded(captured):
    """Dynamo's tensor guards read each tensor's dispatch keys as inference_mode and autocast adjust
    them, so a variant serves the mode its call ran under, as torch.compile's does, not the mode of
    the process that loaded the artifact. A mode no captured call ran under misses, naming the mode."""
    report = fresh_json(SERVE_UNDER_MODES, str(captured["mlp"]["artifact"].parent), str(dynamo_cases.__file__.rsplit("/", 1)[0]))
    assert report["plain"] is True
    assert "(captured outside inference_mode and autocast;" in report["plain under inference_mode"]
    assert report["inference"] == [True, True]
    assert "(captured under inference_mode;" in report["inference outside it"]
    assert "x is not an inference tensor, the captured one was one" in report["inference outside it"]
    assert report["autocast"] is True


SERVE_AN_INFERENCE_MODEL = r"""
import json, sys
import torch
import precompile
sys.path.insert(0, sys.argv[2])
import dynamo_cases as dc

with torch.inference_mode():
    torch.manual_seed(1)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
x = torch.ones(4, 8)
served = precompile.load(f"{sys.argv[1]}/built_inference.py", f"{sys.argv[1]}/built_inference.cache")
with torch.inference_mode(), precompile.no_compilation():
    print(json.dumps(torch.equal(served(mlp, x), dc.calls_model(mlp, x))))
"""


def test_a_model_built_under_inference_mode_loads_outside_it_and_serves(tmp_path):
    """A model built under inference_mode holds inference-tensor parameters that require grad: the
    artifact's example tensors for them are made, requires_grad included, inside inference mode, as
    torch refuses requires_grad on an inference tensor outside it; loading outside inference mode works."""
    with torch.inference_mode():
        torch.manual_seed(1)
        mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    pair = _capture(tmp_path, "built_inference", dynamo_cases.calls_model, [((mlp, torch.ones(4, 8)), {})],
                    mode=torch.inference_mode)
    assert "inference=(" in pair["artifact"].read_text()
    assert fresh_json(SERVE_AN_INFERENCE_MODEL, str(tmp_path), str(dynamo_cases.__file__.rsplit("/", 1)[0])) is True


def test_diff_names_a_release_captured_under_inference_mode_and_finds_a_recapture_equal(tmp_path, capsys):
    """A release that differs in one thing (its calls ran under inference_mode) diffs on exactly the
    tensors whose keys were read under it; a release that differs in nothing diffs equal."""
    import json

    from precompile.cli.main import main

    torch.manual_seed(1)
    mlp, x = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)), torch.ones(4, 8)
    pairs = {name: _capture(tmp_path, name, dynamo_cases.calls_model, [((mlp, x), {})], mode=mode)
             for name, mode in (("a", torch.no_grad), ("again", torch.no_grad), ("inference", torch.inference_mode))}
    files = {name: (str(p["artifact"]), str(p["cache"])) for name, p in pairs.items()}
    assert main(["diff", *files["a"], *files["again"]]) == 0, capsys.readouterr().out
    capsys.readouterr()
    assert main(["diff", "--json", *files["a"], *files["inference"]]) == 1
    entries = {(e["section"], e["key"]): e for e in json.loads(capsys.readouterr().out)["entries"]}
    changed = {key for key, entry in entries.items() if str(entry.get("b", "")).endswith("keys read under inference_mode")}
    assert ("inputs", "x") in changed and len(changed) == 5, entries  # x and the four parameters


def test_a_call_changed_state_warning_is_given_for_a_counter_not_for_a_mode_around_one_call(tmp_path):
    """The check that each captured call would be served again runs under the mode that call ran
    under: autocast or inference_mode around one capture call is how it is served, not a change of
    state. A counter the forward bumps and reads is one, and is warned about."""
    import warnings

    torch.manual_seed(1)
    mlp, x = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)), torch.ones(4, 8)

    def captured_warnings(fn, calls):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.no_grad(), precompile.capture(fn, artifact_path=tmp_path / f"{fn.__name__}.py", cache_path=tmp_path / "c.cache",
                                                     tracer=precompile.DynamoTracer(), backend="eager") as cap:
                for mode, args in calls:
                    with mode():
                        cap(*args)
        return [str(w.message) for w in caught if "changed state that its own guards check" in str(w.message)]

    bfloat16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    assert captured_warnings(dynamo_cases.calls_model, [(bfloat16, (mlp, x)), (torch.inference_mode, (mlp, x))]) == []
    counted = captured_warnings(dynamo_cases.calls_model, [(contextlib.nullcontext, (dynamo_cases.CountsCalls(), x))])
    assert len(counted) == 1 and "call 1 of the capture" in counted[0], counted


def test_the_driver_hashes_inlined_source_exactly_as_dynamo_does():
    from torch._dynamo.package import _hash_sourcelines

    from precompile.codegen.drivers import source_checks as driver

    def ours(module, first, last):
        return driver.hash_source_lines(driver.module_source_lines(module.__name__, "artifact.py"), first, last)

    for module, first, last in [(dynamo_cases, 1, 12), (transformer, 10, 40), (dynamo_cases, 5, 5), (math, 1, 2)]:
        try:
            theirs = _hash_sourcelines(module, first, last)
        except (OSError, TypeError) as exc:
            with pytest.raises(type(exc)):
                ours(module, first, last)
            continue
        assert ours(module, first, last) == theirs
    assert ours(dynamo_cases, 1, 3) == hashlib.sha256(
        "".join(inspect.getsourcelines(dynamo_cases)[0][0:2]).encode()).hexdigest()


def test_a_whole_file_hash_is_recorded_only_where_it_proves_every_range(monkeypatch):
    from pathlib import Path

    from precompile.artifact.metadata import InlinedFile, InlinedSource
    from precompile.capturing.inlined_files import _decoded_lines, inlined_files
    from precompile.codegen.drivers import source_checks as driver

    for module in (dynamo_cases, transformer):  # decoded as linecache decodes, so as Dynamo hashed
        assert _decoded_lines(Path(module.__file__).read_bytes()) == inspect.getsourcelines(module)[0]
    lines = inspect.getsourcelines(dynamo_cases)[0]
    right = InlinedSource(module="dynamo_cases", first_line=1, last_line=4, sha256=driver.hash_source_lines(lines, 1, 4))
    edited = InlinedSource(module="dynamo_cases", first_line=5, last_line=7, sha256="0" * 64)
    data = Path(dynamo_cases.__file__).read_bytes()
    whole = hashlib.sha256(data).hexdigest()
    head, span = (0, len("".join(lines[:2]).encode())), (0, len("".join(lines[:3]).encode()))  # Dynamo's ranges end before last_line
    assert inlined_files([right]) == (InlinedFile(module="dynamo_cases", spans=(head, span),
                                                  sha256=hashlib.sha256(data[:head[1]] + data[:span[1]]).hexdigest()),)
    assert inlined_files([right, edited]) == ()
    assert inlined_files([InlinedSource(module="math", first_line=1, last_line=2, sha256="0" * 64)]) == ()

    files = [{"module": "dynamo_cases", "sha256": whole}]
    assert driver._unchanged_modules({"INLINED_FILES": files}) == {"dynamo_cases"}
    assert driver._unchanged_modules({"INLINED_FILES": [{"module": "dynamo_cases", "sha256": "0" * 64},
                                                        {"module": "math", "sha256": whole},
                                                        {"module": "__main__", "sha256": whole}]}) == set()

    def unread(name, artifact):
        raise AssertionError(f"{name}'s lines were read although its file is unchanged")

    monkeypatch.setattr(driver, "module_source_lines", unread)
    sources = [msgspec.to_builtins(right)]
    driver._check_sources({"INLINED_SOURCES": sources, "INLINED_FILES": files}, "artifact.py")
    with pytest.raises(AssertionError, match="lines were read"):
        driver._check_sources({"INLINED_SOURCES": sources}, "artifact.py")  # written before INLINED_FILES


def test_inlined_spans_pass_only_as_the_same_whole_lines(tmp_path):
    """The spans InlinedFile hashes pass only while each still holds the same bytes and begins and ends
    a line: a newline removed before one, or a last line extended past the end of the file, fails."""
    from precompile.codegen.drivers import source_checks as driver

    captured = b"a = 1\ndef f():\n    return 2\nb = f()"
    spans = ((6, 28), (28, len(captured)))
    entry = {"module": "m", "sha256": driver.hash_spans(captured, spans), "spans": [list(span) for span in spans]}
    path = tmp_path / "m.py"
    for now, unchanged in ((captured, True),
                           (captured.replace(b"a = 1", b"a = 9"), True),  # outside the spans
                           (captured.replace(b"1\n", b"1 "), False),  # same bytes, no longer a line of their own
                           (captured + b" + 1\n", False),  # the last line goes on past the span
                           (captured[:-1], False)):
        path.write_bytes(now)
        assert driver._file_unchanged(str(path), entry) is unchanged, now
    path.write_bytes(captured)
    for forged in ([[-1, 6]], [[28, 6]], [[6, 28], [28, len(captured) + 1]], [[0, 2**40]], [[1.5, 3]], ["ab"], [[0, 10, 3]]):
        assert not driver._file_unchanged(str(path), {**entry, "spans": forged})
    empty = {"module": "m", "sha256": hashlib.sha256(b"").hexdigest(), "spans": [[6, 6]]}
    assert driver._file_unchanged(str(path), empty) and not driver._file_unchanged(str(path), {**empty, "spans": [[7, 7]]})
    # an entry written before spans hashes the whole file
    assert driver._file_unchanged(str(path), {"module": "m", "sha256": hashlib.sha256(captured).hexdigest()})
    assert not driver._file_unchanged(str(path), {"module": "m", "sha256": entry["sha256"]})


def test_inlined_spans_pin_the_encoding_declaration(tmp_path, monkeypatch):
    """Capture always hashes a file's first two lines with its spans: a coding cookie written there
    (same length, outside every range) changes what the range's bytes mean, and fails the spans. An
    edit that moves the range to other line numbers without moving its bytes passes: same text."""
    from precompile.artifact.metadata import InlinedSource
    from precompile.capturing.inlined_files import inlined_files
    from precompile.codegen.drivers import source_checks as driver

    captured = '# padding comment line one x\nimport torch\n# xx\ndef step(x):\n    return x.sin() * len("+AGE-")\n'
    (tmp_path / "cookie_module.py").write_text(captured)
    monkeypatch.syspath_prepend(str(tmp_path))
    lines = captured.splitlines(keepends=True)
    recorded = InlinedSource(module="cookie_module", first_line=4, last_line=6, sha256=driver.hash_source_lines(lines, 4, 6))
    (entry,) = inlined_files([recorded])
    assert entry.spans == ((0, len("".join(lines[:2]))), (len("".join(lines[:3])), len(captured)))
    path, as_written = str(tmp_path / "cookie_module.py"), msgspec.to_builtins(entry)
    for now, unchanged in ((captured, True),
                           (captured.replace("# padding comment line one x", "# coding: utf-7 xxxxxxxxxxxx"), False),
                           (captured.replace("import torch\n", "import\ttorch\n"), False),
                           (captured.replace("# xx\n", "#\n#x\n"), True)):  # step moves to line 5, its bytes stay
        (tmp_path / "cookie_module.py").write_text(now)
        assert driver._file_unchanged(path, as_written) is unchanged, now


def test_the_driver_finds_an_inlined_module_file_without_importing_it():
    """Dynamo's polyfills live under torch._dynamo: their source is found and hashed, not imported."""
    import torch._dynamo.polyfills.builtins as polyfills

    from precompile.codegen.drivers import source_checks as driver

    for module in (polyfills, transformer, dynamo_cases):
        assert driver._unimported_origin(module.__name__) == module.__file__
    assert driver._unimported_origin("math") is None  # built in: no source file, so it is imported instead
    assert driver._unimported_origin("precompile.no_such_module") is None


def test_the_driver_finds_a_module_file_whose_package_was_never_imported(tmp_path, monkeypatch):
    """The search walks the package path without executing a package's __init__ or the module."""
    from precompile.codegen.drivers import source_checks as driver

    package = tmp_path / "never_imported_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('the package was executed')\n")
    (package / "inlined.py").write_text("raise RuntimeError('the module was executed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert driver._unimported_origin("never_imported_pkg.inlined") == str(package / "inlined.py")
    assert driver._unimported_origin("never_imported_pkg.absent") is None
    assert "never_imported_pkg" not in sys.modules and "never_imported_pkg.inlined" not in sys.modules


def test_tensor_rows_alike_share_an_example_and_each_keeps_its_own_sizes():
    """The driver builds one example tensor per (type, dtype, device, requires_grad): rows that share
    one still check their own sizes, strides and kinds, positionally."""
    from precompile.codegen.drivers import dynamo_guards

    parameter = "torch.nn.parameter:Parameter"
    rows = (("a", parameter, "torch.float32", "cpu", True, (2, 3), (3, 1)),
            ("b", parameter, "torch.float32", "cpu", True, (4,), (1,)),
            ("c", "torch:Tensor", "torch.float32", "cpu", False, (None,), (1,)))
    match = dynamo_guards._TensorMatch(rows)
    a, b = torch.nn.Parameter(torch.ones(2, 3)), torch.nn.Parameter(torch.ones(4))
    assert match.check((a, b, torch.ones(7)))
    assert not match.check((b, a, torch.ones(7)))
    assert "'a'" in match.reason((b, a, torch.ones(7)))
    assert not match.check((a, torch.nn.Parameter(torch.ones(4, dtype=torch.float64)), torch.ones(7)))
    assert not match.check((a, b, torch.nn.Parameter(torch.ones(7))))


def test_a_module_imported_from_a_zip_archive_is_read_through_its_loader(tmp_path, monkeypatch):
    """Its origin is a path inside the archive, which linecache cannot open: the driver imports the
    module and reads its source through the zip loader, so an unchanged module passes the check."""
    import zipfile

    from precompile.codegen.drivers import source_checks as driver

    text = "def inner(x):\n    return x * 2\n"
    with zipfile.ZipFile(tmp_path / "lib.zip", "w") as archive:
        archive.writestr("zipped_inlined.py", text)
    monkeypatch.syspath_prepend(str(tmp_path / "lib.zip"))
    monkeypatch.delitem(sys.modules, "zipped_inlined", raising=False)
    assert driver._unimported_origin("zipped_inlined") is None
    source = {"module": "zipped_inlined", "first_line": 1, "last_line": 3,
              "sha256": driver.hash_source_lines(text.splitlines(keepends=True), 1, 3)}
    driver._check_sources({"INLINED_SOURCES": [source]}, "artifact.py")
    monkeypatch.delitem(sys.modules, "zipped_inlined")


def test_the_dynamo_utils_stand_in_does_what_torch_does():
    from torch._dynamo import utils

    from precompile.codegen.drivers import dynamo as driver
    from precompile.capturing.dynamo.standalone import DYNAMO_UTILS_STAND_IN

    x = torch.ones(3, 4)[:, 1:]
    stand_in = driver._DynamoUtils()
    assert all(hasattr(stand_in, name) and hasattr(utils, name) for name in DYNAMO_UTILS_STAND_IN)
    assert stand_in.call_size(x, 1) == utils.call_size(x, 1) and stand_in.call_stride(x, 0) == utils.call_stride(x, 0)
    assert stand_in.call_storage_offset(x) == utils.call_storage_offset(x)
    cm = stand_in.record_pregraph_bytecode_enter()
    stand_in.record_pregraph_bytecode_exit(cm)
    with torch.autograd.profiler.profile() as prof:
        stand_in.record_pregraph_bytecode_exit(stand_in.record_pregraph_bytecode_enter())
    assert any(event.name == "Pregraph bytecode" for event in prof.function_events)


def test_the_stand_in_serves_where_dynamo_keeps_its_utils_module_in_a_local():
    """torch 2.15's Dynamo stores torch._dynamo.utils in a local before its graph and reads its
    profiler range from that local only when profiling: the attributes read through the local count
    as read from the module (so the stand-in serves, and load never imports Dynamo), and a local
    passed on whole counts as the module used otherwise."""
    from precompile.capturing.dynamo.standalone import _attributes_read

    def keeps_it_in_a_local(x):
        profiling = _profiler_enabled  # noqa: F821 (the names are only compiled, never run)
        utils = dynamo_utils  # noqa: F821
        cm = None
        if profiling:
            cm = utils.record_pregraph_bytecode_enter()
        y = utils.call_size(x, 0)
        if cm is not None:
            utils.record_pregraph_bytecode_exit(cm)
        return y

    def passes_it_on(x):
        utils = dynamo_utils  # noqa: F821
        return print(utils)

    assert _attributes_read([keeps_it_in_a_local.__code__])["dynamo_utils"] == {
        "record_pregraph_bytecode_enter", "call_size", "record_pregraph_bytecode_exit"}
    assert _attributes_read([passes_it_on.__code__])["dynamo_utils"] == {"<used otherwise>"}


def test_a_guard_python_code_cannot_check_refuses_the_capture_naming_it_and_the_remedy(tmp_path):
    """No guard state travels pickled: a variant holding a kept guard with no faithful rendering (here
    the torch function mode a `with torch.device(...)` block pushes) refuses the capture at write time,
    naming the guard, why, and what serves instead; nothing is written."""
    with pytest.raises(precompile.CaptureRefused) as refused:
        with torch.no_grad(), torch.device("cpu"), precompile.capture(
            dynamo_cases.uses_global, artifact_path=tmp_path / "dev.py", cache_path=tmp_path / "dev.cache",
            tracer=precompile.DynamoTracer(), backend="eager",
        ) as cap:
            cap(torch.ones(3))
    message = str(refused.value)
    assert "Frame 0 (uses_global), variant 0 keeps a guard python_code cannot check" in message
    assert "TORCH_FUNCTION_STATE: the capture ran under torch function modes" in message
    assert "guard_filter_fn" in message and "MakeFxTracer" in message
    assert not (tmp_path / "dev.py").exists()


def _refused_uses_global(directory) -> str:
    """The CaptureRefused message of a Dynamo capture of uses_global into `directory` (g.py, g.cache)."""
    with pytest.raises(precompile.CaptureRefused) as refused:
        with torch.no_grad(), precompile.capture(
            dynamo_cases.uses_global, artifact_path=directory / "g.py", cache_path=directory / "g.cache",
            tracer=precompile.DynamoTracer(), backend="eager",
        ) as cap:
            cap(torch.ones(3))
    return str(refused.value)


def test_guard_state_torch_cannot_read_back_refuses_the_capture_naming_the_frame(tmp_path, monkeypatch):
    """torch 2.11 saves a guard on a function's __defaults__ (transformers' masking helpers) in a form
    its own loader rejects with a TypeError: the capture is refused with what happened and what
    serves instead, not torch's traceback, and nothing is written."""
    import torch._dynamo.package

    def rejecting(saved):
        raise TypeError("DefaultsSource.__init__() takes from 3 to 4 positional arguments but 6 were given")

    # Capture reads guard state back the way the installed driver does (drivers/dynamo_checks.py read_guards_state).
    monkeypatch.setattr(torch._dynamo.package, "load_guards_state", rejecting)
    message = _refused_uses_global(tmp_path)
    assert "cannot read back the guard state it saved for uses_global" in message
    assert "TypeError: DefaultsSource.__init__()" in message and "MakeFxTracer" in message
    assert not (tmp_path / "g.py").exists() and not (tmp_path / "g.cache").exists()


UNPICKLABLE_GLOBAL = """
import torch
LOG = open(__file__)  # an open file: Dynamo guards the global the branch reads, which does not pickle

def branches_on_an_open_file(x):
    return x * 2 if LOG is not None else x
"""


@pytest.mark.compat
def test_a_global_the_guards_read_that_cannot_be_pickled_refuses_the_capture_naming_it(tmp_path, monkeypatch):
    """Dynamo pickles each frame's guard state as it compiles: a global its guards read that does not
    pickle (an open file, a lock) is a CaptureRefused naming it and the remedy, not torch's internal
    error, and nothing is written."""
    (tmp_path / "holds_a_file.py").write_text(UNPICKLABLE_GLOBAL)
    monkeypatch.syspath_prepend(str(tmp_path))
    import holds_a_file

    with pytest.raises(precompile.CaptureRefused) as refused:
        with precompile.capture(holds_a_file.branches_on_an_open_file, artifact_path=tmp_path / "f.py",
                                cache_path=tmp_path / "f.cache", tracer=precompile.DynamoTracer(), backend="eager") as cap:
            cap(torch.ones(3))
    holds_a_file.LOG.close()
    message = str(refused.value)
    assert "its guards read the global 'LOG' (a _io.TextIOWrapper), which cannot be pickled" in message
    assert "MakeFxTracer" in message
    assert not (tmp_path / "f.py").exists() and not (tmp_path / "f.cache").exists()


@pytest.mark.compat
def test_a_failure_inside_torchs_guard_building_refuses_the_capture_naming_torch_and_the_remedy(tmp_path, monkeypatch):
    """torch 2.12's guard building asserts on transformers' per-layer config views ("Guarded object
    must be identical, None or ephemeral", in torch._guards, called from torch._dynamo.guards): the
    capture is a CaptureRefused saying it is torch's failure and what serves instead, not torch's
    traceback; an exception fn raises itself still reaches the caller as it is."""
    import torch._guards

    def asserting(self, *args, **kwargs):
        raise AssertionError("Guarded object must be identical, None or ephemeral (dead weakref)")

    # Raised from a frame of torch._guards, as torch's own assertion is.
    asserting = types.FunctionType(asserting.__code__, vars(torch._guards), "set_export_info")
    monkeypatch.setattr(torch._guards.Guard, "set_export_info", asserting)
    message = _refused_uses_global(tmp_path)
    assert "failed inside Dynamo's own guard building" in message and "torch's failure, not fn's" in message
    assert "AssertionError: Guarded object must be identical" in message and "MakeFxTracer" in message
    assert not (tmp_path / "g.py").exists() and not (tmp_path / "g.cache").exists()
    monkeypatch.undo()
    with pytest.raises(ValueError, match="fn's own error"):
        with precompile.capture(dynamo_cases.raises_its_own, artifact_path=tmp_path / "r.py", cache_path=tmp_path / "r.cache",
                                tracer=precompile.DynamoTracer(), backend="eager") as cap:
            cap(torch.ones(3))


def test_a_module_dynamo_bound_by_id_is_checked_by_name_from_the_saved_scope_or_the_live_globals():
    """Dynamo binds a module its code reaches (transformers' `torch`) under a name minted from its id:
    torch 2.13 saves it in the guard state's scope, 2.12 and 2.14 leave it only in the frame's live
    module globals. Either way the guard reads the module by name; a minted global that is not a
    module, or is nowhere, still refuses."""
    from types import SimpleNamespace

    from precompile.capturing.dynamo.guard_code import Unrenderable, _Variant

    def variant(saved, live):
        state = SimpleNamespace(output_graph=SimpleNamespace(global_scope=saved, local_scope={}))
        return _Variant(0, 0, state, {}, module_globals=live)

    guard = "G['_139811834291808_c0'].Tensor"
    for saved, live in (({"_139811834291808_c0": torch}, {}), ({}, {"_139811834291808_c0": torch})):
        rendering = variant(saved, live)
        assert rendering.expression(guard, "CLASS_MATCH") == "_by_name['torch:'].Tensor"
        assert rendering.references == {"torch:"}
    for live in ({"_139811834291808_c0": object()}, {}):
        with pytest.raises(Unrenderable, match="a global Dynamo bound by id"):
            variant({}, live).expression(guard, "CLASS_MATCH")


SERVE_REGISTRY = r"""
import sys, torch, precompile
import library_cases
served = precompile.load(sys.argv[1], sys.argv[2])
with torch.no_grad(), precompile.no_compilation():
    print(served(torch.ones(3)).tolist())
"""


def test_a_global_dict_subclass_whose_setitem_refiles_keys_is_guarded_by_its_live_keys(tmp_path):
    """The guards compare with what the capture's live objects held, not with a pickled copy of them:
    unpickling this registry replays its __setitem__, which files "scale" under "<class 'str'>", and a
    check built from that copy refused every fresh-process call."""
    import library_cases

    artifact, cache = tmp_path / "registry.py", tmp_path / "registry.cache"
    with torch.no_grad(), precompile.capture(library_cases.scaled_by_the_first_entry, artifact_path=artifact,
                                             cache_path=cache, backend="eager") as cap:
        cap(torch.ones(3))
    text = artifact.read_text(encoding="utf-8")
    assert "list(dict.keys(G['REGISTRY'])) == ['scale']" in spelled_out(text)
    assert "\n_dynamo_state = None\n" in text
    assert fresh_json(SERVE_REGISTRY, str(artifact), str(cache)) == [3.0, 3.0, 3.0]


def spelled_out(text: str) -> str:
    """python_code with each guard function's source locals (`sN = path`) replaced by their paths, by
    plain text substitution (the latest bound first, as each local is bound from earlier ones)."""
    spelled = []
    for part in re.split(r"(?=^def )", text, flags=re.MULTILINE):  # each function numbers its own
        bound = dict(re.findall(r"^ +(s\d+) = (.+)$", part, flags=re.MULTILINE))
        for name in sorted(bound, key=lambda local: -int(local[1:])):
            part = re.sub(rf"\b{name}\b(?! =(?!=))", lambda _, path=bound[name]: path, part)
        spelled.append(part)
    return "".join(spelled)


def test_precompile_guards_prints_for_each_kept_guard_the_condition_that_runs(captured, capsys):
    """`precompile guards` reads the rendered functions (ast, never executed): each kept slot shows the
    condition python_code checks on every call, or why torch itself checks nothing there."""
    import json

    from test_inspect_helpers import run_cli

    path = captured["keywords"]["artifact"]
    text = spelled_out(path.read_text(encoding="utf-8"))
    rc, out, _ = run_cli(capsys, ["guards", "--json", str(path)])
    assert rc == 0
    frames = json.loads(out)["guards"]["frames"]
    kept = [slot for frame in frames for slot in frame["slots"] if slot["status"] == "kept"]
    assert kept and all(slot["check"] for slot in kept if slot["guard_type"] != "SHAPE_ENV")
    for slot in kept:
        check = slot["check"]
        if slot["guard_type"] == "TENSOR_MATCH":  # what its row of the one TensorGuards call checks
            assert f"({slot['source']!r}, " in text and ", size (" in check and ", stride (" in check, slot
            continue
        if check.startswith("not checked: "):
            assert f"# {slot['guard_type']}" in text and check.removeprefix("not checked: ") in text
            continue
        if slot["guard_type"] == "GLOBAL_STATE":  # the fields its rendered state literal holds, each with its value
            assert "_GlobalState('" in text and "grad_mode " in check and '"grad_mode":' in text, slot
            continue
        for part in filter(None, check.split(" and ")):
            assert part in " ".join(text.split()), (slot, part)
    assert any(slot["check"] == "type(L['alpha']) is float and L['alpha'] == 1.0" for slot in kept), kept


def test_a_kept_guard_names_the_users_line_that_made_it_in_python_code_and_in_precompile_guards(captured, capsys):
    """As TORCH_LOGS=guards and depyf do: the user's file (by its module's path, never this machine's
    absolute one), line, function and code beside the check, in python_code and `precompile guards`."""
    import json

    from test_inspect_helpers import run_cli

    lines, first = inspect.getsourcelines(dynamo_cases.keyword_step)
    at = next(first + i for i, line in enumerate(lines) if "alpha" in line and "def " not in line)
    made_at = f"dynamo_cases.py:{at} in keyword_step: out = x.cos() * alpha"
    path = captured["keywords"]["artifact"]
    text = path.read_text(encoding="utf-8")
    assert f"  # {made_at}\n" in text and str(Path(dynamo_cases.__file__).parent) not in text
    rc, out, _ = run_cli(capsys, ["guards", "--json", str(path)])
    assert rc == 0
    slots = [slot for frame in json.loads(out)["guards"]["frames"] for slot in frame["slots"]]
    assert [slot["origin"] for slot in slots if slot["guard_type"] == "CONSTANT_MATCH" and slot["source"] == "alpha"] == [made_at]
    rc, out, _ = run_cli(capsys, ["guards", str(path)])
    assert f"made at {made_at}" in out


def _every_kind(a, b, /, c, d=4, *args, e, f=6, **kw):
    pass


def _keywords_only(a, *, k):
    pass


def _defaults(x, scale=2.0):
    pass


def test_the_driver_binds_a_comprehension_frame_by_position():
    """A comprehension's code takes its iterator as `.0`, which no def can spell."""
    from precompile.codegen.drivers import dynamo as driver

    code = next(c for c in compile("{k: v for k, v in pairs}", "<x>", "eval").co_consts if hasattr(c, "co_varnames"))
    binder = driver._binder(code, code.co_name, None, None)
    items = iter([(1, 2)])
    assert binder(items) == {".0": items}


@pytest.mark.parametrize("fn, args, kwargs", [
    (_every_kind, (1, 2, 3), {"e": 5}), (_every_kind, (1, 2, 3, 9, 10, 11), {"e": 5, "z": 1}),
    (_keywords_only, (1,), {"k": 2}), (_defaults, (1,), {}), (_defaults, (1,), {"scale": 3.0}),
    (_defaults, (1, 2, 3), {}), (_keywords_only, (1, 2), {}), (_every_kind, (1,), {"b": 2, "c": 3, "e": 5}),
])
def test_the_driver_binds_arguments_as_the_signature_does(fn, args, kwargs):
    """The locals the guards read: Python's own binding, defaults applied, in signature order; a call
    the signature refuses is refused."""
    from precompile.codegen.drivers import dynamo as driver

    binder = driver._binder(fn.__code__, fn.__name__, fn.__defaults__, fn.__kwdefaults__)
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        with pytest.raises(TypeError):
            binder(*args, **kwargs)
        return
    bound.apply_defaults()
    assert list(binder(*args, **kwargs).items()) == list(bound.arguments.items())


@pytest.mark.parametrize("line, parts", [
    ("ID_MATCH cfg.__dict__['mode'] == 'x is y == z'", ("cfg.__dict__['mode']", "==", "'x is y == z'")),
    ("ID_MATCH L['flag'] == None", ("L['flag']", "==", "None")),
    ("CLASS_MATCH type(G['m'].x) is pkg.mod:Cls@1", ("type(G['m'].x)", "is", "pkg.mod:Cls@1")),
])
def test_identity_lines_split_at_their_operator_whatever_the_literal_holds(line, parts):
    """By-name (`source is module:qualname`) and by-value (`source == literal`) identity lines: the
    renderer and the installed driver read the same three parts."""
    from precompile.capturing.dynamo.named_identity import CHECK
    from precompile.codegen.drivers import dynamo_checks as driver

    assert driver._identity_parts(line) == parts
    assert CHECK.fullmatch(line.split(" ", 1)[1]).groups() == parts


def test_notes_on_many_guards_of_one_kind_and_reason_fold_into_one_counted_line():
    from precompile.capturing.dynamo.guard_function import FOLDED_NOTES, folded_notes

    hooks = "skipped by torch (torch._dynamo.config.skip_nnmodule_hook_guards)"
    many = [(f"EMPTY_NN_MODULE_HOOKS_DICT model._modules['{i}']._forward_hooks", hooks) for i in range(FOLDED_NOTES + 1)]
    few = [(f"TENSOR_MATCH w{i}", "dimension markings") for i in range(FOLDED_NOTES)]
    lines = folded_notes([("GRAD_MODE", "checked by GLOBAL_STATE"), *many, *few, ("TENSOR_MATCH x", "another reason")])
    assert lines == [
        "GRAD_MODE: checked by GLOBAL_STATE",
        f"EMPTY_NN_MODULE_HOOKS_DICT on {FOLDED_NOTES + 1} sources (the metadata's guard list names each): {hooks}",
        *(f"{label}: dimension markings" for label, _ in few),
        "TENSOR_MATCH x: another reason",
    ]



_SERVE_CHANGED = r"""
import sys, torch, precompile, state_cases as sc
served = precompile.load(sys.argv[1], sys.argv[2])
m, x = sc.Activated(), torch.randn(2, 4)
with torch.no_grad():
    assert torch.equal(served(m, x), sc.step(m, x))
    change = sys.argv[3]
    if change == "act":
        m.act = torch.tanh
    elif change == "hook":
        m.lin.register_forward_hook(lambda module, inputs, output: output * 2)
    else:
        m.register_forward_pre_hook(lambda module, args: None)
    try:
        served(m, x)
    except precompile.CallMismatch as exc:
        print(repr(str(exc)))
        sys.exit(0)
print(repr("served"))
"""


@pytest.mark.parametrize(("change", "message"), [
    ("act", r"BUILTIN_MATCH model\.act is torch:relu \(this call's model\.act is torch\.\S*tanh\)"),
    ("hook", r"EMPTY_NN_MODULE_HOOKS_DICT model\._modules\['lin'\]\._forward_hooks \(this call's "
             r"model\._modules\['lin'\]\._forward_hooks is an OrderedDict of 1 item\)"),
    ("pre hook", r"EMPTY_NN_MODULE_HOOKS_DICT model\._forward_pre_hooks \(this call's model\._forward_pre_hooks is an OrderedDict of 1 item\)"),
])
def test_a_function_kept_as_a_setting_or_a_hook_registered_after_capture_is_refused(tmp_path_factory, change, message):
    """Both served the captured computation silently before: torch's builtins are named by
    qualname (torch.relu's is _VariableFunctionsClass.relu, which names another object), so their
    identity guard was dropped; Dynamo skips its guards on module hooks unless told not to."""
    import ast

    import state_cases as sc

    directory = tmp_path_factory.getbasetemp() / "activated"
    if not (directory / "act.cache").exists():
        directory.mkdir(exist_ok=True)
        _capture(directory, "act", sc.step, [((sc.Activated(), torch.randn(2, 4)), {})])
    proc = run_fresh(_SERVE_CHANGED, str(directory / "act.py"), str(directory / "act.cache"), change)
    assert proc.returncode == 0, proc.stderr
    assert re.search(message, ast.literal_eval(proc.stdout.strip().splitlines()[-1]))


SERVE_NO_GRAD_POSITIONS = r"""
import json, sys, torch, precompile, dynamo_cases
served = precompile.load(sys.argv[1], sys.argv[2])
model, x = dynamo_cases.with_no_grad_positions(), torch.randn(2, 4)
with torch.no_grad(), precompile.no_compilation():
    print(json.dumps(torch.equal(served(model, x), dynamo_cases.call(model, x))))
"""


def test_a_layer_decorated_with_no_grad_is_captured_and_served(tmp_path):
    """Its forward closes over a bound method: Dynamo's TYPE_MATCH on that cell names an interpreter
    type builtins does not export (`method`), checked by its name in the types module (speech2text was
    refused as having a guard python_code cannot check)."""
    from precompile.capturing.dynamo.named_identity import reference, resolve

    assert reference(types.MethodType) == "types:MethodType" and resolve("types:MethodType") is types.MethodType
    model, x = dynamo_cases.with_no_grad_positions(), torch.randn(2, 4)
    paths = (tmp_path / "p.py", tmp_path / "p.cache")
    with torch.no_grad(), precompile.capture(dynamo_cases.call, artifact_path=paths[0], cache_path=paths[1],
                                             tracer=precompile.DynamoTracer(), backend="eager") as cap:
        cap(model, x)
    assert fresh_json(SERVE_NO_GRAD_POSITIONS, str(paths[0]), str(paths[1])) is True


SERVE_DTYPE_KEYED = r"""
import json, sys, torch, precompile, dynamo_cases
served = precompile.load(sys.argv[1], sys.argv[2])
x = torch.randn(2, 4)
with precompile.no_compilation():
    out = {"same": torch.equal(served(x), dynamo_cases.positions_in_float64(x))}
    dynamo_cases.UNSUPPORTED[torch.float64] = frozenset({"cpu"})  # eager now computes in float32
    try:
        served(x)
        out["changed"] = "served"
    except precompile.PrecompileError as exc:
        out["changed"] = str(exc)
print(json.dumps(out))
"""


def test_a_dict_read_by_a_dtype_key_is_checked_and_served(tmp_path):
    """diffusers' Flux reads `_DTYPE_UNSUPPORTED_DEVICES.get(torch.float64)`: Dynamo's guard source writes
    the key as `torch.float64`, which the capture refused as a name the serving process does not define.
    The check reads the key from python_code's torch; a changed value is a miss, not the captured graph."""
    x = torch.randn(2, 4)
    paths = (tmp_path / "p.py", tmp_path / "p.cache")
    with precompile.capture(dynamo_cases.positions_in_float64, artifact_path=paths[0], cache_path=paths[1],
                            tracer=precompile.DynamoTracer(), backend="eager") as cap:
        cap(x)
    assert "G['UNSUPPORTED'][torch.float64]" in paths[0].read_text()
    out = fresh_json(SERVE_DTYPE_KEYED, str(paths[0]), str(paths[1]))
    assert out["same"] is True
    assert "CONSTANT_MATCH G['UNSUPPORTED'][torch.float64]" in out["changed"], out["changed"]


SET_CAPTURE = r"""
import sys, torch, precompile, dynamo_cases as dc
with precompile.capture(dc.drops_unsupported, artifact_path=sys.argv[1] + ".py", cache_path=sys.argv[1] + ".cache",
                        tracer=precompile.DynamoTracer(), backend="eager") as cap:
    cap(torch.ones(2), scale=1.0, other=2)
"""
SET_SERVE = r"""
import json, sys, torch, precompile, dynamo_cases as dc
served = precompile.load(sys.argv[1] + ".py", sys.argv[1] + ".cache")
with precompile.no_compilation():
    print(json.dumps(torch.equal(served(torch.ones(2), scale=1.0, other=2), dc.drops_unsupported(torch.ones(2), scale=1.0, other=2))))
"""


def test_a_guard_on_a_set_of_names_renders_alike_under_any_hash_seed(tmp_path, capsys):
    """A set of str iterates in the order of the process's string hash seed (diffusers' attention backends'
    argument names): its guard is rendered with its members sorted, so two captures diff equal, and the
    artifact serves under a third seed."""
    from test_inspect_helpers import run_cli

    for seed in ("1", "2"):
        proc = run_fresh(SET_CAPTURE, str(tmp_path / f"seed{seed}"), env={"PYTHONHASHSEED": seed})
        if proc.returncode and torch.__version__.startswith(("2.11.", "2.12.")):  # Dynamo asserts tracing it there
            pytest.skip(f"torch {torch.__version__}'s Dynamo fails inside tracing diffusers' set(kwargs) - set(names)")
        assert proc.returncode == 0, proc.stderr
    rc, out, _ = run_cli(capsys, ["diff", str(tmp_path / "seed1"), str(tmp_path / "seed2")])
    assert rc == 0, out
    text = (tmp_path / "seed1.py").read_text()
    assert "{'attn_mask', 'dropout_p', 'enable_gqa', 'key', 'query', 'scale', 'value'}" in text
    assert fresh_json(SET_SERVE, str(tmp_path / "seed1"), env={"PYTHONHASHSEED": "3"}) is True


ENUM_SET_CAPTURE = r"""
import sys, torch, precompile, dynamo_cases as dc
fn, args = getattr(dc, sys.argv[2]), eval(sys.argv[3])
with precompile.capture(fn, artifact_path=sys.argv[1] + ".py", cache_path=sys.argv[1] + ".cache",
                        tracer=precompile.DynamoTracer(), backend="eager") as cap:
    cap(*args)
"""
ENUM_SET_SERVE = r"""
import json, sys, torch, precompile, dynamo_cases as dc
fn, args = getattr(dc, sys.argv[2]), eval(sys.argv[3])
try:
    served = precompile.load(sys.argv[1] + ".py", sys.argv[1] + ".cache")
    print(json.dumps(torch.equal(served(*args), fn(*args))))
except precompile.PrecompileError as exc:
    print(json.dumps(str(exc)))
"""


@pytest.mark.parametrize("fn, args, held", [
    ("tests_membership_in_an_enum_set", "(torch.ones(2),)", "G['KINDS']"),
    pytest.param("tests_membership_in_a_class_attribute_set", "(dc.Palette(), torch.ones(2))",
                 "dict(type(palette).__dict__)['KINDS']", marks=pytest.mark.skipif(
                     torch.__version__ < "2.13", reason="torch 2.11 and 2.12 keep no check of the members of a set read "
                     "through a class attribute (docs/torch-versions.md)")),
])
def test_a_set_of_enum_members_serves_under_any_hash_seed_or_says_the_seed_orders_it(tmp_path, fn, args, held):
    """`Kind.RED in KINDS`, a set of enum members. torch 2.11's Dynamo guards the membership (SET_CONTAINS,
    its key an enum member checked by name): any serving process serves it. Later Dynamos read the set
    by position, and a member hashes by its name, so the order follows the process's string hash seed
    (seeds 1 and 2 order this one otherwise; torch 2.14 and later spell the read `___set_getitem(s, i)`,
    which python_code renders as `list(s)[i]`): capture warns, a serving process under another seed
    refuses (the graph may have baked the order in), saying why and what to do, and under the
    capture's seed it serves."""
    proc = run_fresh(ENUM_SET_CAPTURE, str(tmp_path / "a"), fn, args, env={"PYTHONHASHSEED": "1"})
    assert proc.returncode == 0, proc.stderr
    assert fresh_json(ENUM_SET_SERVE, str(tmp_path / "a"), fn, args, env={"PYTHONHASHSEED": "1"}) is True
    other_seed = fresh_json(ENUM_SET_SERVE, str(tmp_path / "a"), fn, args, env={"PYTHONHASHSEED": "2"})
    if "PrecompileWarning" not in proc.stderr:  # checked as a membership: no order to follow
        assert re.search(r"set\.__contains__\(\w+, _by_name\['dynamo_cases:Kind\.RED'\]\)", (tmp_path / "a.py").read_text())
        assert other_seed is True, other_seed
        return
    assert f"PrecompileWarning: the guards read set {held} member by member" in proc.stderr, proc.stderr
    assert "(this capture ran under PYTHONHASHSEED=1)" in proc.stderr
    assert re.search(rf"this call's .*list\({re.escape(held)}\)\[0\](\._name_)? is ('BLUE'|dynamo_cases\.Kind\.BLUE)",
                     other_seed), other_seed
    assert f"{held} is a set, whose order follows the process's hash seed" in other_seed
    assert "under one fixed PYTHONHASHSEED, or make it a tuple" in other_seed


def test_a_context_var_read_while_traced_is_checked_and_a_change_misses(tmp_path):
    """torch 2.15's config module keeps a user's override of a setting in a ContextVar, and Dynamo
    guards what its `.get()` held (functional collectives read one: every distributed capture): the
    artifact checks it, so a changed value misses instead of serving the branch captured. Earlier
    torches break the graph at the read and check the value it returned."""
    x = torch.ones(3)
    pair = _capture(tmp_path, "context_var", dynamo_cases.branches_on_a_context_var, [((x,), {})])
    served = precompile.load(pair["artifact"], pair["cache"])
    with torch.no_grad():
        assert torch.equal(served(x), x * 2)
        token = dynamo_cases.Settings.scale.set(1)
        try:
            with pytest.raises(precompile.CallMismatch, match="no captured variant"):
                served(x)
        finally:
            dynamo_cases.Settings.scale.reset(token)
        assert torch.equal(served(x), x * 2)


SETTING_CAPTURE = r"""
import sys, torch, precompile, dynamo_cases as dc
with torch.compiler.config.patch(job_id=None):  # torch 2.15's patch leaves the value it found as an override
    pass
with torch.no_grad(), precompile.capture(dc.reads_a_compiler_setting, artifact_path=sys.argv[1] + ".py",
                                         cache_path=sys.argv[1] + ".cache", tracer=precompile.DynamoTracer(), backend="eager") as cap:
    cap(torch.ones(3))
"""

SETTING_SERVE = r"""
import json, sys, torch, precompile
served = precompile.load(sys.argv[1] + ".py", sys.argv[1] + ".cache")
report = {}
with torch.no_grad():
    report["served"] = served(torch.ones(3)).tolist()
    torch.compiler.config.job_id = "another"
    try:
        served(torch.ones(3))
    except precompile.CallMismatch as exc:
        report["changed"] = "missed, this call's " + str(exc).partition("this call's ")[2].partition(")")[0]
print(json.dumps(report))
"""


def test_a_compiler_setting_read_while_traced_serves_in_a_process_that_never_patched_it(tmp_path):
    """Captured where a `config.patch` left the setting's value behind as an override (Inductor's first
    compile does so on torch 2.15), served where nothing did: the same setting, so it serves; a changed
    setting misses, naming the setting's value in this call (not its override's raw slot). Checked as
    torch 2.15's Dynamo writes it (the override's raw value), every call missed."""
    proc = run_fresh(SETTING_CAPTURE, str(tmp_path / "setting"))
    assert proc.returncode == 0, proc.stderr
    assert fresh_json(SETTING_SERVE, str(tmp_path / "setting")) == {
        "served": [2.0, 2.0, 2.0], "changed": "missed, this call's G['torch'].compiler.config.job_id is 'another'"}


@pytest.mark.parametrize("seed", ["1", "2"])
def test_a_pinned_set_is_written_alike_under_any_hash_seed(seed):
    """An installed variant's by-name line pinning a set setting (`G['settings'].TAGS == {...}`) states
    its members sorted: the order a set of str iterates in follows the process's hash seed, and two
    captures of the same release must write the same line."""
    script = ("from precompile.capturing.dynamo.guard_pickling import _operand\n"
              "print(_operand({'gamma', 'alpha', 'beta', 'delta'}), _operand(frozenset({'gamma', 'alpha', 'beta'})))")
    proc = run_fresh(script, env={"PYTHONHASHSEED": seed})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "{'alpha', 'beta', 'delta', 'gamma'} frozenset({'alpha', 'beta', 'gamma'})"
