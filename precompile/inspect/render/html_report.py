"""`precompile report`: one self-contained HTML page about one artifact pair, or two and their diff.

The page has a header, a table of contents and collapsible sections per artifact: summary (tags,
versions, calling convention, hashes, pairing), frames and variants, guards (kept, dropped and risky
slots; the condition that runs, where python_code renders it), kernels (each bundle kernel source and
each compiled subgraph's output module, syntax-highlighted) and the graph code (python_code section by
section). Given two artifacts, the page opens on their semantic diff (the verdict, every change with
its category, each changed kernel by its Inductor name with its source side by side, python_code
side by side), before the artifacts' own sections. It needs nothing at view time: inline CSS, no script, no network (a Content-Security-Policy forbids both), so it can be
attached to an issue or archived as is.

Artifacts are untrusted: everything they hold reaches the page through Jinja2 autoescaping or the
escaping highlighter (`highlight`), its control, bidirectional and invisible characters written as
escapes first (`terminal_text.printable`, as every renderer writes them). Output is deterministic: no timestamps, paths exactly as given.
Reading is torch-free and never executes, imports or unpickles the artifact.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import zip_longest

import jinja2
from markupsafe import Markup

from precompile._version import __version__
from precompile.artifact.bundle_keys import provenance, requirements
from precompile.artifact.bundle_rules import unserved_reason
from precompile.artifact.codec import CacheFormatError
from precompile.artifact.metadata import ConstantLeaf, DynamoMetadata, MakeFxMetadata
from precompile.artifact.pycode import decode_source
from precompile.errors import PrecompileError
from precompile.inspect.diff.diff import category
from precompile.inspect.diff.kernels import named_kernels
from precompile.inspect.model.artifact import Artifact
from precompile.inspect.model.report import DiffReport, ShowReport
from precompile.inspect.reading.bundle_payload import bundle_files
from precompile.inspect.reading.frames import frame_label, frame_role, frame_served
from precompile.inspect.reading.guards import guards_of, shape_text
from precompile.inspect.render.highlight import highlight_lines, language_of
from precompile.inspect.render.render_text import diff_verdict, render_show
from precompile.inspect.render.terminal_text import printable

MAX_SHOWN_SOURCE = 512 * 1024
"""A kernel source or section longer than this (characters) is cut, saying so: the page stays openable."""
_TEXT_KINDS = re.compile(r"source|\.(?:py|cpp|cc|c|h|hpp|cu|txt|json)$")



def _shown(value):
    """What the page writes of a value: text with its control, bidirectional and invisible characters
    escaped (`printable`, line feeds kept for preformatted blocks), then HTML-escaped by autoescape;
    markup this module built (highlighted source, itself escaped) as it is."""
    return printable(value, lines=True) if isinstance(value, str) and not isinstance(value, Markup) else value


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("precompile.inspect.render", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    finalize=_shown,
)


@dataclass
class Code:
    """A block of source as the page shows it: a title, where it comes from, numbered highlighted lines."""

    id: str
    title: str
    note: str
    lines: list[Markup]
    first_line: int = 1
    open: bool = False


@dataclass
class GuardTable:
    title: str
    counts: str
    slots: list[dict]


@dataclass
class ArtifactPage:
    id: str
    label: str
    title: str
    summary: list[tuple[str, str]] = field(default_factory=list)
    calling_convention: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    requirements: list[tuple[str, str]] = field(default_factory=list)
    provenance: list[tuple[str, str]] = field(default_factory=list)
    frames: list[dict] = field(default_factory=list)
    subgraphs: list[dict] = field(default_factory=list)
    guard_headline: str = ""
    not_checked: list[str] = field(default_factory=list)
    guard_tables: list[GuardTable] = field(default_factory=list)
    specializations: list[dict] = field(default_factory=list)
    kernels: list[Code] = field(default_factory=list)
    binaries: list[dict] = field(default_factory=list)
    sections: list[Code] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    show_text: str = ""
    """The artifact as `precompile show` prints it: everything the summary leaves out (an upstream
    cache's Mega-Cache entries and pickle imports, the bundle's file list)."""


def _code(id: str, title: str, note: str, text: str, language: str, *, first_line: int = 1, open: bool = False) -> Code:
    if len(text) > MAX_SHOWN_SOURCE:
        note += f"; cut at {MAX_SHOWN_SOURCE} of {len(text)} characters"
        text = text[:MAX_SHOWN_SOURCE]
    return Code(id=id, title=title, note=note, lines=highlight_lines(text, language), first_line=first_line, open=open)


def _leaf(leaf) -> str:
    if isinstance(leaf, ConstantLeaf):
        return f"constant {leaf.value!r}"
    return f"tensor {shape_text(leaf.shape)} {leaf.dtype} {leaf.device}"


def _python_code_rows(rows: list[tuple[str, str]], artifact: Artifact) -> None:
    code = artifact.python_code
    if artifact.given != "cache":
        rows.append(("python_code", code.path))
        if code.file is not None:
            rows.append(("python_code size, sha256", f"{code.file.size} bytes, {code.file.sha256}"))
    meta = code.metadata
    if meta is not None:
        rows += [
            ("format version", str(meta.format_version)),
            ("tracer", str(type(meta).__struct_config__.tag)),
            ("backend", meta.backend),
            ("serving mode", meta.serving_mode),
            ("fn", meta.fn_name),
            ("captured with", f"torch {meta.torch_version}, python {'.'.join(map(str, meta.python_version))}"),
        ]
        if meta.world is not None:
            rows.append(("world", f"size {meta.world.size}, backend {meta.world.backend}, collectives {', '.join(meta.world.collectives)}"))
    elif code.upstream is not None:
        rows.append(("python_code kind", f"upstream torch.compiler.precompile (make_fx), backend {code.upstream.backend or '?'}"))
        rows += [(literal.name, literal.value) for literal in code.upstream.literals]
    elif artifact.given != "cache":
        rows.append(("format version, tracer", f"{code.format_version if code.format_version is not None else '?'}, {code.tracer or '?'}"))


def _cache_rows(rows: list[tuple[str, str]], artifact: Artifact) -> None:
    if artifact.given == "python_code":
        return
    cache = artifact.cache
    rows.append(("cache", f"{cache.path} ({cache.kind})"))
    if cache.file is not None:
        rows.append(("cache size, sha256", f"{cache.file.size} bytes, {cache.file.sha256}"))
    env = cache.envelope
    if env is not None:
        rows += [
            ("cache format version, tags", f"{cache.format_version}, backend {env.backend}, tracer {env.tracer}"),
            ("produced by", f"precompile {env.producer.precompile}, torch {env.producer.torch}, python {env.producer.python}"),
            ("code_hash", env.code_hash),
        ]
        if cache.header_size is not None and cache.payload is not None:
            digest = f" (sha256 {cache.payload.sha256})" if cache.payload.sha256 else ""
            rows.append(("header, payload", f"{cache.header_size} bytes, {cache.payload.size} bytes{digest}"))


def _calling_convention(meta: MakeFxMetadata) -> list[tuple[str, list[tuple[str, str]]]]:
    grads = [meta.params[i].name if 0 <= i < len(meta.params) else f"#{i}" for i in meta.grad_param_indices]
    return [
        ("arguments", [("positional args", str(meta.num_positional_args)), ("modules at", str(list(meta.module_positions))),
                       *([("modules by keyword", str(list(meta.module_keywords)))] if meta.module_keywords else []),
                       ("in_spec", meta.in_spec), ("out_spec", meta.out_spec), ("gradients returned for", ", ".join(grads) or "(none)")]),
        ("inputs", [(leaf.path, _leaf(leaf)) for leaf in meta.inputs]),
        ("outputs", [(leaf.path, _leaf(leaf)) for leaf in meta.outputs]),
        ("params", [(t.name, f"{shape_text(t.shape)} {t.dtype} {t.device}") for t in meta.params]),
        ("buffers", [(t.name, f"{shape_text(t.shape)} {t.dtype} {t.device}") for t in meta.buffers]),
    ]


def _bundle_rows(page: ArtifactPage, artifact: Artifact) -> None:
    envelope = artifact.cache.envelope
    bundle = envelope.bundle if envelope is not None else None
    if envelope is None or bundle is None or not bundle.files:
        return
    unserved = unserved_reason(envelope)
    served = ("load serves them on a host that meets the requirements" if unserved is None
              else f"load does not serve them (it compiles instead): {unserved}")
    page.summary.append(("kernel bundle", f"{len(bundle.files)} files, {bundle.payload_size} bytes "
                         f"({bundle.payload_compressed_size} compressed); {served}"))
    page.requirements = sorted(requirements(bundle.keys).items())
    page.provenance = list(provenance(bundle.keys, bundle.provenance).items())


def _summary(page: ArtifactPage, artifact: Artifact) -> None:
    _python_code_rows(page.summary, artifact)
    _cache_rows(page.summary, artifact)
    if artifact.given == "pair":
        verdict = {True: "yes", False: "NO", None: "cannot tell"}[artifact.pairs]
        page.summary.append(("pairs", verdict + (f": {artifact.pairing_problem}" if artifact.pairing_problem else "")))
    meta = artifact.python_code.metadata
    if isinstance(meta, DynamoMetadata):
        page.summary.append(("capture summary", str(meta.summary)))
    if isinstance(meta, MakeFxMetadata):
        page.calling_convention = _calling_convention(meta)
    _bundle_rows(page, artifact)


def _frames(page: ArtifactPage, artifact: Artifact) -> None:
    meta = artifact.python_code.metadata
    if isinstance(meta, DynamoMetadata):
        page.frames = [{"name": frame_label(f), "module": f.module, "served": frame_served(f), "role": frame_role(f),
                        "bad": f.bypassed} for f in meta.frames]
        page.subgraphs = [{"name": g.backend_id, "frame": g.frame, "forward": g.forward, "backward": g.backward,
                           "served_by": g.served_by or "", "why": g.fallback_reason} for g in meta.subgraphs]
    elif isinstance(meta, MakeFxMetadata):
        page.frames = [{"name": meta.fn_name, "module": "", "served": "one captured graph, no guards", "role": "entry", "bad": False}]


def _guards(page: ArtifactPage, artifact: Artifact, source: str | None) -> None:
    guards = guards_of(artifact, source)
    if guards is None:
        return
    page.guard_headline = guards.headline
    page.not_checked = list(guards.not_checked)
    for frame in guards.frames if guards.has_guards else ():
        counts = {s: sum(1 for slot in frame.slots if slot.status == s) for s in ("kept", "dropped", "risky_dropped", "policy_dropped")}
        page.guard_tables.append(GuardTable(
            title=f"{frame.frame} variant {frame.variant}",
            counts=", ".join(f"{name.replace('_', ' ')} {n}" for name, n in counts.items()),
            slots=[{"status": s.status, "type": s.guard_type, "source": s.source, "check": s.check, "risky": s.risky} for s in frame.slots],
        ))
    page.specializations = [{"kind": s.kind, "path": s.path, "value": s.value, "risky": s.risky} for s in guards.specializations]


def _kernels(page: ArtifactPage, artifact: Artifact, source: str | None, code: bytes | None) -> None:
    from precompile.inspect.reading.extract import subgraph_modules

    if source is not None and artifact.python_code.metadata is not None:
        try:
            modules = subgraph_modules(artifact.python_code.metadata, source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            modules = []
        for index, (path, content, what) in enumerate(modules):
            page.kernels.append(_code(f"{page.id}-subgraph-{index}", path.removeprefix("subgraphs/"), what,
                                      content.decode("utf-8", "replace"), "python"))
    _mega_cache_code(page, artifact)
    bundle = artifact.cache.envelope.bundle if artifact.cache.envelope is not None else None
    if bundle is None or not bundle.files:
        return
    try:
        files = bundle_files(artifact.cache)
    except (CacheFormatError, PrecompileError) as exc:
        page.findings.append(f"kernel bundle not shown: {exc}")
        return
    names = {path: name for name, (path, _) in named_kernels(artifact, code, files).items()}
    for index, entry in enumerate(bundle.files):
        entry_bytes = files.get(entry.path)
        textual = (entry_bytes is not None and bool(_TEXT_KINDS.search(entry.kind) or _TEXT_KINDS.search(entry.path))
                   and b"\0" not in entry_bytes)
        if entry_bytes is not None and textual:
            name = names.get(entry.path)
            page.kernels.append(_code(f"{page.id}-kernel-{index}", f"{name} ({entry.path})" if name and name != entry.path else entry.path,
                                      f"bundle {entry.kind}, {entry.size} bytes, sha256 {entry.sha256}",
                                      entry_bytes.decode("utf-8", "replace"), language_of(entry.path)))
        else:
            page.binaries.append({"path": entry.path, "kind": entry.kind, "size": entry.size, "sha256": entry.sha256})


def _mega_cache_code(page: ArtifactPage, artifact: Artifact) -> None:
    """A Mega-Cache's kernels by Inductor name, each once, then the output modules and graph code its entries carry."""
    upstream = artifact.cache.upstream
    mega = upstream.mega_cache or (upstream.precompile.artifact if upstream.precompile else None) if upstream else None
    if mega is None:
        return
    for index, kernel in enumerate(mega.kernels):
        page.kernels.append(_code(f"{page.id}-kernel-{index}", kernel.name, f"{kernel.kind} kernel, sha256 {kernel.sha256}",
                                  kernel.source, "cpp" if kernel.kind == "cpp" else "python"))
    others = [(entry, code) for entry in mega.entries for code in entry.code if code.kind in ("wrapper", "graph")]
    for index, (entry, code) in enumerate(others):
        page.kernels.append(_code(f"{page.id}-code-{index}", f"{code.name} ({entry.kind} {entry.key})",
                                  f"{code.kind}: loading runs it", code.source, "python"))


