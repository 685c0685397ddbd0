"""Deterministic text renderings of the reports: stable order, paths as given, no timestamps.

Each renderer returns lines as (text, style) pairs; style is a rich style name or None, applied
only when the console has colour. The text itself never depends on terminal width or colour.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

from precompile.artifact import bytecode
from precompile.artifact.bundle_keys import provenance, requirements
from precompile.artifact.bundle_rules import unserved_reason
from precompile.artifact.metadata import ConstantLeaf, DynamoMetadata, MakeFxMetadata
from precompile.artifact.pickle_policy import DATA_ONLY, PARTIAL
from precompile.inspect.diff.diff import SECTIONS
from precompile.inspect.diff.line_diff import MAX_SHOWN_CHARS, around_change, shown
from precompile.inspect.formats.mega_cache_policy import review_reason
from precompile.inspect.formats.mega_cache_runs import run_finding
from precompile.inspect.model.artifact import (
    Artifact,
    CacheInfo,
    Guards,
    MegaCache,
    MegaCacheEntry,
    PickleScan,
    PythonCodeInfo,
    UpstreamCache,
)
from precompile.inspect.model.report import DiffReport, ExtractReport, GuardsReport, ShowReport, VerifyReport
from precompile.inspect.reading.frames import frame_label, frame_role, frame_served
from precompile.inspect.reading.guards import shape_text

Line = tuple[str, "str | None"]
HEAD = "bold"
BAD = "bold red"
GOOD = "green"
WARN = "yellow"


def _leaf(leaf) -> str:
    if isinstance(leaf, ConstantLeaf):
        return f"{leaf.path}  constant {leaf.value!r}"
    kept = f" (served in the captured layout only: {leaf.layout_kept})" if leaf.layout_kept else ""
    return f"{leaf.path}  tensor {shape_text(leaf.shape)} {leaf.dtype} {leaf.device}{kept}"


def _python_code(info: PythonCodeInfo) -> list[Line]:
    size = f"{info.file.size} bytes, sha256 {info.file.sha256}" if info.file else "unreadable"
    lines: list[Line] = [(f"python_code {info.path} ({size})", HEAD)]
    meta = info.metadata
    if info.upstream is not None:
        lines.append((f"  upstream torch.compiler.precompile python_code (make_fx), backend {info.upstream.backend or '?'}", None))
        lines.extend((f"    {literal.name} = {literal.value}", None) for literal in info.upstream.literals)
    elif meta is None:
        lines.append((f"  format version {info.format_version if info.format_version is not None else '?'}, tracer {info.tracer or '?'}", None))
        if info.literal_names:
            lines.append((f"  literals: {', '.join(info.literal_names)}", None))
    else:
        tracer = type(meta).__struct_config__.tag
        lines.append((f"  format version {meta.format_version}, tracer {tracer}, backend {meta.backend}, serving mode {meta.serving_mode}", None))
        lines.append((f"  fn {meta.fn_name}", None))
        lines.append((f"  captured with torch {meta.torch_version}, python {'.'.join(map(str, meta.python_version))}", None))
        if meta.world is not None:
            lines.extend(_world(meta.world))
        extra = sorted(set(info.literal_names) - set(type(meta).__struct_encode_fields__) - {"TRACER"})
        if extra:
            lines.append((f"  other literals: {', '.join(extra)}", None))
    if info.sections:
        parts = ", ".join(f"{s.slug} ({s.first_line}-{s.first_line + s.line_count - 1})" for s in info.sections)
        lines.append((f"  sections: {parts}", None))
    lines.extend(_literal_pickles(info))
    if isinstance(meta, MakeFxMetadata):
        lines.extend(_calling_convention(meta))
    return lines


def _literal_pickles(info: PythonCodeInfo) -> list[Line]:
    lines: list[Line] = []
    for scan in info.pickles:
        proto = f"protocol {scan.protocol}" if scan.protocol is not None else "protocol ?"
        nested = f", {scan.nested} nested pickles" if scan.nested else ""
        lines.append((f"  pickle in {scan.member} ({scan.blob.size} bytes, {proto}{nested}, sha256 {scan.blob.sha256}): "
                      "never unpickled", None))
        lines.extend(_import_lines(scan, "    "))
    return lines


def _import_lines(scan: PickleScan, indent: str, reviewed_as: Callable[[str, str], str] | None = None) -> list[Line]:
    """What a pickle would import, in the order it would, each name once (nested pickles included);
    `reviewed_as(module, name)` says why a reviewed name is allowed where the pickle sits."""
    counts: dict[tuple[str, str, str], int] = {}
    for imp in scan.imports:
        key = (imp.module, imp.name, imp.risk)
        counts[key] = counts.get(key, 0) + imp.count
    lines: list[Line] = [(f"{indent}imports ({len(counts)})", None)]
    for (module, name, risk), count in counts.items():
        flag, style = _risk_flag(scan, module, name, risk, reviewed_as)
        times = f" (x{count})" if count > 1 else ""
        lines.append((f"{indent}  {module}.{name}{times}{flag}", style))
    lines.extend((f"{indent}  {imp.module}.{imp.name} at offset {imp.offset}: {imp.unresolved}", BAD)
                 for imp in scan.imports if imp.unresolved)
    if scan.problem:
        lines.append((f"{indent}scan problem (a finding: nothing past it is vouched for): {scan.problem}", BAD))
    return lines


def _risk_flag(scan: PickleScan, module: str, name: str, risk: str,
               reviewed_as: Callable[[str, str], str] | None) -> tuple[str, str | None]:
    """How an import is marked: data-only (nothing), reviewed where it sits, unknown, or flagged."""
    if risk == "allowed":
        if not scan.unpickled_by_load or (module, name) in DATA_ONLY or (module, name) == PARTIAL:
            return "", None
        why = reviewed_as(module, name) if reviewed_as else "part of Dynamo's state or the captured code"
        return f"  (reviewed: {why})", None
    if risk == "unknown" and scan.unpickled_by_load:
        return "  FLAGGED: not on the data-only or reviewed lists, and load unpickles this", BAD
    if risk == "unknown":
        return "  (unknown: not on the data-only list)", WARN
    return f"  FLAGGED: {risk}", BAD


def _world(world) -> list[Line]:
    """The torch.distributed world the artifact's collectives were captured in (and serve in only)."""
    groups = ", ".join(f"{g.name!r} ranks {list(g.ranks)}" for g in world.groups) or "none named"
    return [
        (f"  world: size {world.size}, backend {world.backend}, collectives {', '.join(world.collectives)}", None),
        (f"  process groups: {groups}", None),
    ]


