"""Write an artifact's parts into a directory for other tools (git diff, difftastic, debuggers).

Layout under DIR: `python_code/NN-<section>.py` (the captured graph is `NN-graph.py`),
`subgraphs/<name>.py` for each Inductor output module a Dynamo artifact holds as a string, `metadata.json`, `envelope.json`, and `bundle/<path>` for each kernel bundle file (hash-checked by
`codec.decode_payload`); for an upstream torch.save cache, `cache/<member>` holds each zip member's
raw bytes (nothing is unpickled). A Mega-Cache (an upstream precompile cache's `artifact` field, or a
bare blob) gives `mega_cache.bin` (its bytes), `mega_cache/NNN-<kind>-<key>` (each entry's raw
content), `mega_cache/kernels/<name>.cpp|.py` (each kernel by its Inductor name) and `mega_cache/code/`
(the output modules and graph code the entries carry); upstream python_code gives its sections and `metadata.json` (its calling-convention
literals as written); a bare pickle gives `cache/<file name>`. DIR must be new or empty; bundle paths
that would escape it are refused.
"""
from __future__ import annotations

import ast
import hashlib
import os
import re
import zipfile
from pathlib import Path, PurePosixPath

import msgspec

from precompile.artifact.codec import CacheFormatError
from precompile.artifact.envelope import KernelBundle
from precompile.artifact.pair import read_bytes
from precompile.artifact.pickle_scan import MAX_PICKLE_SIZE
from precompile.artifact.pycode import decode_source
from precompile.errors import PrecompileError
from precompile.inspect.formats.mega_cache import entry_contents
from precompile.inspect.formats.pickle_values import pickle_value
from precompile.inspect.model.artifact import Artifact, Blob, CacheInfo
from precompile.inspect.model.report import ExtractedFile, ExtractReport
from precompile.inspect.parsing.sections import split_sections
from precompile.inspect.reading.bundle_payload import bundle_files
from precompile.inspect.reading.reader import MAX_ZIP_MEMBERS, read_member

MAX_MEMBER_SIZE = 1024 * 1024 * 1024


def _safe_relative(path: str) -> PurePosixPath:
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or "\\" in path or any(part in ("..", "") for part in path.split("/")) or ":" in path:
        raise PrecompileError(f"path {path!r} in the artifact is absolute or leaves the extract directory; refusing to extract it")
    return pure


def _zip_members(path: str, problems: list[str]) -> list[tuple[str, bytes, str]]:
    """The raw bytes of an upstream torch.save zip's members: copied out, never unpickled."""
    planned = []
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()[:MAX_ZIP_MEMBERS]
            for info in infos:
                if info.is_dir():
                    continue
                planned.append((f"cache/{_safe_relative(info.filename)}", read_member(archive, info, MAX_MEMBER_SIZE),
                                "upstream cache zip member (raw bytes, not unpickled)"))
    except PrecompileError as exc:
        problems.append(str(exc))
    except Exception as exc:  # a broken zip is reported, whatever zipfile raises
        problems.append(f"cache {path}: its zip members cannot be read: {type(exc).__name__}: {exc}")
    return planned


def _mega_cache_files(cache, problems: list[str]) -> list[tuple[str, bytes, str]]:
    """A Mega-Cache's bytes and each entry's raw content (re-read from the file, never loaded)."""
    upstream = cache.upstream
    if upstream.mega_cache is not None:
        data = read_bytes(Path(cache.path), "cache", MAX_PICKLE_SIZE)
    elif upstream.precompile is not None and upstream.precompile.artifact is not None:
        try:
            with zipfile.ZipFile(cache.path) as archive:
                info = next(i for i in archive.infolist() if i.filename.endswith("data.pkl"))
                value = pickle_value(read_member(archive, info))
        except Exception as exc:  # the file changed since it was read: report, never crash
            problems.append(f"cache {cache.path}: its artifact field cannot be read again: {type(exc).__name__}: {exc}")
            return []
        artifact = value.get("artifact") if isinstance(value, dict) else None
        if not isinstance(artifact, bytes):
            return []
        data = artifact
    else:
        return []
    planned = [("mega_cache.bin", data, "Mega-Cache container (raw bytes, never loaded)")]
    for index, (kind, key, content) in enumerate(entry_contents(data)):
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{kind}-{key}")[:120].strip(".") or "entry"
        planned.append((f"mega_cache/{index:03d}-{name}", content, f"Mega-Cache entry {kind} {key} (raw content, never loaded)"))
    mega = upstream.mega_cache or (upstream.precompile.artifact if upstream.precompile is not None else None)
    return planned + (_mega_cache_code(mega) if mega is not None else [])


_CODE_SUFFIX = {"cpp": "cpp", "triton": "py", "wrapper": "py", "graph": "py"}


def _mega_cache_code(mega) -> list[tuple[str, bytes, str]]:
    """The code the entries carry, as text read from their pickles: each kernel once (by Inductor name
    and source) as `mega_cache/kernels/<name>.<cpp|py>`, a second source of one name as `<name>-2`; each
    entry's output modules and graph modules' code as `mega_cache/code/NNN-<kind>-<n>.py`."""
    planned: list[tuple[str, bytes, str]] = []
    seen: set[tuple[str, str]] = set()
    stems: set[str] = set()
    for index, entry in enumerate(mega.entries):
        counts: dict[str, int] = {}
        for code in entry.code:
            if code.kind in ("cpp", "triton"):  # an Inductor name: an identifier, safe as a file name
                if (code.name, code.sha256) in seen:
                    continue
                seen.add((code.name, code.sha256))
                stem, count = code.name, 1
                while stem in stems:
                    count += 1
                    stem = f"{code.name}-{count}"
                stems.add(stem)
                planned.append((f"mega_cache/kernels/{stem}.{_CODE_SUFFIX[code.kind]}", code.source.encode("utf-8", "surrogatepass"),
                                f"{code.kind} kernel {code.name} of {entry.kind} {entry.key} (read from its pickle, never run)"))
            else:
                counts[code.kind] = counts.get(code.kind, 0) + 1
                planned.append((f"mega_cache/code/{index:03d}-{code.kind}-{counts[code.kind]}.py", code.source.encode("utf-8", "surrogatepass"),
                                f"{code.name} of {entry.kind} {entry.key} ({code.kind}; load runs it)"))
    return planned


