"""PrecompileSummary: the spec's digest strings, pinned, and the properties of the type."""
from __future__ import annotations

import pickle

import msgspec
import pytest

from precompile.artifact.summary import PrecompileSummary

MINIMAL = PrecompileSummary(frames=1, resume_functions=0, guarded_codes=1, backend_graphs=1)

FULL = PrecompileSummary(
    frames=3,
    resume_functions=1,
    guarded_codes=4,
    backend_graphs=3,
    bypassed=("gen",),
    truncated=("loop (m.py:12)",),
    uncovered_frames=("helper",),
    wont_generalize=("n",),
    dropped_guards=(("HASATTR", "counts['pixel']"), ("ID_MATCH", "self.act")),
    kept_guards=(("TENSOR_MATCH", "x"), ("CONSTANT_MATCH", "n")),
    risky_dropped_guards=(("ID_MATCH", "self.act"),),
    policy_dropped_guards=(("TYPE_MATCH", "self"),),
    dropped_guard_code=(("ID_MATCH", "self.act", "___check_obj_id(L['self'].act, 1)"),),
    capture_errors=("RuntimeError: boom",),
)


def test_minimal_digest():
    assert str(MINIMAL) == "1 frame (0 from graph breaks), 1 guarded code, 1 backend graph"
    assert MINIMAL.complete


def test_fully_populated_digest():
    assert str(FULL) == (
        "3 frames (1 from graph breaks), 4 guarded codes, 3 backend graphs, dropped guards {'HASATTR': 1, "
        "'ID_MATCH': 1} (2 kept), RISKY drops ['ID_MATCH self.act'], 1 policy-dropped guard, 1 "
        "value-pinned source, 1 UNCOVERED: ['helper'], >=1 TRUNCATED: ['loop (m.py:12)'], 1 BYPASSED: "
        "['gen'], 1 CAPTURE ERROR: 'RuntimeError: boom'"
    )
    assert not FULL.complete


def test_long_lists_and_several_errors_are_cut():
    summary = PrecompileSummary(
        frames=8,
        resume_functions=0,
        guarded_codes=1,
        backend_graphs=1,
        uncovered_frames=tuple(f"f{i}" for i in range(7)),
        dropped_guards=(("HASATTR", "self.act"), ("ID_MATCH", "self.act")),
        risky_dropped_guards=(("HASATTR", "self.act"), ("ID_MATCH", "self.act")),
        capture_errors=("\nRuntimeError: boom\nHint: do not.", "ValueError: x", "KeyError: 'k'"),
    )
    assert str(summary) == (
        "8 frames (0 from graph breaks), 1 guarded code, 1 backend graph, dropped guards {'HASATTR': 1, "
        "'ID_MATCH': 1} (0 kept), RISKY drops ['HASATTR self.act', 'ID_MATCH self.act'], 7 UNCOVERED: "
        "['f0', 'f1', 'f2', 'f3', 'f4'] +2 more, 3 CAPTURE ERRORS: 'RuntimeError: boom' +2 more"
    )


@pytest.mark.parametrize(
    "changes",
    [{"bypassed": ("g",)}, {"truncated": ("g (m.py:1)",)}, {"uncovered_frames": ("g",)}, {"capture_errors": ("E: e",)},
     {"guarded_codes": 0}, {"backend_graphs": 0}],
)
def test_complete_is_coverage_only(changes):
    assert not msgspec.structs.replace(MINIMAL, **changes).complete


def test_guard_fields_never_enter_complete():
    assert msgspec.structs.replace(MINIMAL, risky_dropped_guards=(("ID_MATCH", "self.act"),), wont_generalize=("n",)).complete


def test_type_counts_keyword_only_frozen_hashable_picklable():
    assert FULL.dropped_guard_types == {"HASATTR": 1, "ID_MATCH": 1}
    assert FULL.kept_guard_types == {"TENSOR_MATCH": 1, "CONSTANT_MATCH": 1}
    with pytest.raises(TypeError):
        PrecompileSummary(1, 0, 1, 1)  # keyword-only
    with pytest.raises(AttributeError):
        FULL.frames = 2  # frozen
    assert hash(FULL) == hash(pickle.loads(pickle.dumps(FULL)))
    assert pickle.loads(pickle.dumps(FULL)) == FULL


def test_a_dropped_guards_code_names_no_object_of_the_capturing_process():
    """Dynamo's code for an ID_MATCH or BUILTIN_MATCH it would run names the object by its id and, in
    the type's repr, its address: both differ in every process, so the summary masks them."""
    from precompile.artifact.summary import without_object_ids

    check = "___check_obj_id(G['torch'].relu, 140234567890123), type=<built-in method relu of type object at 0x7ff3916e9fa0>"
    assert without_object_ids(check) == "___check_obj_id(G['torch'].relu, <id>), type=<built-in method relu of type object at <id>>"
    assert without_object_ids("L['x'] == 12345678") == "L['x'] == 12345678"  # a constant is left as it is
