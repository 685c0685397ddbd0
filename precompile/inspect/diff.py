"""Semantic diff of two artifacts, keyed by identity (names, paths, field names), not position.

Sections come in a fixed order, most meaningful first: guards, inputs, outputs, params, buffers,
metadata, envelope, bundle, entries (a Mega-Cache's, entry by entry); then a unified diff of
python_code section by section, every line of every section, opaque ones included (`code_lines`).
Names Dynamo mints per process (graph uuids, continuation counters) are masked throughout, and
nothing else, so two captures of the same code in two processes compare equal.
"""
from __future__ import annotations

from precompile.artifact.metadata import ConstantLeaf, DynamoMetadata, MakeFxMetadata
from precompile.artifact.pycode import decode_source
from precompile.errors import PrecompileError
from precompile.inspect.code_lines import compared_lines
from precompile.inspect.frames import frame_label, frame_role, frame_served
from precompile.inspect.guards import guards_of, shape_text
from precompile.inspect.line_diff import unified
from precompile.inspect.model import Artifact, MegaCache
from precompile.inspect.process_ids import mask_process_ids
from precompile.inspect.report import CodeDiff, DiffEntry, DiffReport
from precompile.inspect.sections import split_sections

SECTIONS = ("guards", "inputs", "outputs", "params", "buffers", "metadata", "envelope", "bundle", "entries")
MAX_CHANGED_LINES = 2000
"""Changed lines shown of the python_code diff, all sections together; the rest are counted."""


def _leaf(leaf) -> str:
    if isinstance(leaf, ConstantLeaf):
        return f"constant {leaf.value!r}"
    return f"tensor {shape_text(leaf.shape)} {leaf.dtype} {leaf.device}"


def flatten(artifact: Artifact) -> dict[str, dict[str, str]]:
    """{section: {identity: value text}} of everything compared."""
    out: dict[str, dict[str, str]] = {name: {} for name in SECTIONS}
    guards = guards_of(artifact)
    if guards is not None:
        # Keyed by the slot alone, so a guard one capture kept and another dropped is one change.
        verdicts: dict[str, set[str]] = {}
        for frame in guards.frames:
            for slot in frame.slots:
                verdict = slot.status if slot.status != "kept" else f"kept in {frame.frame}#{frame.variant}"
                verdicts.setdefault(f"{slot.guard_type} {slot.source}".strip(), set()).add(verdict)
        out["guards"] = {key: ", ".join(sorted(values)) for key, values in verdicts.items()}
    meta = artifact.python_code.metadata
    if isinstance(meta, DynamoMetadata):
        out["metadata"] = {
            "FORMAT_VERSION": str(meta.format_version),
            "TRACER": "dynamo",
            "BACKEND": meta.backend,
            "SERVING_MODE": meta.serving_mode,
            "TORCH_VERSION": meta.torch_version,
            "PYTHON_VERSION": ".".join(map(str, meta.python_version)),
            "FN_NAME": meta.fn_name,
            "SUMMARY": str(meta.summary),
            **{f"FRAMES {frame_label(f)}": f"{frame_served(f)}, {frame_role(f)}" for f in meta.frames},
            **{f"INLINED_SOURCES {s.module}:{s.first_line}-{s.last_line}": s.sha256 for s in meta.inlined_sources},
        }
    if isinstance(meta, MakeFxMetadata):
        out["inputs"] = {leaf.path: _leaf(leaf) for leaf in meta.inputs}
        out["outputs"] = {leaf.path: _leaf(leaf) for leaf in meta.outputs}
        out["params"] = {t.name: f"{shape_text(t.shape)} {t.dtype} {t.device}" for t in meta.params}
        out["buffers"] = {t.name: f"{shape_text(t.shape)} {t.dtype} {t.device}" for t in meta.buffers}
        grads = [meta.params[i].name if 0 <= i < len(meta.params) else f"#{i}" for i in meta.grad_param_indices]
        out["metadata"] = {
            "FORMAT_VERSION": str(meta.format_version),
            "TRACER": "make_fx",
            "BACKEND": meta.backend,
            "SERVING_MODE": meta.serving_mode,
            "TORCH_VERSION": meta.torch_version,
            "PYTHON_VERSION": ".".join(map(str, meta.python_version)),
            "FN_NAME": meta.fn_name,
            "NUM_POSITIONAL_ARGS": str(meta.num_positional_args),
            "MODULE_POSITIONS": str(tuple(meta.module_positions)),
            "IN_SPEC": meta.in_spec,
            "OUT_SPEC": meta.out_spec,
            "GRAD_PARAMS": ", ".join(grads) or "(none)",
        }
    if isinstance(meta, (DynamoMetadata, MakeFxMetadata)) and meta.world is not None:
        world = meta.world
        groups = "; ".join(f"{g.name} ranks {list(g.ranks)}" for g in world.groups)
        out["metadata"]["WORLD"] = f"size {world.size}, backend {world.backend}, groups {groups}, collectives {', '.join(world.collectives)}"
    envelope = artifact.cache.envelope
    if envelope is not None:
        env = {
            "format_version": str(artifact.cache.format_version),
            "backend": envelope.backend,
            "tracer": envelope.tracer,
            "producer.precompile": envelope.producer.precompile,
            "producer.torch": envelope.producer.torch,
            "producer.python": envelope.producer.python,
            "pairs": {True: "yes", False: "no", None: "unknown"}[artifact.pairs],
        }
        if artifact.given != "pair":
            env["code_hash"] = envelope.code_hash  # with python_code at hand, its sections and `pairs` say it all
        bundle = envelope.bundle
        if bundle is not None:
            if artifact.given != "pair":
                env["code_hash"] = str(envelope.code_hash)
            env.update({f"bundle.keys.{k}": v for k, v in bundle.keys.items()})
            env.update({f"bundle.provenance.{k}": v for k, v in bundle.provenance.items()})
            env["bundle.payload_size"] = str(bundle.payload_size)
            env["bundle.payload_compressed_size"] = str(bundle.payload_compressed_size)
            env["bundle.payload_sha256"] = bundle.payload_sha256 or "(none)"
            out["bundle"] = {f.path: f"{f.kind} {f.size} bytes sha256 {f.sha256}" for f in bundle.files}
        out["envelope"] = env
    elif artifact.cache.upstream is not None and (artifact.cache.upstream.precompile or artifact.cache.upstream.mega_cache):
        upstream = artifact.cache.upstream
        env = {"kind": artifact.cache.kind}
        mega = upstream.mega_cache
        if upstream.precompile is not None:
            precompiled = upstream.precompile
            mega = precompiled.artifact
            if artifact.given != "pair":
                env["code_hash"] = str(precompiled.code_hash)
            env.update({
                "format": precompiled.format,
                "version": str(precompiled.version),
                "backend": str(precompiled.backend),
                "pairs": {True: "yes", False: "no", None: "unknown"}[artifact.pairs],
                "artifact": "None" if mega is None else f"Mega-Cache {mega.blob.size} bytes sha256 {mega.blob.sha256}",
            })
        if mega is not None:
            env["mega_cache.encoding_version"] = str(mega.encoding_version)
            out["entries"] = _entries(mega)
        out["envelope"] = env
    elif artifact.cache.upstream is not None:
        upstream = artifact.cache.upstream
        env = {"kind": artifact.cache.kind}
        for scan in upstream.pickles:
            env.update({f"{scan.member}: {field.key}": field.summary for field in scan.fields})
            for imp in scan.flagged:
                env[f"{scan.member}: imports {imp.module}.{imp.name}"] = imp.risk
        out["envelope"] = env
        out["bundle"] = {member.name: f"zip member {member.size} bytes" for member in upstream.members}
    elif artifact.cache.kind not in ("missing", "absent"):
        out["envelope"] = {"kind": artifact.cache.kind}
    code = artifact.python_code.upstream
    if code is not None:
        out["metadata"] = {literal.name: literal.value for literal in code.literals}
    return {section: {mask_process_ids(k): mask_process_ids(v) for k, v in values.items()} for section, values in out.items()}


