"""Turn a captured call into the artifact pair: trace, lower with the backend, render python_code,
exec it, and freeze the kernels it needs into the cache's bundle."""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from precompile.artifact.codec import build_bundle
from precompile.artifact.envelope import FORMAT_VERSION
from precompile.artifact.metadata import MakeFxMetadata
from precompile.capturing import kernels, lowering
from precompile.capturing.makefx import trace as makefx
from precompile.capturing.pipeline import cache_for, qualified_name
from precompile.capturing.progress import phase
from precompile.codegen.models import MakeFxArtifact
from precompile.codegen.render import render_makefx
from precompile.errors import CaptureRefused
from precompile.serve import ranks as distributed
from precompile.serve.load import execute

log = logging.getLogger("precompile")


@dataclass(frozen=True)
class BuiltPair:
    python_code: bytes
    cache: bytes
    forward: Callable[..., Any]
    """The served forward of the rendered python_code, already loaded in this process."""


def build_makefx(fn, args: tuple, *, backend: str, decompositions, artifact_path: Path) -> BuiltPair:
    if backend == "eager":
        with phase("trace with make_fx"):
            traced = makefx.trace(fn, args, decompositions)
        started = time.perf_counter()
        with phase("render the ATen graph"):
            source = _render(fn, traced, backend, lowering.lower_eager(traced.graph_module))
        with phase("load the rendered python_code"):
            namespace = execute(source, str(artifact_path.resolve()))
        bundle, payload = None, b""
    else:
        with kernels.private_inductor_cache() as (cache_dir, commands):
            with phase("trace with make_fx"):
                traced = makefx.trace(fn, args, decompositions, layout=True)
            started = time.perf_counter()
            with phase("lower with Inductor"):
                graph = lowering.lower_inductor(traced.graph_module, traced.example_inputs, traced.fake_mode)
                source = _render(fn, traced, backend, graph)
            with phase("build the kernels (load the rendered python_code)"):
                namespace = execute(source, str(artifact_path.resolve()))
            with phase("freeze the kernels into the cache"):
                bundle, payload = _freeze_kernels(source, namespace, cache_dir, commands)
    log.info(
        "lowered with backend=%r and rendered python_code (%d bytes%s) in %.2f s",
        backend,
        len(source),
        f", {len(bundle.files)} bundled kernel files, {len(payload)} compressed bytes" if bundle else "",
        time.perf_counter() - started,
    )
    python_code = source.encode("utf-8")
    cache = cache_for(python_code, backend=backend, tracer="make_fx", bundle=bundle, payload=payload)
    return BuiltPair(python_code=python_code, cache=cache, forward=namespace["forward"])


def _render(fn, traced: makefx.MakeFxTrace, backend: str, graph) -> str:
    metadata = MakeFxMetadata(
        format_version=FORMAT_VERSION,
        backend=backend,
        torch_version=str(torch.__version__),
        python_version=tuple(sys.version_info[:2]),
        fn_name=qualified_name(fn),
        num_positional_args=traced.num_positional_args,
        module_positions=traced.module_positions,
        params=traced.params,
        buffers=traced.buffers,
        in_spec=traced.in_spec,
        inputs=traced.inputs,
        out_spec=traced.out_spec,
        outputs=traced.outputs,
        grad_param_indices=traced.grad_param_indices,
        world=distributed.captured_world([graph.source]),
    )
    return render_makefx(MakeFxArtifact(metadata=metadata, graph=graph))


def _freeze_kernels(source: str, namespace: dict, cache_dir: Path, commands: list[str]):
    sources = kernels.kernel_sources(source)
    libraries = kernels.kernel_libraries(namespace, cache_dir)
    missing = sorted(set(sources) - set(libraries))
    if missing:
        raise CaptureRefused(
            f"could not freeze the compiled kernels {missing}: their libraries are not in the capture's kernel cache"
        )
    files = kernels.collect_files(cache_dir)
    return build_bundle(
        files, kernels.producer_keys(files), {sources[name]: libraries[name] for name in sources},
        kernels.producer_provenance(commands, cache_dir),
    )
