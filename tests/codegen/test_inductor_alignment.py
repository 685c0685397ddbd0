"""Inputs Inductor's GPU kernels take aligned: python_code realigns them as Inductor's own wrapper does.

Inductor compiles a GPU input that was 16-byte aligned at capture for an aligned pointer (Triton
specializes on it), and wraps the output module so that a misaligned one is passed as an aligned copy
(and copied back when the module writes into it). python_code runs the output module without that
wrapper, so it does the same itself, for the inputs the capture recorded. CPU kernels take any
pointer: a CPU capture records none, and these tests force Inductor's list to run the path on a CPU.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import precompile
from precompile.capturing.lowering import realignment
from precompile.codegen.drivers import source_of
from precompile.codegen.models import Realignment


def _misaligned(values: torch.Tensor) -> torch.Tensor:
    """`values` in a view whose data pointer is 4 bytes past a 16-byte boundary."""
    storage = torch.empty(values.numel() + 4, dtype=torch.float32)
    view = storage[1 : 1 + values.numel()].view(values.shape)
    assert view.data_ptr() % 16 == 4
    return view.copy_(values)


@pytest.fixture
def runtime() -> dict:
    namespace: dict = {}
    exec(compile(source_of("inductor_runtime"), "<inductor_runtime>", "exec"), namespace)
    return namespace


def test_a_misaligned_input_reaches_the_kernels_aligned_and_a_write_into_it_reaches_the_caller(runtime):
    read, written, aligned = _misaligned(torch.arange(8.0)), _misaligned(torch.zeros(8)), torch.ones(8)
    seen = []

    def call(args):
        seen.extend((arg, arg.data_ptr() % 16) for arg in args)
        args[1].add_(args[0])  # the module writes into its second input
        out = args[0] * 2
        args.clear()
        return (out,)

    (out,) = runtime["run_inductor_call"](call, (read, written, aligned), realign=(0, 1, 2), write_back=(1,))
    assert [offset for _, offset in seen] == [0, 0, 0]
    assert seen[2][0] is aligned  # an aligned input is passed as it is
    assert torch.equal(written, torch.arange(8.0))  # the write reached the caller's tensor
    assert torch.equal(read, torch.arange(8.0)) and torch.equal(out, torch.arange(8.0) * 2)


def test_without_a_realignment_the_module_gets_the_callers_tensors(runtime):
    read = _misaligned(torch.arange(8.0))
    seen = []
    runtime["run_inductor_call"](lambda args: seen.extend(args) or (), (read,))
    assert seen[0] is read


def test_an_expanded_misaligned_input_is_copied_with_its_strides(runtime):
    row = _misaligned(torch.arange(4.0))
    expanded = row.expand(3, 4)
    seen = []
    runtime["run_inductor_call"](lambda args: seen.extend(args) or (), (expanded,), realign=(0,))
    assert seen[0].data_ptr() % 16 == 0 and seen[0].stride() == (0, 1)
    assert torch.equal(seen[0], expanded)


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        # torch 2.11: the wrapper checks every input Inductor assumed aligned
        (SimpleNamespace(inputs_to_check=[0, 2], mutated_input_idxs={2}), Realignment(inputs=(0, 2), write_back=(2,), written=(2,))),
        # torch 2.12+: the output code copies an input it only reads; the wrapper keeps the written ones
        (SimpleNamespace(inputs_to_check=[0, 2], mutated_input_idxs={2}, _defers_input_alignment=True),
         Realignment(inputs=(2,), write_back=(2,), written=(2,))),
        (SimpleNamespace(inputs_to_check=[0, 2], mutated_input_idxs=set(), _defers_input_alignment=False),
         Realignment(inputs=(0, 2))),
        (SimpleNamespace(inputs_to_check=(), mutated_input_idxs={1}), Realignment(written=(1,))),  # a CPU graph
    ],
)
def test_the_capture_records_the_checks_inductors_wrapper_would_make(result, expected):
    assert realignment(result) == expected


def update_cache(cache, x):
    cache.add_(x)
    return cache * 2, x + 1


@pytest.mark.parametrize("tracer", ["makefx", "dynamo"])
def test_a_served_call_realigns_and_writes_back_what_inductor_checks(tmp_path, monkeypatch, tracer):
    from torch._inductor import compile_fx

    # As on a GPU: Inductor lists every tensor input as one its kernels take aligned.
    monkeypatch.setattr(compile_fx, "get_input_idxs_to_check",
                        lambda inputs, static: [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)])
    artifact, cache_file = tmp_path / "a.py", tmp_path / "a.cache"
    chosen = precompile.MakeFxTracer() if tracer == "makefx" else precompile.DynamoTracer()
    with torch.no_grad(), precompile.capture(update_cache, artifact_path=artifact, cache_path=cache_file,
                                             tracer=chosen, backend="inductor") as cap:
        cap(torch.zeros(8), torch.ones(8))
    text = artifact.read_text()
    assert "realign=(" in text and "write_back=(" in text
    runnable = precompile.load(artifact_path=artifact, cache_path=cache_file)
    cache, x = _misaligned(torch.arange(8.0)), _misaligned(torch.full((8,), 3.0))
    with torch.no_grad():
        doubled, plus_one = runnable(cache, x)
    assert torch.equal(cache, torch.arange(8.0) + 3)  # the write reached the caller's misaligned tensor
    assert torch.equal(doubled, (torch.arange(8.0) + 3) * 2) and torch.equal(plus_one, torch.full((8,), 4.0))


_WHOLE = torch.zeros(8)


@pytest.mark.parametrize(
    ("flat", "written", "expected"),
    [
        ((_WHOLE, _WHOLE), (0,), (0, 1)),
        ((_WHOLE[:4], _WHOLE[4:]), (0,), None),  # halves of one tensor share no byte
        ((_WHOLE[4:], _WHOLE[:4]), (0,), None),
        ((_WHOLE, _WHOLE[2:3]), (1,), (1, 0)),
        ((_WHOLE.view(2, 4).t(), _WHOLE[7:]), (0,), (0, 1)),  # a non-contiguous view spans to its last element
        ((_WHOLE[3:3], _WHOLE), (0,), None),  # an empty view spans nothing
        ((_WHOLE, _WHOLE.clone()), (0,), None),
        ((_WHOLE, _WHOLE), (), None),  # nothing written: aliased reads are the module's to make
        ((_WHOLE[::2], _WHOLE[1::2]), (0,), None),  # interleaved in one span, sharing no element
        ((_WHOLE.view(4, 2)[:, 0], _WHOLE.view(4, 2)[:, 1]), (1,), None),  # two columns of one matrix
        ((_WHOLE[:6:2], _WHOLE[2::2]), (0,), (0, 1)),  # interleaved, sharing elements 2 and 4
    ],
)
def test_a_written_input_sharing_memory_with_another_is_found(runtime, flat, written, expected):
    assert runtime["_overlap_with_written"](flat, written) == expected