def _calling_convention(meta: MakeFxMetadata) -> list[Line]:
    lines: list[Line] = [("calling convention", HEAD)]
    by_keyword = f", by keyword {list(meta.module_keywords)}" if meta.module_keywords else ""
    lines.append((f"  {meta.num_positional_args} positional args, modules at {list(meta.module_positions)}{by_keyword}", None))
    for title, leaves in (("inputs", meta.inputs), ("outputs", meta.outputs)):
        lines.append((f"  {title} ({len(leaves)})", None))
        lines.extend((f"    {_leaf(leaf)}", None) for leaf in leaves)
    for title, tensors in (("params", meta.params), ("buffers", meta.buffers)):
        lines.append((f"  {title} ({len(tensors)})", None))
        lines.extend((f"    {t.name}  {shape_text(t.shape)} {t.dtype} {t.device}", None) for t in tensors)
    grads = [meta.params[i].name if 0 <= i < len(meta.params) else f"#{i}" for i in meta.grad_param_indices]
    lines.append((f"  gradients returned for: {', '.join(grads) if grads else '(none)'}", None))
    return lines


def _mega_cache(mega: MegaCache, title: str) -> list[Line]:
    version = mega.encoding_version if mega.encoding_version is not None else "?"
    lines: list[Line] = [(f"  {title}: Mega-Cache ({mega.blob.size} bytes, sha256 {mega.blob.sha256}, encoding version {version}, "
                          f"crc32 {mega.crc32 or '?'}), {len(mega.entries)} entries, never loaded", None)]
    lines.extend((f"    recorded {value.name}: {value.value}", None) for value in mega.recorded)
    if not any(value.name == "torch version" for value in mega.recorded):
        lines.append(("    recorded torch version: none in clear (an entry may keep only a digest of torch's sources)", None))
    for entry in mega.entries:
        lines.append((f"    {entry.kind} {entry.key}  {entry.content} {entry.file.size} bytes sha256 {entry.file.sha256}", None))
        if entry.scan is not None:
            lines.extend(_import_lines(entry.scan, "      ", functools.partial(review_reason, entry.kind)))
        lines.extend(_code_lines(entry.code))
        lines.extend(_run_lines(entry))
    if mega.problem:
        lines.append((f"    problem: {mega.problem}", BAD))
    return lines


