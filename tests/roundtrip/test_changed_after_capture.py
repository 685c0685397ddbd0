"""Settings held in config containers (an attribute-style dict, a namedtuple, a slotted dataclass, a
numpy array or scalar, a set changed in place, a settings object or a plain class held in a module
global, a ContextVar), in functions (a module-level helper's default, a closure, its cell, a lambda, a closure
in a tuple, a partial's keywords, a callable object's attribute, class or __call__), on the model's class (a class attribute, an enum one, an enum member's value edited, a property replaced, the class itself, a layer's __call__ or an inherited forward
patched) or
missing at capture, and in torch itself (a torch.compiler setting, a private torch._dynamo one, a global module hook registered, a patched torch function, a patched layer's forward),
changed after capture: each captured in this process,
then served by a fresh process that makes the same change to eager and the artifact, before the
first call and (MakeFx, whose later calls trust what the first checked) after a validated one, and
unchanged, which must serve; a Dynamo artifact has a process of its own, as two cannot load into one. Every call serves eager's result or is refused, naming what
changed: never the captured result instead of eager's."""
from __future__ import annotations

import changed_state_cases as cases
import pytest
import torch
from conftest import fresh_json

import precompile

SERVE = r"""
import json, sys, torch, precompile, changed_state_cases as cases
outcomes = {}
items, whens = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for item in items:
    kind, tracer, artifact, cache = item
    change = cases.KINDS[kind][0]
    served = precompile.load(artifact, cache)  # once: a Dynamo artifact loads once a process
    for when in whens:
        model, x = cases.build(kind)  # a model of its own: the first call on it is checked in full
        with torch.no_grad(), precompile.no_compilation():
            if when == "after a validated call":
                assert torch.allclose(served(model, x), cases.step(model, x))
            undo = change(model) if when != "unchanged" else None
            try:
                eager = cases.step(model, x)
                try:
                    out = served(model, x)
                except precompile.CallMismatch as refusal:
                    outcome = "refused: " + str(refusal)
                else:
                    outcome = "same" if torch.allclose(out, eager) else "SILENTLY DIFFERENT"
            finally:
                if undo is not None:
                    undo()
        outcomes[f"{tracer} {kind} ({when})"] = outcome
print(json.dumps(outcomes))
"""


@pytest.fixture(scope="module")
def captured_kinds(tmp_path_factory):
    directory = tmp_path_factory.mktemp("changed")
    pairs = []
    for kind, (_, tracers) in cases.KINDS.items():
        for tracer in tracers:
            model, x = cases.build(kind)
            paths = (directory / f"{tracer}-{kind}.py", directory / f"{tracer}-{kind}.cache")
            make = precompile.MakeFxTracer if tracer == "makefx" else precompile.DynamoTracer
            with torch.no_grad(), precompile.capture(cases.step, artifact_path=paths[0], cache_path=paths[1],
                                                     tracer=make(), backend="eager") as cap:
                cap(model, x)
            pairs.append([kind, tracer, str(paths[0]), str(paths[1])])
    return pairs


