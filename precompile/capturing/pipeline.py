"""The one road from a capture to the pair, shared by both tracers. Each tracer does the first three
stages its own way; this module does the rest for both:

    trace    makefx/trace.py traces the one call; dynamo/session.py records every call's frames
    lower    lowering.py lowers the ATen graph (MakeFx); the Dynamo backend lowers graph by graph
             (dynamo/subgraphs.py), both into a private kernel cache dir (kernels.KernelBuild)
    render   codegen/render.py writes python_code's text
    freeze   `finish`: the kernel files the serving process needs, into the cache's bundle
    seal     `finish`: the cache envelope, with python_code compiled and its metadata decoded
    write    artifact/writer.py, called by api.py (only the writer rank writes)
"""
from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from precompile._version import __version__
from precompile.artifact import bytecode
from precompile.artifact.codec import build_bundle, encode_cache
from precompile.artifact.envelope import Backend, CacheEnvelopeV1, KernelBundle, Producer, TracerTag
from precompile.artifact.pycode import code_hash, decode_source, parse_metadata, parse_source
from precompile.capturing import kernels
from precompile.capturing.progress import phase
from precompile.errors import CaptureRefused

log = logging.getLogger("precompile")


@dataclass(frozen=True)
class Pair:
    """The two files of an artifact, as bytes."""

    python_code: bytes
    cache: bytes


def finish(source: str, *, backend: Backend, tracer: TracerTag, kernel_build: kernels.KernelBuild | None,
           kernel_modules: Iterable[str] = ()) -> Pair:
    """The pair of rendered python_code `source`: freeze the kernels of `kernel_modules` (the
    Inductor output modules' texts, python_code itself for MakeFx) that `kernel_build` compiled,
    and seal the cache. `kernel_build` is None for the eager backend, which builds no kernels."""
    python_code = source.encode("utf-8")
    bundle: KernelBundle | None = None
    payload = b""
    if kernel_build is not None:
        with phase("freeze the kernels into the cache"):
            bundle, payload = freeze(kernel_build, kernel_modules)
    with phase("seal the cache"):
        cache = seal(python_code, backend=backend, tracer=tracer, bundle=bundle, payload=payload)
    log.info(
        "rendered python_code (%d bytes) of tracer=%s, backend=%s%s",
        len(python_code), tracer, backend,
        f", {len(bundle.files)} bundled kernel files, {len(payload)} compressed bytes" if bundle else "",
    )
    return Pair(python_code, cache)


def freeze(kernel_build: kernels.KernelBuild, kernel_modules: Iterable[str]) -> tuple[KernelBundle, bytes]:
    """The bundle of every file the build left that serving needs, with its kernel map: each C++
    kernel of `kernel_modules`, by the sha256 of its source, to the library built from it."""
    files = kernels.collect_files(kernel_build.directory)
    found = kernels.kernels_by_source(kernel_modules)
    libraries = kernels.libraries_by_source({digest: text for digest, (_, text) in found.items()}, files)
    missing = sorted(name for digest, (name, _) in found.items() if digest not in libraries)
    if missing:
        raise CaptureRefused(
            f"could not freeze the compiled kernels {missing}: their libraries are not in the capture's kernel cache"
        )
    return build_bundle(
        files, kernels.producer_keys(files), libraries,
        kernels.producer_provenance(kernel_build.commands, kernel_build.directory, kernel_build.precompiled_headers),
    )


_IMPORTED = re.compile(r"would import (\S+) at")


def _unpicklable_remedy(problem: str) -> str:
    """Why Dynamo's state holds the import a refusal names (`problem`), and what the user can change."""
    found = _IMPORTED.search(problem)
    imported = found.group(1) if found else ""
    if imported.startswith(("torch.fx.", "torch._functorch.")):
        return ("A training graph AOTAutograd serves itself (an output that aliases an input or another output) keeps "
                "torch's fx GraphModule, which rebuilds itself from source when unpickled: return a copy of such an "
                "output (`.clone()`), or capture with MakeFxTracer")
    if imported.endswith("._unpickle_module"):
        return ("A guard reads a module whose class Dynamo's pickler cannot name (one defined inside a function), "
                "which it writes as a bare nn.Module: define the class at module level, give it a __reduce__ that "
                "rebuilds it by an importable name, or capture with MakeFxTracer")
    return (f"torch {torch.__version__} writes it into the state of a guard or a compiled graph of this call: "
            "capture with MakeFxTracer, whose artifacts keep no Dynamo state")


def seal(python_code: bytes, *, backend: Backend, tracer: TracerTag, bundle: KernelBundle | None, payload: bytes) -> bytes:
    """The cache file that pairs with `python_code`: its envelope, tagged and hashed, the bundle, and
    what load would otherwise do itself: python_code compiled, and its metadata literals decoded
    (from the rendered text, exactly as load and verify read them). A python_code whose opaque state
    load would refuse is refused here: nothing is written that cannot serve."""
    digest = code_hash(python_code)
    source = decode_source(python_code)
    tree = parse_source(source)
    compiled, metadata = bytecode.prepare(source, digest, parse_metadata(tree), tree)
    if compiled is not None and compiled.opaque is not None and compiled.opaque.problems:
        problem = compiled.opaque.problems[0].split("; do not load")[0]
        raise CaptureRefused(
            f"the Dynamo state this capture would write is one load refuses to unpickle: {problem}. {_unpicklable_remedy(problem)}"
        )
    envelope = CacheEnvelopeV1(
        code_hash=digest,
        backend=backend,
        tracer=tracer,
        producer=Producer(
            precompile=__version__, torch=str(torch.__version__), python=".".join(map(str, sys.version_info[:3]))
        ),
        bundle=bundle,
        python_bytecode=compiled,
        metadata_msgpack=metadata,
    )
    return encode_cache(envelope, payload)


def qualified_name(fn) -> str:
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