def subgraph_modules(metadata, source: str) -> list[tuple[str, bytes, str]]:
    """A Dynamo artifact's Inductor output modules, each as the file it is (python_code holds them as
    string literals): `subgraphs/<name>.py`. Read with ast, never executed."""
    names = {name for graph in getattr(metadata, "subgraphs", ()) for name in (graph.forward, graph.backward) if name}
    if not names:
        return []
    modules = []
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in names):
            continue
        name = node.targets[0].id
        text = _module_text(node.value, name)
        if text is not None:
            modules.append((f"subgraphs/{name}.py", text.lstrip("\n").encode("utf-8", "surrogatepass"),
                            f"output module {name} of a compiled subgraph"))
    return modules


def _module_text(value: ast.expr, name: str) -> str | None:
    """The output module bound to `name`: the string itself (served by AOTAutograd), or the text a
    lowered subgraph's `inductor_subgraph(name, text, ...)` call runs, wherever the binding nests it."""
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return value.value
    for node in ast.walk(value):
        if not isinstance(node, ast.Call) or len(node.args) < 2:
            continue
        label, text = node.args[0], node.args[1]
        if (isinstance(label, ast.Constant) and label.value == name
                and isinstance(text, ast.Constant) and isinstance(text.value, str)):
            return text.value
    return None


def _python_code_files(artifact: Artifact, python_code: bytes, problems: list[str]) -> list[tuple[str, bytes, str]]:
    """python_code's sections, the output modules it holds, and its metadata (or upstream literals)."""
    planned: list[tuple[str, bytes, str]] = []
    source = None
    if artifact.given != "cache":
        try:
            source = decode_source(python_code, filename=artifact.python_code.path)
        except PrecompileError as exc:
            problems.append(str(exc))
    if source is not None:
        for section, text in split_sections(source):
            planned.append((f"python_code/{section.index:02d}-{section.slug}.py", text.encode("utf-8", "surrogatepass"), f"python_code section {section.title}"))
        planned.extend(subgraph_modules(artifact.python_code.metadata, source))
    if artifact.python_code.metadata is not None:
        planned.append(("metadata.json", msgspec.json.format(msgspec.json.encode(artifact.python_code.metadata), indent=2) + b"\n", "python_code metadata"))
    elif artifact.python_code.upstream is not None:
        planned.append(("metadata.json", msgspec.json.format(msgspec.json.encode(artifact.python_code.upstream), indent=2) + b"\n",
                        "upstream python_code calling-convention literals"))
    if artifact.python_code.problem:
        problems.append(artifact.python_code.problem)
    return planned


def _bundle_files(cache: CacheInfo, bundle: KernelBundle, problems: list[str]) -> list[tuple[str, bytes, str]]:
    """Each kernel bundle file, hash-checked as load decodes it: `bundle/<path>`."""
    try:
        files = bundle_files(cache)
    except CacheFormatError as exc:
        problems.append(str(exc))
        files = {}
    return [(f"bundle/{_safe_relative(entry.path)}", files[entry.path], f"bundle file ({entry.kind})")
            for entry in bundle.files if entry.path in files]


def _cache_files(cache: CacheInfo, problems: list[str]) -> list[tuple[str, bytes, str]]:
    """The cache's envelope and bundle files, or an upstream cache's members, envelope and Mega-Cache."""
    planned: list[tuple[str, bytes, str]] = []
    if cache.envelope is not None:
        planned.append(("envelope.json", msgspec.json.format(msgspec.json.encode(cache.envelope), indent=2) + b"\n", "cache envelope"))
        bundle = cache.envelope.bundle
        if bundle is not None and bundle.files:
            planned.extend(_bundle_files(cache, bundle, problems))
    upstream = cache.upstream
    if upstream is not None and upstream.container == "torch_save_zip":
        planned.extend(_zip_members(cache.path, problems))
    if upstream is not None and upstream.precompile is not None:
        planned.append(("envelope.json", msgspec.json.format(msgspec.json.encode(upstream.precompile), indent=2) + b"\n",
                        "upstream precompile cache envelope (with its Mega-Cache's entries)"))
    if upstream is not None:
        planned.extend(_mega_cache_files(cache, problems))
    if upstream is not None and upstream.container == "pickle":
        planned.append((f"cache/{_safe_relative(os.path.basename(cache.path))}", read_bytes(Path(cache.path), "cache", MAX_PICKLE_SIZE),
                        "bare pickle (raw bytes, not unpickled)"))
    if cache.problem:
        problems.append(cache.problem)
    return planned


def extract(artifact: Artifact, python_code: bytes, directory: str) -> ExtractReport:
    root = Path(directory)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise PrecompileError(f"extract directory {directory} exists and is not empty; pass a new or empty directory")
    problems: list[str] = []
    planned = _python_code_files(artifact, python_code, problems) + _cache_files(artifact.cache, problems)
    written = []
    for relative, content, what in planned:
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        shown = os.path.join(directory, *relative.split("/"))
        written.append(ExtractedFile(path=shown, file=Blob(size=len(content), sha256=hashlib.sha256(content).hexdigest()), what=what))
    return ExtractReport(directory=directory, files=tuple(written), problems=tuple(problems))
