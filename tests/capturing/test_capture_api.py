"""capture() and Capture: argument validation and the block's state machine."""
from __future__ import annotations

import pytest
import torch

import precompile
from precompile import PrecompileError

MAKEFX = precompile.MakeFxTracer()


def double(x):
    return x * 2


def boom(x):
    raise ValueError("boom")


def make(tmp_path, fn=double, **kwargs):
    options = dict(artifact_path=tmp_path / "m.py", cache_path=tmp_path / "m.cache", tracer=MAKEFX, backend="eager")
    return precompile.capture(fn, **{**options, **kwargs})


def written(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "tvm"}, r"backend must be one of 'inductor', 'eager', got 'tvm'"),
        ({"tracer": "make_fx"}, r"tracer must be a MakeFxTracer or DynamoTracer instance, got 'make_fx'"),
        ({"cache_path": None}, r"needs both artifact_path and cache_path; cache_path is empty"),
        ({"artifact_path": ""}, r"needs both artifact_path and cache_path; artifact_path is empty"),
        ({"cache_path": 3}, r"cache_path must be a path, got int"),
    ],
)
def test_arguments_are_validated_up_front(tmp_path, kwargs, message):
    with pytest.raises(PrecompileError, match=message):
        make(tmp_path, **kwargs)


def test_identical_paths_and_directories_are_refused(tmp_path):
    with pytest.raises(PrecompileError, match="are the same file"):
        make(tmp_path, artifact_path=tmp_path / "m", cache_path=tmp_path / "." / "m")
    with pytest.raises(PrecompileError, match="cache_path .* is a directory"):
        make(tmp_path, cache_path=tmp_path)


def test_the_default_tracer_is_dynamo(tmp_path):
    cap = precompile.capture(double, artifact_path=tmp_path / "m.py", cache_path=tmp_path / "m.cache")
    assert isinstance(cap.tracer, precompile.DynamoTracer) and cap.backend == "inductor"
    with pytest.raises(PrecompileError, match=r"cannot capture a lambda.*MakeFxTracer takes lambdas"):
        precompile.capture(lambda x: x, artifact_path=tmp_path / "m.py", cache_path=tmp_path / "m.cache")


def test_call_runs_for_real_and_returns_the_result(tmp_path):
    x = torch.arange(3.0)
    with make(tmp_path) as cap:
        assert torch.equal(cap(x), x * 2)
    assert written(tmp_path) == ["m.cache", "m.py"]


def test_one_call_only(tmp_path):
    x = torch.ones(2)
    with make(tmp_path) as cap:
        cap(x=x)  # keywords are captured by name (tests/roundtrip/test_layouts_and_keywords.py)
        with pytest.raises(PrecompileError, match="captures a single call and one has already been traced"):
            cap(x)


def test_calls_and_save_outside_the_block_are_refused(tmp_path):
    cap = make(tmp_path)
    with pytest.raises(PrecompileError, match="not active: call it inside its `with` block"):
        cap(torch.ones(1))
    with pytest.raises(PrecompileError, match="save\\(\\) is only valid inside"):
        cap.save()
    with cap:
        cap(torch.ones(1))
    with pytest.raises(PrecompileError, match="spent"):
        cap.save()
    with pytest.raises(PrecompileError, match="spent: its `with` block already ran. Call capture\\(\\) again"):
        with cap:
            pass


def test_save_checkpoints_inside_the_block(tmp_path):
    with make(tmp_path) as cap:
        with pytest.raises(PrecompileError, match="nothing to save yet"):
            cap.save()
        cap(torch.ones(2))
        cap.save()
        assert written(tmp_path) == ["m.cache", "m.py"]
        f = precompile.load(tmp_path / "m.py", tmp_path / "m.cache")
        assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))


def test_a_block_that_raises_writes_nothing_it_had_not_saved(tmp_path):
    with pytest.raises(KeyError):
        with make(tmp_path) as cap:
            cap(torch.ones(2))
            raise KeyError("user error")
    assert written(tmp_path) == []


def test_a_block_with_no_call_raises(tmp_path):
    with pytest.raises(PrecompileError, match="nothing was captured: call the capture with your example arguments"):
        with make(tmp_path):
            pass
    assert written(tmp_path) == []


def test_a_failed_call_is_final_and_writes_nothing(tmp_path):
    with pytest.raises(PrecompileError, match="nothing was captured: the capture call raised ValueError"):
        with make(tmp_path, fn=boom) as cap:
            with pytest.raises(ValueError, match="boom"):
                cap(torch.ones(2))
            with pytest.raises(PrecompileError, match="already raised ValueError; run a fresh capture"):
                cap(torch.ones(2))
    assert written(tmp_path) == []


def test_a_failed_write_raises_and_leaves_the_previous_pair(tmp_path, monkeypatch):
    with make(tmp_path) as cap:
        cap(torch.ones(2))
    before = {name: (tmp_path / name).read_bytes() for name in written(tmp_path)}
    import precompile.artifact.writer as writer

    real_replace = writer.os.replace
    calls = []

    def flaky_replace(src, dst):
        calls.append(dst)
        if str(dst).endswith("m.cache"):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(writer.os, "replace", flaky_replace)
    with pytest.raises(PrecompileError, match=r"could not write the artifact pair .*No space left on device.*previous pair"):
        with make(tmp_path) as cap:
            cap(torch.ones(3))  # a different shape: a different python_code
    monkeypatch.undo()
    assert {name: (tmp_path / name).read_bytes() for name in written(tmp_path)} == before
    assert torch.equal(precompile.load(tmp_path / "m.py", tmp_path / "m.cache")(torch.ones(2)), torch.full((2,), 2.0))


def relu(x):
    return torch.relu(x)


def test_makefx_decompositions_are_the_trace_decomposition_table(tmp_path):
    """MakeFxTracer(decompositions=) is make_fx's decomposition_table, as upstream's: the op decomposed is not in the graph."""
    aten = torch.ops.aten
    tracer = precompile.MakeFxTracer(decompositions={aten.relu.default: lambda x: aten.clamp_min.default(x, 0)})
    with make(tmp_path, fn=relu, tracer=tracer) as cap:
        cap(torch.tensor([-1.0, 2.0]))
    code = (tmp_path / "m.py").read_text()
    assert "aten.clamp_min.default" in code and "aten.relu.default" not in code
    assert precompile.load(tmp_path / "m.py", tmp_path / "m.cache")(torch.tensor([-3.0, 4.0])).tolist() == [0.0, 4.0]
