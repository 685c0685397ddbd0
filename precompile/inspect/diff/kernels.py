"""The kernels of an artifact's bundle by their Inductor names, and how two artifacts' kernels differ.

A bundle names its files by hash (`qs/cqs5….main.cpp`), which changes with every edit and says
nothing to a reader. Inductor names each kernel (`cpp_fused_relu_0`, `triton_poi_fused_relu_0`): a
C++ kernel's name is the one its output module binds the source to (`cpp_fused_relu_0 =
async_compile.cpp_pybinding([...], r'''<source>''')`; the bundle file is that source and its Python
binding), found by reading python_code's text (a Dynamo artifact's output modules with `ast`); a
Triton kernel's files are named by the kernel itself. Read statically: nothing is executed or imported.
A source without a name is shown by its path.

`kernel_diffs` pairs two artifacts' kernels by name, then a kernel Inductor renamed (same family,
same counter: `cpp_fused_relu_0` → `cpp_fused_sigmoid_0`, one of each) as one change, and gives a
unified diff of each changed source; a kernel only one side has is named, its source not repeated.
"""
from __future__ import annotations

import re

from precompile.artifact.pycode import decode_source
from precompile.errors import PrecompileError
from precompile.inspect.diff.line_diff import unified
from precompile.inspect.model.artifact import Artifact
from precompile.inspect.model.report import Change, KernelDiff
from precompile.inspect.reading.extract import subgraph_modules

MAX_KERNEL_LINES = 2000
"""Changed lines shown of the kernels' source diffs, all kernels together; the rest are counted."""
_BINDING = re.compile(r"^(?P<name>[A-Za-z_]\w*) = async_compile\.(?:cpp_pybinding|cpp)\(", re.MULTILINE)
_LITERAL = re.compile(r"r?'''(?P<source>.*?)'''", re.DOTALL)
_PYTHON_BINDINGS = "\n// Python bindings"
_TRITON_SOURCES = (".source", ".ttir")
"""The Triton file shown per kernel: the first stage Triton keeps of it (its input IR)."""
_FAMILY = re.compile(r"^(?P<family>cpp|triton_[a-z]+)_.*_(?P<counter>[0-9]+)$")


def inductor_names(artifact: Artifact, code: bytes | None) -> dict[str, str]:
    """{C++ kernel source (stripped): its Inductor name}, from python_code's output modules."""
    if code is None or artifact.given == "cache":
        return {}
    try:
        source = decode_source(code)
    except PrecompileError:
        return {}
    meta = artifact.python_code.metadata
    try:
        modules = [text.decode("utf-8", "replace") for _, text, _ in subgraph_modules(meta, source)] if meta is not None else []
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        modules = []
    names: dict[str, str] = {}
    for text in modules or [source]:
        bindings = list(_BINDING.finditer(text))
        for binding, after in zip(bindings, [*bindings[1:], None]):
            literal = _LITERAL.search(text, binding.end(), after.start() if after is not None else len(text))
            if literal is not None:
                names.setdefault(literal.group("source").strip(), binding.group("name"))
    return names


def named_kernels(artifact: Artifact, code: bytes | None, files: dict[str, bytes]) -> dict[str, tuple[str, str]]:
    """{Inductor name: (bundle path, source text)} of the bundle's kernel sources (`files`); a kernel
    whose name python_code does not give is keyed by its path, a second one of a name by `name#2`."""
    names = inductor_names(artifact, code)
    bundle = artifact.cache.envelope.bundle if artifact.cache.envelope is not None else None
    found: list[tuple[str, str, str]] = []
    triton: dict[str, tuple[int, str, str, str]] = {}  # by directory and kernel: the earliest stage kept
    for entry in bundle.files if bundle is not None else ():
        data = files.get(entry.path)
        if data is None or b"\0" in data:
            continue
        text = data.decode("utf-8", "replace")
        directory, _, file_name = entry.path.rpartition("/")
        stem, _, suffix = file_name.rpartition(".")
        if entry.kind == "kernel-source":
            found.append((names.get(text.split(_PYTHON_BINDINGS, 1)[0].strip(), entry.path), entry.path, text))
        elif entry.kind == "triton" and f".{suffix}" in _TRITON_SOURCES:
            rank = _TRITON_SOURCES.index(f".{suffix}")
            if rank < triton.get(f"{directory}/{stem}", (len(_TRITON_SOURCES),))[0]:
                triton[f"{directory}/{stem}"] = (rank, stem, entry.path, text)
    found += [(stem, path, text) for _, stem, path, text in (triton[key] for key in sorted(triton))]
    kernels: dict[str, tuple[str, str]] = {}
    for name, path, text in found:
        key, count = name, 1
        while key in kernels:
            count += 1
            key = f"{name}#{count}"
        kernels[key] = (path, text)
    return kernels