def _sections(page: ArtifactPage, artifact: Artifact, source: str | None) -> None:
    if source is None:
        return
    lines = source.splitlines(keepends=True)
    for section in artifact.python_code.sections:
        text = "".join(lines[section.first_line - 1:section.first_line - 1 + section.line_count])
        page.sections.append(_code(
            f"{page.id}-section-{section.index}", f"{section.slug}: {section.title}",
            f"lines {section.first_line}-{section.first_line + section.line_count - 1}, sha256 {section.sha256}",
            text, "python", first_line=section.first_line, open=section.slug.startswith("graph"),
        ))


def artifact_page(id: str, label: str, artifact: Artifact, code: bytes | None, *, problems=(), findings=()) -> ArtifactPage:
    title = " + ".join(p for p in (artifact.python_code.path, artifact.cache.path) if p)
    page = ArtifactPage(id=id, label=label, title=title, problems=list(problems), findings=list(findings))
    source = None
    if code is not None and artifact.given != "cache":
        try:
            source = decode_source(code, filename=artifact.python_code.path)
        except PrecompileError as exc:
            page.problems.append(str(exc))
    _summary(page, artifact)
    page.show_text = "".join(f"{printable(text)}\n" for text, _ in render_show(ShowReport(artifact=artifact, problems=tuple(problems))))
    _frames(page, artifact)
    _guards(page, artifact, source)
    _kernels(page, artifact, source, code)
    _sections(page, artifact, source)
    return page