def _run_lines(entry: MegaCacheEntry) -> list[Line]:
    """The fields of an entry torch runs: each guard expression, each symbolic output stride and the
    output module's file, as torch would use them; anything else is a finding, named."""
    lines: list[Line] = []
    for run in entry.runs:
        if run.problem is not None:
            lines.append((f"      finding: {run_finding(entry, run)}", BAD))
        elif run.field == "cache_key":
            lines.append((f"      output module file load writes and imports: {run.text}", None))
        else:
            when = "guard expression torch evaluates at lookup" if run.field == "guards_expr" else "output stride torch evaluates at load"
            lines.append((f"      {when} ({run.field}): {run.text}", None))
    return lines


def _code_lines(code) -> list[Line]:
    """The code an entry carries that loading runs: its kernels by name, then its modules and graphs counted."""
    if not code:
        return []
    kernels = [item for item in code if item.kind in ("cpp", "triton")]
    modules = sum(item.kind == "wrapper" for item in code)
    graphs = sum(item.kind == "graph" for item in code)
    lines: list[Line] = [(f"      code loading runs: {len(kernels)} kernels, {modules} output modules, {graphs} graph modules", None)]
    lines.extend((f"        kernel {item.name} ({item.kind}, {len(item.source.splitlines())} lines, sha256 {item.sha256[:16]})", None)
                 for item in kernels)
    return lines


def _upstream(upstream: UpstreamCache) -> list[Line]:
    lines: list[Line] = []
    envelope = upstream.precompile
    if envelope is not None:
        tracer = f", tracer {envelope.tracer}" if envelope.tracer is not None else ""
        lines.append((f"  upstream torch.compiler.precompile cache, version {envelope.version}, backend {envelope.backend}{tracer}", None))
        lines.append((f"  code_hash {envelope.code_hash}", None))
        if envelope.artifact is None:
            lines.append(("  artifact: None (nothing compiled to prime)", None))
        else:
            lines.extend(_mega_cache(envelope.artifact, "artifact"))
    if upstream.mega_cache is not None:
        lines.extend(_mega_cache(upstream.mega_cache, "file"))
    if upstream.members:
        lines.append((f"  zip members ({len(upstream.members)})", None))
        lines.extend((f"    {m.name}  {m.size} bytes", None) for m in sorted(upstream.members, key=lambda m: m.name))
    for scan in upstream.pickles:
        proto = f"protocol {scan.protocol}" if scan.protocol is not None else "protocol ?"
        lines.append((f"  pickle {scan.member} ({scan.blob.size} bytes, {proto}, sha256 {scan.blob.sha256}): never unpickled", None))
        if scan.top_level is not None:
            lines.append((f"    evaluates to: {scan.top_level}", None))
        lines.extend((f"    field {f.key}: {f.summary}", None) for f in scan.fields)
        lines.extend(_import_lines(scan, "    "))
    return lines


def _bytecode_line(code) -> str:
    refused = bytecode.left_out_reason(code) or bytecode.layout_problem(code)
    left_out = f" leaving out the literal{'s' if len(code.left_out) > 1 else ''} {', '.join(code.left_out)}" if code.left_out else ""
    use = ("load runs it instead of compiling python_code on a Python with that magic" if refused is None
           else f"{refused}: load compiles python_code instead")
    parts = f", in {len(code.part_lines)} part{'s' if len(code.part_lines) > 1 else ''} run in turn" if code.part_lines else ""
    return (f"  python_code bytecode: {code.size} bytes ({code.compressed_size} compressed, marshal v{code.marshal_version}, "
            f"Python magic {code.magic}, optimize {code.optimize}, compiled as {code.filename}{left_out if refused is None else ''}"
            f"{parts}, sha256 {code.sha256}): {use}; verify compiles python_code and compares")