def _entries(mega: MegaCache) -> dict[str, str]:
    """A Mega-Cache entry by entry, keyed by (kind, key): its content, and what its pickle would import."""
    out = {}
    for entry in mega.entries:
        value = f"{entry.content} {entry.file.size} bytes sha256 {entry.file.sha256}"
        if entry.scan is not None:
            value += "; imports " + (", ".join(f"{i.module}.{i.name} ({i.risk})" for i in entry.scan.imports) or "nothing")
        out[f"{entry.kind} {entry.key}"] = value
    return out


def _code_sections(data: bytes | None) -> dict[str, list[str]]:
    """Each section of python_code by its slug, as `code_lines` compares it; {} when not text."""
    if data is None:
        return {}
    try:
        source = decode_source(data)
    except PrecompileError:
        return {}
    return {section.slug: compared_lines(text, opaque=section.slug.startswith("opaque"))
            for section, text in split_sections(source)}


def _code_diffs(a_code: bytes | None, b_code: bytes | None, context: int) -> list[CodeDiff]:
    """The sections that differ, each a unified diff; past MAX_CHANGED_LINES in all, lines are counted, not shown."""
    ca, cb = _code_sections(a_code), _code_sections(b_code)
    room = MAX_CHANGED_LINES
    code: list[CodeDiff] = []
    for slug in [*ca, *(slug for slug in cb if slug not in ca)]:
        left, right = ca.get(slug), cb.get(slug)
        if left == right:
            continue
        shown = unified(left or [], right or [], f"a/{slug}", f"b/{slug}", context=context, max_lines=room)
        room -= shown.shown
        change = "removed" if right is None else "added" if left is None else "changed"
        code.append(CodeDiff(section=slug, change=change, lines=shown.lines, lines_not_shown=shown.left_out))
    return code


def diff(a: Artifact, b: Artifact, a_code: bytes | None, b_code: bytes | None, *, context: int = 3) -> DiffReport:
    fa, fb = flatten(a), flatten(b)
    entries: list[DiffEntry] = []
    for section in SECTIONS:
        left, right = fa[section], fb[section]
        for key in sorted(set(left) | set(right)):
            if key not in right:
                entries.append(DiffEntry(section=section, key=key, change="removed", a=left[key]))
            elif key not in left:
                entries.append(DiffEntry(section=section, key=key, change="added", b=right[key]))
            elif left[key] != right[key]:
                entries.append(DiffEntry(section=section, key=key, change="changed", a=left[key], b=right[key]))
    code = _code_diffs(a_code, b_code, context)
    problems = tuple(
        p for art in (a, b) for p in (art.python_code.problem, art.cache.problem) if p is not None
    )
    return DiffReport(
        a=a.python_code.path or a.cache.path,
        b=b.python_code.path or b.cache.path,
        equal=not entries and not code,
        entries=tuple(entries),
        python_code=tuple(code),
        problems=problems,
    )