_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def side_by_side(lines: tuple[str, ...]) -> list[dict]:
    """A unified diff as rows of two columns: {"kind": hunk|same|changed|removed|added, "a", "b", "na", "nb"}."""
    rows: list[dict] = []
    removed: list[tuple[int, str]] = []
    added: list[tuple[int, str]] = []
    na = nb = 0
    started = False

    def flush() -> None:
        for left, right in zip_longest(removed, added):
            kind = "changed" if left and right else "removed" if left else "added"
            rows.append({"kind": kind, "na": left[0] if left else "", "a": left[1] if left else "",
                         "nb": right[0] if right else "", "b": right[1] if right else ""})
        removed.clear()
        added.clear()

    for line in lines:
        hunk = _HUNK.match(line)
        if hunk is not None:
            flush()
            started = True
            na, nb = int(hunk.group(1)), int(hunk.group(2))
            rows.append({"kind": "hunk", "na": "", "nb": "", "a": line, "b": ""})
        elif not started:
            continue  # the ---/+++ file header
        elif line.startswith("-"):
            removed.append((na, line[1:]))
            na += 1
        elif line.startswith("+"):
            added.append((nb, line[1:]))
            nb += 1
        else:
            flush()
            rows.append({"kind": "same", "na": na, "a": line[1:], "nb": nb, "b": line[1:]})
            na += 1
            nb += 1
    flush()
    return rows


def render(pages: list[ArtifactPage], diff: DiffReport | None = None) -> str:
    """The HTML page of `pages`; given their diff, the page opens on it (verdict, semantic changes,
    changed kernels by Inductor name, python_code), before the artifacts."""
    diff_entries = []
    code_diffs = []
    kernel_diffs = []
    if diff is not None:
        diff_entries = [{"category": category(e.section, e.key), "section": e.section, "key": e.key, "change": e.change,
                         "a": e.a, "b": e.b} for e in diff.entries]
        code_diffs = [{"id": f"diff-code-{i}", "section": c.section, "change": c.change, "rows": side_by_side(c.lines)}
                      for i, c in enumerate(diff.python_code)]
        kernel_diffs = [{"id": f"diff-kernel-{i}", "name": k.name, "change": k.change, "rows": side_by_side(k.lines),
                         "not_shown": k.lines_not_shown} for i, k in enumerate(diff.kernels)]
    title = " vs ".join(page.title for page in pages)
    return _ENV.get_template("report.html.j2").render(
        title=title, version=__version__, pages=pages, diff=diff, diff_entries=diff_entries, code_diffs=code_diffs,
        kernel_diffs=kernel_diffs, verdict=diff_verdict(diff, None)[0] if diff is not None else "",
    )