def _cache(cache: CacheInfo, artifact: Artifact) -> list[Line]:
    size = f"{cache.file.size} bytes" if cache.file else None
    if cache.envelope is not None and cache.header_size is not None and cache.payload is not None:
        size = f"header {cache.header_size} bytes, payload {cache.payload.size} bytes"
    lines: list[Line] = [(f"cache {cache.path} ({cache.kind}{', ' + size if size else ''})", HEAD)]
    env = cache.envelope
    if env is not None:
        lines.append((f"  format version {cache.format_version}, backend {env.backend}, tracer {env.tracer}", None))
        lines.append((f"  produced by precompile {env.producer.precompile}, torch {env.producer.torch}, python {env.producer.python}", None))
        lines.append((f"  code_hash {env.code_hash}", None))
        bundle = env.bundle
        if bundle is None or not bundle.files:
            lines.append(("  kernel bundle: empty", None))
        else:
            lines.append((f"  kernel bundle: {len(bundle.files)} files, {bundle.payload_size} bytes ({bundle.payload_compressed_size} compressed, sha256 {bundle.payload_sha256})", None))
            unserved = unserved_reason(env)
            lines.append(("    load serves these kernels on a host that meets the requirements" if unserved is None
                          else f"    load does not serve these kernels (it compiles them instead): {unserved}", None))
            lines.append(("    requirements (a serving host must match them):", None))
            lines.extend((f"      {k} = {v}", None) for k, v in sorted(requirements(bundle.keys).items()))
            lines.append(("    provenance (for information only):", None))
            lines.extend((f"      {k} = {v}", None) for k, v in provenance(bundle.keys, bundle.provenance).items())
            lines.extend((f"    {f.path}  {f.kind} {f.size} bytes sha256 {f.sha256}", None) for f in bundle.files)
        code, meta = env.python_bytecode, env.metadata_msgpack
        if code is not None:
            lines.append((_bytecode_line(code), None))
        if meta is not None:
            lines.append((f"  python_code metadata, typed: {meta.size} bytes msgpack ({meta.compressed_size} compressed, sha256 {meta.sha256}): load decodes it "
                          "instead of parsing python_code; verify compares it with the literals", None))
    elif cache.format_version is not None and cache.upstream is None:
        lines.append((f"  format version {cache.format_version}", None))
    if cache.upstream is not None:
        lines.extend(_upstream(cache.upstream))
    return lines


def render_show(report: ShowReport) -> list[Line]:
    artifact = report.artifact
    lines = [] if artifact.given == "cache" else _python_code(artifact.python_code)
    if artifact.given != "python_code":
        lines += _cache(artifact.cache, artifact)
    if artifact.given == "python_code":
        lines.append(("cache: none given (no NAME.cache beside it); python_code shown alone", WARN))
    if artifact.given == "pair":
        pairs = {True: ("yes", GOOD), False: ("NO", BAD), None: ("cannot tell", WARN)}[artifact.pairs]
        lines.append((f"pairs: {pairs[0]}" + (f" ({artifact.pairing_problem})" if artifact.pairing_problem else ""), pairs[1]))
    meta = artifact.python_code.metadata
    if isinstance(meta, DynamoMetadata):
        lines.append((f"frames: {len(meta.frames)}", None))
        if meta.serving_mode == "installed":
            lines.append(("  served installed: each frame's variants are installed onto its code object and calls "
                          "run under Dynamo's frame evaluator, refusing to compile", None))
        for frame in meta.frames:
            lines.append((f"  {frame_label(frame)} in {frame.module}: {frame_served(frame)} ({frame_role(frame)})",
                          BAD if frame.bypassed else None))
        lines.extend(_subgraphs(meta))
        lines.append((f"summary: {meta.summary}", None if meta.summary.complete else WARN))
    elif meta is not None:
        lines.append((f"frames: 1 ({meta.fn_name}, one captured graph, no guards)", None))
    for problem in report.problems:
        lines.append((f"problem: {problem}", BAD))
    return lines


def _subgraphs(meta: DynamoMetadata) -> list[Line]:
    if not meta.subgraphs:
        return [("subgraphs: inside the opaque state (written before subgraphs became readable source)", None)]
    lines: list[Line] = [(f"subgraphs: {len(meta.subgraphs)}, readable source in python_code", None)]
    for graph in meta.subgraphs:
        parts = ", ".join(f"{part} {name}" for part, name in (("forward", graph.forward), ("backward", graph.backward)) if name)
        lines.append((f"  {graph.backend_id} (frame {graph.frame}): {parts}{_served_by(graph)}", None))
    return lines