def _renamed(removed: list[str], added: list[str]) -> list[tuple[str, str]]:
    """Pairs (old, new) of kernels Inductor renamed: one removed and one added of a family and counter."""
    def by_key(names: list[str]) -> dict[tuple[str, str], list[str]]:
        keyed: dict[tuple[str, str], list[str]] = {}
        for name in names:
            match = _FAMILY.match(name)
            if match is not None:
                keyed.setdefault((match.group("family"), match.group("counter")), []).append(name)
        return keyed

    old, new = by_key(removed), by_key(added)
    return [(old[key][0], new[key][0]) for key in sorted(old) if len(old[key]) == 1 and len(new.get(key, ())) == 1]


def kernel_diffs(a: Artifact, b: Artifact, a_code: bytes | None, b_code: bytes | None,
                 files: tuple[dict[str, bytes] | None, dict[str, bytes] | None], *, context: int = 3) -> tuple[KernelDiff, ...]:
    """The kernels that differ, by Inductor name, each with a unified diff of its source (`files`: each
    bundle's files, read once by the caller); () when the bundles' kernel sources are the same bytes,
    or a bundle could not be read (None: its entries say so)."""
    mega = mega_cache_kernels(a), mega_cache_kernels(b)
    if mega[0] is not None or mega[1] is not None:
        return _named_diffs(mega[0] or {}, mega[1] or {}, context)
    if _source_digests(a) == _source_digests(b) or files[0] is None or files[1] is None:
        return ()
    return _named_diffs(named_kernels(a, a_code, files[0]), named_kernels(b, b_code, files[1]), context)


def mega_cache_kernels(artifact: Artifact) -> dict[str, tuple[str, str]] | None:
    """{Inductor name: (the entry that holds it, source)} of the kernels a Mega-Cache's entries carry
    (a bare blob's, or an upstream precompile cache's `artifact`); None when the cache holds none."""
    upstream = artifact.cache.upstream
    mega = upstream.mega_cache or (upstream.precompile.artifact if upstream.precompile else None) if upstream else None
    if mega is None:
        return None
    kernels: dict[str, tuple[str, str]] = {}
    seen: set[tuple[str, str]] = set()
    for entry in mega.entries:
        for kernel in entry.kernels:
            if (kernel.name, kernel.sha256) in seen:  # one kernel in two entries (a graph and its AOTAutograd entry)
                continue
            seen.add((kernel.name, kernel.sha256))
            key, count = kernel.name, 1
            while key in kernels:
                count += 1
                key = f"{kernel.name}#{count}"
            kernels[key] = (f"{entry.kind} {entry.key}", kernel.source)
    return kernels


def _named_diffs(ka: dict[str, tuple[str, str]], kb: dict[str, tuple[str, str]], context: int) -> tuple[KernelDiff, ...]:
    """The kernels of {name: (where, source)} maps that differ by source, paired by name, then renamed."""
    removed = [name for name in ka if name not in kb]
    added = [name for name in kb if name not in ka]
    pairs = [(name, name) for name in ka if name in kb and ka[name][1] != kb[name][1]]
    renamed = _renamed(removed, added)
    pairs += renamed
    gone = {old for old, _ in renamed} | {new for _, new in renamed}
    changes: list[tuple[str, str, Change]] = [(old, new, "changed") for old, new in pairs]
    changes += [(name, "", "removed") for name in removed if name not in gone]
    changes += [("", name, "added") for name in added if name not in gone]
    room = MAX_KERNEL_LINES
    out = []
    for old, new, change in sorted(changes, key=lambda item: (item[0] or item[1], item[1])):
        if change != "changed":
            out.append(KernelDiff(name=old or new, change=change))
            continue
        shown = unified(ka[old][1].splitlines(), kb[new][1].splitlines(), f"a/{old}", f"b/{new}", context=context, max_lines=room)
        room -= shown.shown
        out.append(KernelDiff(name=old if old == new else f"{old} → {new}", change=change, lines=shown.lines,
                              lines_not_shown=shown.left_out))
    return tuple(out)


def _source_digests(artifact: Artifact) -> list[str]:
    bundle = artifact.cache.envelope.bundle if artifact.cache.envelope is not None else None
    return sorted(f.sha256 for f in bundle.files if f.kind in ("kernel-source", "triton")) if bundle is not None else []