def test_a_setting_changed_after_capture_is_served_as_eager_or_refused(captured_kinds):
    import json

    makefx = [item for item in captured_kinds if item[1] == "makefx"]
    outcomes = fresh_json(SERVE, json.dumps(makefx), json.dumps(["unchanged", "first call", "after a validated call"]))
    for item in captured_kinds:
        if item[1] == "dynamo":
            outcomes.update(fresh_json(SERVE, json.dumps([item]), json.dumps(["unchanged", "first call"])))
    assert len(outcomes) == 3 * len(makefx) + 2 * (len(captured_kinds) - len(makefx))
    unchanged = {case: outcome for case, outcome in outcomes.items() if case.endswith("(unchanged)")}
    assert set(unchanged.values()) == {"same"}, unchanged  # no false refusal
    silent = {case: outcome for case, outcome in outcomes.items()
              if not case.endswith("(unchanged)") and not outcome.startswith("refused")}
    assert not silent, silent
    # Each refusal names what changed, with both values
    named = {
        "attrdict": "args[0].cfg is changed_state_cases.AttrDict({'scale': 3.0})",
        "namedtuple": "args[0].cfg is changed_state_cases.Config(scale=3.0, shift=0.5)",
        "slots": "args[0].cfg.scale is 3.0 but the artifact was captured with 2.0",
        "array": "values=[3.0, 0.5]",
        "closure": "closing over k=2.0",
        "closure_cell": "closing over k=2.0",
        "defaults": "closing over default 2.0",
        "slotted": "args[0].slotted._values is {'scale': 3.0}",
        "instance_forward": "args[0].norm forward changed_state_cases._instance_forward.<locals>.<lambda>",
        "class_forward": "global changed_state_cases.Model.forward is function changed_state_cases._patch_class_forward",
        "gelu": "global torch.nn.functional.gelu is function changed_state_cases._patch_gelu.<locals>.<lambda>",
        "layernorm": "global torch.nn.modules.normalization.LayerNorm.forward is function",
        "partial": "partial(function changed_state_cases.scaled, k=2.0)",
        "tuple_closure": "args[0].acts is (function changed_state_cases.make_act.<locals>.act (code ",
        "set": "args[0].flags is set({'a', 'b'})",
        "class_value": "args[0].SCALE is 2.0 but the artifact was captured with 0.5",
        "instance_value": "args[0].SCALE is 2.0 but the artifact was captured with 0.5",
        "missing": "args[0].extra is 3.0 but the artifact was captured with missing",
        "class_swap": "args[0].__class__ is class changed_state_cases.Doubled",
        "missing_setting": "args[0].cfg.extra is 3.0 but the artifact was captured with missing",
        "config_getattr": "args[0].cfg.extra is 3.0 but the artifact was captured with missing",
        "hf_missing_setting": "args[0].cfg.extra is 3.0 but the artifact was captured with missing",
        "hf_renamed": "args[0].cfg.extra is 2 but the artifact was captured with missing",
        "callable": "args[0].act.k is 2.0 but the artifact was captured with 0.5",
        "callable_class": "args[0].act.__class__ is class changed_state_cases.Shifter",
        "callable_call": "global changed_state_cases.Scaler.__call__ is function changed_state_cases._patch_callable_call",
        "linear_call": "global torch.nn.modules.linear.Linear.__call__ is function changed_state_cases._patch_linear_call",
        "subclass_forward": "global changed_state_cases.PlainLinear.forward is function changed_state_cases._patch_subclass_forward",
        "module_settings": "global changed_state_cases.SETTINGS.scale is 3.0 but the artifact was captured with 2.0",
        "global_class_value": "global changed_state_cases.Tuning.FACTOR is 3.0 but the artifact was captured with 2.0",
        "global_default": "global changed_state_cases.scaled_by_default is function changed_state_cases.scaled_by_default closing over default 3.0",
        "compiler_setting": "global torch.compiler.config.job_id is 'another job' but the artifact was captured with None",
        "private_compiler_setting": "global torch._dynamo.config.verbose is True but the artifact was captured with False",
        "context_var": "global changed_state_cases.SCALE_VAR is contextvar scale holding 3.0 but the artifact was captured with "
                       "contextvar scale holding 2.0",
        "nested_settings": "global changed_state_cases.SETTINGS.sub.scale is 3.0 but the artifact was captured with 2.0",
        "class_enum": "args[0].MODE is changed_state_cases.Mode.DOUBLED = 2 but the artifact was captured with changed_state_cases.Mode.PLAIN = 1",
        "enum_value": "args[0].MODE is changed_state_cases.Mode.PLAIN = 3 but the artifact was captured with changed_state_cases.Mode.PLAIN = 1",
        "deep_settings": "global changed_state_cases.DEEP_SETTINGS.sub.sub.sub.sub.scale is 3.0 but the artifact was captured with 2.0",
        "global_hook": "the model's hooks are global forward hook changed_state_cases._double_linear_output",
        "property": "global changed_state_cases.Model.gain.fget is function changed_state_cases._replace_property.<locals>.<lambda>",
    }
    for kind, text in named.items():
        for when in ("first call", "after a validated call"):
            assert text in outcomes[f"makefx {kind} ({when})"], outcomes[f"makefx {kind} ({when})"]


def test_the_guards_verb_shows_what_checks_a_class_attributes_identity(captured_kinds):
    """Dynamo names the slot of a class attribute's identity `dict(type(model).__dict__)['MODE']`; the
    by-name check that stands in for it walks `type(model).__dict__['MODE']`. `precompile guards` pairs
    the two, so the slot shows the enum member it must be rather than nothing."""
    from precompile import inspect

    artifact = next(item for item in captured_kinds if item[:2] == ["class_enum", "dynamo"])
    report = inspect.guards_report(inspect.open_path(artifact[2], artifact[3]))
    slots = [slot for frame in report.guards.frames for slot in frame.slots
             if slot.guard_type == "ID_MATCH" and slot.source == "dict(type(model).__dict__)['MODE']"]
    assert slots and all(slot.status == "kept" for slot in slots), report.guards
    assert all(slot.check.endswith("__dict__['MODE'] is _by_name['changed_state_cases:Mode.PLAIN']")
               for slot in slots), [slot.check for slot in slots]


def test_the_guards_verb_shows_what_checks_a_lambdas_code_and_a_modules_forward(captured_kinds):
    """The checks precompile adds for a lambda on the model (its code's bytecode, constants, names) and
    for the forward each module's class runs are labelled with the parts they compare
    (`model.act.__code__.co_code == ...`): `precompile guards` shows them beside their slots."""
    from precompile import inspect

    artifact = next(item for item in captured_kinds if item[:2] == ["lambda", "dynamo"])
    report = inspect.guards_report(inspect.open_path(artifact[2], artifact[3]))
    checks = {(slot.guard_type, slot.source): slot.check for frame in report.guards.frames for slot in frame.slots
              if slot.status == "kept"}
    assert "act.__code__.co_code ==" in checks["CLOSURE_MATCH", "model.act"], checks
    assert "__qualname__ ==" in checks["FORWARD_MATCH", "model"], checks