def _served_by(graph) -> str:
    """How an inductor subgraph is served, where the artifact says (written since it could be lowered)."""
    if graph.served_by == "inductor_runtime":
        return ", served directly by the kernel runtime"
    if graph.served_by == "aotautograd":
        return f", served by AOTAutograd ({graph.fallback_reason})" if graph.fallback_reason else ", served by AOTAutograd"
    return ""


def render_guards(report: GuardsReport) -> list[Line]:
    guards: Guards | None = report.guards
    if guards is None:
        return [(f"{report.python_code}: guards unavailable", BAD), *((f"problem: {p}", BAD) for p in report.problems)]
    lines: list[Line] = [(f"{report.python_code}: {guards.tracer} artifact: {guards.headline}", HEAD)]
    lines.append(("NOT checked:", BAD))
    lines.extend((f"  - {item}", None) for item in guards.not_checked)
    for frame in guards.frames if guards.has_guards else ():
        counts = {status: sum(1 for s in frame.slots if s.status == status) for status in ("kept", "dropped", "risky_dropped", "policy_dropped")}
        lines.append((f"frame {frame.frame} variant {frame.variant}: " + ", ".join(f"{k} {v}" for k, v in counts.items()), HEAD))
        for slot in frame.slots:
            lines.append((f"  {slot.status:<14} {slot.guard_type:<16} {slot.source}{'  [risky]' if slot.risky else ''}  {slot.check}".rstrip(), BAD if slot.risky else None))
            if slot.origin:
                lines.append((f"  {'':<14} {'':<16} made at {slot.origin}", None))
    lines.append((f"specializations ({len(guards.specializations)}), checked on every call:", HEAD))
    width = max((len(s.path) for s in guards.specializations), default=0)
    kind = max((len(s.kind) for s in guards.specializations), default=8)
    kind = max(kind, 8)
    lines.extend((f"  {s.kind:<{kind}} {s.path:<{width}}  {s.value}{'  (not checked)' if s.risky else ''}", None)
                 for s in guards.specializations)
    for scan in report.pickles:
        imports = len({(imp.module, imp.name) for imp in scan.imports})
        lines.append((f"opaque state {scan.member}: {scan.blob.size} bytes, never unpickled; would import {imports} names, "
                      f"{len(scan.dangerous)} dangerous or unresolved", BAD if scan.dangerous or scan.problem else None))
    lines.extend((f"finding: {f}", BAD) for f in report.findings)
    lines.extend((f"problem: {p}", BAD) for p in report.problems)
    return lines


def render_diff(report: DiffReport, *, stat: bool = False, fail_on: tuple[str, ...] | None = None,
                verdict_first: bool = False) -> list[Line]:
    """The differences section by section, then python_code's (with `stat`: only their counts), then
    a one-line verdict (saying which categories `--fail-on` gates); `verdict_first`: that line opens
    the text instead (an assertion message says it at once)."""
    if verdict_first:
        rest = render_diff(report, stat=stat, fail_on=fail_on)
        return [rest[-1], *rest[:-1]]
    lines: list[Line] = [(f"--- {report.a}", HEAD), (f"+++ {report.b}", HEAD)]
    if report.equal:
        lines.append(("no differences", GOOD))
    if report.moved:
        lines.append((f"moved ({len(report.moved)}; where code sits, not what it does: not a difference)", HEAD))
        lines.extend((f"  ~ {shown(e.key)}: {shown(e.a or '')} -> {shown(e.b or '')}", None) for e in report.moved)
    if stat:
        lines.extend((f"  {name:<20} {count:>5} difference{'s' if count != 1 else ''}", None) for name, count in report.categories.items())
    else:
        lines.extend(_diff_lines(report))
    lines.extend((f"problem: {p}", BAD) for p in report.problems)
    lines.append(diff_verdict(report, fail_on))
    return lines


