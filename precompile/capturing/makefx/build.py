"""A MakeFxTracer capture's own stages: trace the call, lower it with the backend, render python_code
and load it; pipeline.py finishes the pair."""
from __future__ import annotations

import contextlib
import copy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from precompile.artifact.envelope import FORMAT_VERSION, Backend
from precompile.artifact.metadata import MakeFxMetadata
from precompile.capturing import kernels, lowering, pipeline
from precompile.capturing.inlined_files import inlined_files
from precompile.capturing.makefx import trace as makefx
from precompile.capturing.progress import libraries_in, phase
from precompile.codegen.models import GraphSection, MakeFxArtifact
from precompile.codegen.render import render_makefx
from precompile.serve import ranks as distributed
from precompile.serve.load import execute


@dataclass(frozen=True)
class BuiltPair:
    pair: pipeline.Pair
    forward: Callable[..., Any]
    """The served forward of the rendered python_code, already loaded in this process."""


def build_makefx(fn, args: tuple, kwargs: dict[str, Any], *, backend: Backend, decompositions,
                 artifact_path: Path) -> BuiltPair:
    """Trace fn(*args, **kwargs), lower and render it (for Inductor, lowering builds the kernels into the
    capture's kernel dir), load the rendered python_code on those kernels as load will, and finish
    the pair (pipeline.py)."""
    with contextlib.ExitStack() as stack:
        with phase("trace with make_fx"):
            traced = makefx.trace(fn, args, decompositions, kwargs=kwargs, layout=backend == "inductor")
        kernel_build = None
        if backend == "inductor":  # the kernel dir is held from lowering to freezing, not while fn is traced
            kernel_build = stack.enter_context(kernels.private_inductor_cache())
            stack.enter_context(kernel_build.held())
        if kernel_build is None:
            with phase("render the ATen graph"):
                lowering.views_as_reshapes(traced.graph_module, keep_mutated=True)
                graph = lowering.lower_eager(traced.graph_module)
                source = _render(fn, traced, backend, graph, _autograd_graph(traced, graph))
            loading = "load the rendered python_code"
        else:
            with phase("lower with Inductor", libraries_in(kernel_build.directory)):
                autograd_graph = _autograd_graph(traced, None)
                graph = lowering.lower_inductor(traced.graph_module, traced.example_inputs, traced.fake_mode)
                source = _render(fn, traced, backend, graph, autograd_graph)
            loading = "load the rendered python_code on its kernels"
        with phase(loading):
            primed = kernels.built_so_far(kernel_build.directory, [source], {}) if kernel_build is not None else None
            namespace = execute(source, str(artifact_path.resolve()), primed)
            # The capture's own call says nothing of eager speed, and where no graph records autograd as eager
            # does it returns the values, warning that they carry none (a served call is refused).
            namespace["forward"].warned_autograd = namespace["forward"].capturing = True
        pair = pipeline.finish(source, backend=backend, tracer="make_fx", kernel_build=kernel_build, kernel_modules=[source])
    return BuiltPair(pair=pair, forward=namespace["forward"])


def _autograd_graph(traced: makefx.MakeFxTrace, eager: GraphSection | None) -> GraphSection | None:
    """What runs a forward's calls that autograd records (grad mode on, a tensor requiring grad):
    the `eager` backend's graph itself, whose ATen ops autograd records; beside a compiled graph,
    which computes no gradients, the ATen graph, rendered from a copy before Inductor's passes
    change it. None for a training step (its graph computes the gradients itself), where fn's code
    shapes autograd in a way the graph does not keep (`no_autograd` says how), and for dims marked
    unbacked (no ATen graph serves them)."""
    if traced.grad_param_indices or no_autograd(traced) is not None:
        return None
    if eager is not None:
        return GraphSection(title="The calls autograd records run the graph above: its ATen ops record autograd",
                            source=f"{AUTOGRAD_ENTRY} = {eager.entry}", entry=AUTOGRAD_ENTRY)
    aten = copy.deepcopy(traced.graph_module)
    lowering.views_as_reshapes(aten, keep_mutated=True)
    section = lowering.lower_eager(aten, entry=AUTOGRAD_ENTRY)
    return GraphSection(title="The captured graph as ATen ops, for the calls autograd records (grad mode on and a "
                              "tensor requiring grad): the compiled graph computes no gradients",
                        source=section.source, entry=AUTOGRAD_ENTRY)


def no_autograd(traced: makefx.MakeFxTrace) -> tuple[str, bool] | None:
    """Why a forward's calls that autograd records cannot be served as eager's (what the driver's
    refusal says), and whether that holds in any grad mode (fn turns grad on); None where they can."""
    if traced.grad_param_indices:
        return None
    if traced.autograd.unfaithful is not None:
        return traced.autograd.unfaithful, traced.autograd.in_any_mode
    if traced.fake_mode is not None:
        return "the capture marked dims with mark_unbacked, which leave no ATen graph to record it", False
    return None


AUTOGRAD_ENTRY = "captured_graph_autograd"


def _render(fn, traced: makefx.MakeFxTrace, backend: Backend, graph, autograd_graph: GraphSection | None = None) -> str:
    metadata = MakeFxMetadata(
        format_version=FORMAT_VERSION,
        backend=backend,
        torch_version=str(torch.__version__),
        python_version=(sys.version_info.major, sys.version_info.minor),
        fn_name=pipeline.qualified_name(fn),
        num_positional_args=traced.num_positional_args,
        module_positions=traced.module_positions,
        module_keywords=traced.module_keywords,
        params=traced.params,
        buffers=traced.buffers,
        in_spec=traced.in_spec,
        inputs=traced.inputs,
        out_spec=traced.out_spec,
        outputs=traced.outputs,
        grad_param_indices=traced.grad_param_indices,
        specialized=traced.specialized,
        inlined_sources=traced.inlined_sources,
        inlined_files=inlined_files(traced.inlined_sources),
        world=distributed.captured_world([graph.source]),
    )
    return render_makefx(MakeFxArtifact(metadata=metadata, graph=graph, autograd_graph=autograd_graph,
                                        no_autograd=no_autograd(traced)))