def diff_verdict(report: DiffReport, fail_on: tuple[str, ...] | None) -> Line:
    """The one-line verdict every rendering of a diff gives: equal, or the categories that differ
    and, with `--fail-on`, which of them fail the gate."""
    found = ", ".join(f"{name} ({count})" for name, count in report.categories.items())
    if report.unpaired:
        sides = " and ".join(f"{side} ({report.a if side == 'a' else report.b})" for side in report.unpaired)
        return (f"verdict: {f'differ in {found}' if found else 'equal'}; {sides} given with a cache that is not its "
                "python_code's (another build's): load would not serve what was compared, so it fails every gate", BAD)
    if report.equal:
        return ("verdict: equal", GOOD)
    if fail_on is None:
        return (f"verdict: differ in {found}", BAD)
    gated = [name for name in fail_on if report.categories.get(name)]
    if gated:
        return (f"verdict: differ in {found}; fails on {', '.join(gated)}", BAD)
    return (f"verdict: differ in {found}; none of {', '.join(fail_on)}, so it passes", GOOD)


def _diff_lines(report: DiffReport) -> list[Line]:
    lines: list[Line] = []
    for section in SECTIONS:
        entries = [e for e in report.entries if e.section == section]
        if not entries:
            continue
        counts = {c: sum(1 for e in entries if e.change == c) for c in ("changed", "added", "removed")}
        lines.append((f"{section} (" + ", ".join(f"{n} {c}" for c, n in counts.items() if n) + ")", HEAD))
        for e in entries:
            key, a, b = shown(e.key), shown(e.a or ""), shown(e.b or "")
            if e.change == "changed":
                a, b = around_change(e.a or "", e.b or "", MAX_SHOWN_CHARS)
                lines.append((f"  ~ {key}: {a} -> {b}", WARN))
            elif e.change == "added":
                lines.append((f"  + {key}: {b}", GOOD))
            else:
                lines.append((f"  - {key}: {a}", BAD))
    if report.python_code:
        lines.append((f"python_code ({len(report.python_code)} sections differ; normalized)", HEAD))
        for code in report.python_code:
            lines.append((f"  section {code.section} ({code.change})", HEAD))
            lines.extend(_unified_lines(code.lines, code.lines_not_shown))
    if report.kernels:
        lines.append((f"kernel sources ({len(report.kernels)} differ; by Inductor name)", HEAD))
        for kernel in report.kernels:
            lines.append((f"  kernel {kernel.name} ({kernel.change})", HEAD))
            lines.extend(_unified_lines(kernel.lines, kernel.lines_not_shown))
    return lines


def _unified_lines(diff: tuple[str, ...], not_shown: int) -> list[Line]:
    """A unified diff indented and coloured by sign, and what it left out counted."""
    lines: list[Line] = []
    for line in diff:
        style = GOOD if line.startswith("+") else BAD if line.startswith("-") else "cyan" if line.startswith("@@") else None
        lines.append((f"    {line}", style))
    if not_shown:
        lines.append((f"    ... {not_shown} more changed lines not shown", WARN))
    return lines


def render_verify(report: VerifyReport, *, verbose: bool = False) -> list[Line]:
    """The verdict and what failed; with `verbose`, every check."""
    lines: list[Line] = [(f"verify {report.python_code} {report.cache}{' (with host)' if report.host else ''}", HEAD)]
    for check in report.checks:
        if not verbose and check.status != "fail":
            continue
        status = {"ok": ("ok  ", GOOD), "fail": ("FAIL", BAD), "skip": ("skip", WARN)}[check.status]
        detail = (check.message or check.actual) if check.status == "ok" else check.message
        lines.append((f"  {status[0]}  {check.name}" + (f": {detail}" if detail else ""), status[1]))
        if check.status == "fail":
            if check.expected is not None or check.actual is not None:
                lines.append((f"        expected {check.expected}, found {check.actual}", None))
            if check.remedy:
                lines.append((f"        remedy: {check.remedy}", None))
    counts = {status: sum(check.status == status for check in report.checks) for status in ("ok", "fail", "skip")}
    tally = f"{len(report.checks)} checks: {counts['ok']} ok, {counts['fail']} failed, {counts['skip']} skipped"
    hint = "" if verbose else "; -v lists every check"
    lines.append((f"verified: ok ({tally}{hint})" if report.ok else f"verified: FAILED ({tally}{hint})", GOOD if report.ok else BAD))
    return lines


def render_extract(report: ExtractReport) -> list[Line]:
    lines: list[Line] = [(f"extracted {len(report.files)} files into {report.directory}", HEAD)]
    lines.extend((f"  {f.path}  {f.file.size} bytes  ({f.what})", None) for f in report.files)
    lines.extend((f"problem: {p}", BAD) for p in report.problems)
    return lines
