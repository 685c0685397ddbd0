"""Semantic diff of two artifacts, keyed by identity (names, paths, field names), not position.

Sections come in a fixed order, most meaningful first: guards, inputs, outputs, params, buffers,
metadata, envelope, bundle, entries (a Mega-Cache's, entry by entry); then a unified diff of
python_code section by section, every line of every section, opaque ones included (`code_lines`).
Names Dynamo mints per process (graph uuids, continuation counters) are masked throughout, and
nothing else, so two captures of the same code in two processes compare equal.
"""
from __future__ import annotations

import re

from precompile.artifact.bundle_keys import provenance as bundle_provenance
from precompile.artifact.bundle_keys import requirements
from precompile.artifact.codec import CacheFormatError
from precompile.artifact.envelope import CacheEnvelope
from precompile.artifact.metadata import ConstantLeaf, DynamoMetadata, MakeFxMetadata
from precompile.artifact.pycode import decode_source
from precompile.artifact.summary import without_object_ids
from precompile.errors import PrecompileError
from precompile.inspect.diff import positions
from precompile.inspect.diff.code_lines import compared_lines
from precompile.inspect.diff.kernels import kernel_diffs
from precompile.inspect.diff.library_code import code_digest
from precompile.inspect.diff.line_diff import unified
from precompile.inspect.diff.process_ids import mask_artifact_names, mask_process_ids
from precompile.inspect.model.artifact import Artifact, MegaCache, UpstreamCache
from precompile.inspect.model.report import Change, CodeDiff, DiffEntry, DiffReport, KernelDiff
from precompile.inspect.parsing.rendered_guards import global_state_rows, shape_text
from precompile.inspect.parsing.sections import split_sections
from precompile.inspect.reading.bundle_payload import bundle_files
from precompile.inspect.reading.frames import frame_label, frame_role, frame_served
from precompile.inspect.reading.guards import guards_of, readable_source, rendered_lines
from precompile.inspect.verify.bytecode_proof import NOT_PROVEN
from precompile.inspect.verify.verify import prepared_checks
from precompile.signing.envelope import Signature, read_signature, signature_path

SECTIONS = ("guards", "inputs", "outputs", "params", "buffers", "metadata", "envelope", "bundle", "entries")
CATEGORIES = ("guards", "calling-convention", "params", "graph", "kernels", "versions", "code", "metadata")
"""What a difference is about, for `--stat` and `--fail-on`: a release gate names the ones it cares for."""
_VERSION_KEYS = ("FORMAT_VERSION", "TORCH_VERSION", "PYTHON_VERSION", "format_version", "producer.", "signed by")
_CALLING_CONVENTION_KEYS = ("FN_NAME", "NUM_POSITIONAL_ARGS", "MODULE_POSITIONS", "MODULE_KEYWORDS", "IN_SPEC", "OUT_SPEC", "GRAD_PARAMS", "FRAMES ")
_PREPARED_KEYS = ("python_code bytecode", "python_code typed metadata")
_BINARY_KINDS = {"kernel": "kernel-source", "isa-probe": "isa-probe-source"}
_READ_KINDS = ("global_state", "attribute", "global", "closure")
MAX_CHANGED_LINES = 2000
"""Changed lines shown of the python_code diff, all sections together; the rest are counted."""


def _leaf(leaf) -> str:
    if isinstance(leaf, ConstantLeaf):
        return f"constant {leaf.value!r}"
    return f"tensor {shape_text(leaf.shape)} {leaf.dtype} {leaf.device}"


def code_category(slug: str) -> str:
    """The category of a python_code section that differs: a captured graph (`graph`, Dynamo's
    `graph-N`: its operations and constants, what a served call computes) is `graph`, whichever
    tracer or serving mode wrote it; every other section is `code`."""
    return "graph" if slug == "graph" or slug.startswith("graph-") else "code"


def category(section: str, key: str) -> str:
    """The category of a difference in `section` at `key` (see CATEGORIES)."""
    if section == "guards":
        return "guards"
    if section in ("inputs", "outputs"):
        return "calling-convention"
    if section in ("params", "buffers"):
        return "params"
    if section in ("bundle", "entries"):
        return "kernels"
    if key.startswith(_PREPARED_KEYS):
        return "code"
    if key.startswith(_VERSION_KEYS) or key.startswith("bundle.keys."):
        return "versions"
    if section == "metadata" and key.startswith(_CALLING_CONVENTION_KEYS):
        return "calling-convention"
    return "kernels" if key.startswith("bundle.") else "metadata"


def _bundle_entries(bundle, files: dict[str, bytes], provenance: bool) -> dict[str, str]:
    """The bundle's files keyed by content, not by the hashed names a build gives them: a source by its
    sha256, a library by the source it was built from, with what it runs (its loaded sections'
    digest, `library_code`: two builds of one source agree on it, a library built from anything else
    does not; the whole file's sha256 is provenance); then the kernel map entry by entry, each source
    with the library load would run for it (`files`: the bundle's, {} where they cannot be read)."""
    by_path = {f.path: f for f in bundle.files}
    out, names = {}, {}
    for f in bundle.files:
        source = by_path.get(f.path[: -len(".so")] + ".cpp") if f.kind in _BINARY_KINDS else None
        if source is not None:
            names[f.path] = f"{f.kind} built from source sha256 {source.sha256}"
            runs = code_digest(files[f.path]) if f.path in files else "unreadable (precompile verify says why)"
            out[names[f.path]] = runs + (f"; file sha256 {f.sha256}" if provenance else "")
        else:
            names[f.path] = f"{f.kind} {f.path.rsplit('.', 1)[-1] if '.' in f.path else ''} sha256 {f.sha256}".replace("  ", " ")
            out[names[f.path]] = f"{f.size} bytes"
    for digest, path in bundle.kernels.items():
        out[f"kernel map: source sha256 {digest}"] = names.get(path, f"{path} (not in the bundle)")
    return out


def _bundle_or_none(artifact: Artifact) -> dict[str, bytes] | None:
    """The bundle's files by path; None when the payload cannot be read (the diff's problems, and
    `verify`, say why)."""
    try:
        return bundle_files(artifact.cache)
    except (CacheFormatError, PrecompileError):
        return None


def _agrees(artifact: Artifact) -> dict[str, str]:
    """Whether the bytecode and typed metadata the cache carries, which load uses in place of
    python_code's, are python_code's (`verify`'s proof, one line each): a cache resealed around other
    bytecode is a difference in `code` even where python_code is byte-identical."""
    out = {}
    for check in prepared_checks(artifact):
        if check.status == "ok":
            out[check.name] = "agrees with python_code"
        elif check.status == "skip":
            out[check.name] = "not used by load: " + check.message
        elif check.actual == NOT_PROVEN:
            out[check.name] = "not proven to agree with python_code (precompile verify says why)"
        elif check.actual is not None:  # compiled by another Python: this one cannot prove it either way
            out[check.name] = f"compiled by a Python with magic number {check.expected}: not comparable on this Python"
        else:
            out[check.name] = "DIFFERS from python_code: load would use it in place of python_code (precompile verify)"
    return out


def flatten(artifact: Artifact, code: bytes | None = None, *, provenance: bool = False,
            files: dict[str, bytes] | None = None) -> dict[str, dict[str, str]]:
    """{section: {identity: value text}} of everything compared (`code`: python_code's bytes, for
    what its rendered guards check; `provenance`: where and how it was built, too)."""
    out: dict[str, dict[str, str]] = {name: {} for name in SECTIONS}
    out.update(_python_code(artifact))
    for section, values in _guards(artifact, code).items():
        out[section] = {**out.get(section, {}), **values}
    out.update(_cache(artifact, provenance, (_bundle_or_none(artifact) or {}) if files is None else files))
    meta = artifact.python_code.metadata
    numbers = positions.resume_numbers(" ".join(f"{f.name} {f.qualname}" for f in meta.frames)) if isinstance(meta, DynamoMetadata) else {}

    def masked(text: str) -> str:
        return positions.resumes_numbered(_masked(text), numbers)

    return {section: {masked(k): masked(v) for k, v in values.items()} for section, values in out.items()}


def _guards(artifact: Artifact, code: bytes | None) -> dict[str, dict[str, str]]:
    """Each guard slot and what becomes of it in each variant, with what it checks (keyed by the slot
    alone, so a guard one capture kept and another dropped is one change); sorted into sections by
    what it guards, as a MakeFx artifact's literals are: a tensor guard on a parameter or buffer in
    `params`/`buffers` (by its dotted name), on an argument in `inputs`; GLOBAL_STATE one entry per
    field it checks; a MakeFx trace's reads in `guards`."""
    out: dict[str, dict[str, str]] = {"guards": {}, "inputs": {}, "params": {}, "buffers": {}}
    guards = guards_of(artifact, code)
    if guards is None:
        return out
    meta = artifact.python_code.metadata
    readable = readable_source(meta, code, rendered_lines(artifact, code)) if isinstance(meta, DynamoMetadata) else (code, None)
    global_state = global_state_rows(*readable) if guards.has_guards else {}
    frame_index = {frame.qualname or frame.name: index for index, frame in enumerate(_frames(artifact))}
    verdicts: dict[tuple[str, str], set[str]] = {}
    for frame in guards.frames:
        for slot in frame.slots:
            where = slot.status if slot.status != "kept" else f"kept in {frame.frame}#{frame.variant}"
            state = global_state.get((frame_index.get(frame.frame, -1), frame.variant))
            if slot.guard_type == "GLOBAL_STATE" and slot.status == "kept" and state is not None:
                for field, value in state.items():
                    verdicts.setdefault(("guards", f"GLOBAL_STATE {field}"), set()).add(f"{where}: {value}")
                continue
            checked = _guard_key(slot.guard_type, slot.source) if slot.status == "kept" and slot.check else None
            if checked is not None and checked[0] != "guards":  # a tensor's metadata, beside the slot's fate
                verdicts.setdefault(checked, set()).add(f"{where}: {slot.check}")
                verdicts.setdefault(("guards", f"{slot.guard_type} {slot.source}"), set()).add(where)
                continue
            check = without_object_ids(slot.check) if slot.status != "kept" else slot.check
            verdicts.setdefault(("guards", f"{slot.guard_type} {slot.source}".strip()), set()).add(f"{where}: {check}" if check else where)
    for (section, key), values in verdicts.items():
        out[section][key] = ", ".join(sorted(values))
    for spec in guards.specializations:  # a MakeFx trace's reads: what its driver checks besides the call
        if spec.kind in _READ_KINDS:
            out["guards"][f"{spec.kind} {spec.path}"] = spec.value + (" (not checked)" if spec.risky else "")
    return out


def _frames(artifact: Artifact) -> tuple:
    meta = artifact.python_code.metadata
    return meta.frames if isinstance(meta, DynamoMetadata) else ()


_MODULE_TENSOR = re.compile(r"\._(parameters|buffers)\[(['\"])(.*?)\2\]$")
_SUBMODULE = re.compile(r"\._modules\[(['\"])(.*?)\1\]|\.([A-Za-z_]\w*)")


def _guard_key(guard_type: str, source: str) -> tuple[str, str]:
    """(section, key) of what a kept guard slot checks: a tensor guard on
    `m._modules['fc']._parameters['weight']` is parameter `fc.weight` in `params` (as MakeFx names
    it), one on an argument of the captured function is that input in `inputs`; every other slot is
    `TYPE source` in `guards`."""
    if guard_type == "TENSOR_MATCH":
        tensor = _MODULE_TENSOR.search(source)
        root = re.match(r"[A-Za-z_]\w*", source)
        if tensor is not None and root is not None:
            path = source[root.end():tensor.start()]
            names = [m.group(2) or m.group(3) for m in _SUBMODULE.finditer(path)]
            if "".join(m.group(0) for m in _SUBMODULE.finditer(path)) == path:
                return "params" if tensor.group(1) == "parameters" else "buffers", ".".join([*names, tensor.group(3)])
        if root is not None and not source.startswith("___"):
            return "inputs", source
    return "guards", f"{guard_type} {source}".strip()


def _header(meta: DynamoMetadata | MakeFxMetadata, tracer: str) -> dict[str, str]:
    """The metadata literals every artifact of this project has, whichever tracer wrote it."""
    return {
        "FORMAT_VERSION": str(meta.format_version),
        "TRACER": tracer,
        "BACKEND": meta.backend,
        "SERVING_MODE": meta.serving_mode,
        "TORCH_VERSION": meta.torch_version,
        "PYTHON_VERSION": ".".join(map(str, meta.python_version)),
        "FN_NAME": meta.fn_name,
    }


def _python_code(artifact: Artifact) -> dict[str, dict[str, str]]:
    """The sections python_code's metadata fills: the calling convention, parameters and buffers of a
    MakeFx artifact, the frames and summary of a Dynamo one, an upstream artifact's literals."""
    out: dict[str, dict[str, str]] = {}
    meta = artifact.python_code.metadata
    if isinstance(meta, DynamoMetadata):
        out["metadata"] = {
            **_header(meta, "dynamo"),
            "SUMMARY": str(meta.summary),
            # How each frame is reached is its calling convention; where its code sits (a comment added
            # above it moves it) is not, and neither are the lines of an inlined source whose text is the same.
            **{f"FRAMES {frame_label(f)}": f"{frame_served(f)}, {frame_role(f, with_line=False)}" for f in meta.frames},
            **{f"FRAME_LINES {frame_label(f)}": f"line {f.first_line}" for f in meta.frames if f.first_line},
            **_inlined_sources(meta.inlined_sources),
        }
    if isinstance(meta, MakeFxMetadata):
        out["inputs"] = {leaf.path: _leaf(leaf) for leaf in meta.inputs}
        out["outputs"] = {leaf.path: _leaf(leaf) for leaf in meta.outputs}
        out["params"] = {t.name: f"{shape_text(t.shape)} {t.dtype} {t.device}" for t in meta.params}
        out["buffers"] = {t.name: f"{shape_text(t.shape)} {t.dtype} {t.device}" for t in meta.buffers}
        grads = [meta.params[i].name if 0 <= i < len(meta.params) else f"#{i}" for i in meta.grad_param_indices]
        out["metadata"] = {
            **_header(meta, "make_fx"),
            "NUM_POSITIONAL_ARGS": str(meta.num_positional_args),
            "MODULE_POSITIONS": str(tuple(meta.module_positions)),
            **({"MODULE_KEYWORDS": str(tuple(meta.module_keywords))} if meta.module_keywords else {}),
            "IN_SPEC": meta.in_spec,
            "OUT_SPEC": meta.out_spec,
            "GRAD_PARAMS": ", ".join(grads) or "(none)",
            **_inlined_sources(meta.inlined_sources),  # the code the trace ran, by its text
        }
    if isinstance(meta, (DynamoMetadata, MakeFxMetadata)) and meta.world is not None:
        world = meta.world
        groups = "; ".join(f"{g.name} ranks {list(g.ranks)}" for g in world.groups)
        out["metadata"]["WORLD"] = f"size {world.size}, backend {world.backend}, groups {groups}, collectives {', '.join(world.collectives)}"
    upstream_code = artifact.python_code.upstream
    if upstream_code is not None:
        out["metadata"] = {literal.name: literal.value for literal in upstream_code.literals}
    return out


def _precompile_cache(artifact: Artifact, envelope: CacheEnvelope, provenance: bool, files: dict[str, bytes]) -> dict[str, dict[str, str]]:
    """A precompile cache's sections: its envelope, and its bundle's entries."""
    out: dict[str, dict[str, str]] = {}
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
        env.update({f"bundle.keys.{k}": v for k, v in requirements(bundle.keys).items()})
        if provenance:
            env.update({f"bundle.provenance.{k}": v for k, v in bundle_provenance(bundle.keys, bundle.provenance).items()})
            env["bundle.payload_size"] = str(bundle.payload_size)
            env["bundle.payload_compressed_size"] = str(bundle.payload_compressed_size)
            env["bundle.payload_sha256"] = bundle.payload_sha256 or "(none)"
        out["bundle"] = _bundle_entries(bundle, files, provenance)
    if artifact.given == "pair":
        env.update(_agrees(artifact))
        env["signed by"] = _signer(artifact.python_code.path)
    out["envelope"] = env
    return out


def _signer(python_code: str) -> str:
    """Who signed the pair, as its signature file names the key (not checked here: `verify
    --trusted-key` checks it); a release signed by another key is a difference a serving host that
    trusts one key sees. The release number it states is left out: it changes with every release."""
    try:
        signature = read_signature(signature_path(python_code))
    except PrecompileError:  # its message names this machine's path: the same trouble diffs equal
        return "an unreadable signature (precompile verify says why)"
    if signature is None:
        return "unsigned"
    if isinstance(signature, Signature):
        return f"key {signature.key}"
    return "key " + ", ".join(sorted(s.keyid or "(no key id)" for s in signature.signatures))


def _mega_cache_holder(artifact: Artifact, upstream: UpstreamCache) -> dict[str, dict[str, str]]:
    """The sections of an upstream precompile cache or a bare Mega-Cache: its fields, and the Mega-Cache's entries."""
    out: dict[str, dict[str, str]] = {}
    env: dict[str, str] = {"kind": artifact.cache.kind}
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
            "tracer": str(precompiled.tracer),
            "pairs": {True: "yes", False: "no", None: "unknown"}[artifact.pairs],
            "artifact": "None" if mega is None else f"Mega-Cache {mega.blob.size} bytes sha256 {mega.blob.sha256}",
        })
    if mega is not None:
        env["mega_cache.encoding_version"] = str(mega.encoding_version)
        out["entries"] = _entries(mega)
    out["envelope"] = env
    return out


def _foreign_pickles(kind: str, upstream: UpstreamCache) -> dict[str, dict[str, str]]:
    """The sections of another upstream cache (a torch.save zip, a bare pickle): its pickles' fields and
    flagged imports, and its zip members."""
    env: dict[str, str] = {"kind": kind}
    for scan in upstream.pickles:
        env.update({f"{scan.member}: {field.key}": field.summary for field in scan.fields})
        for imp in scan.flagged:
            env[f"{scan.member}: imports {imp.module}.{imp.name}"] = imp.risk
    return {"envelope": env, "bundle": {member.name: f"zip member {member.size} bytes" for member in upstream.members}}


def _cache(artifact: Artifact, provenance: bool, files: dict[str, bytes]) -> dict[str, dict[str, str]]:
    """The sections the cache fills: its envelope and bundle, or a foreign cache's fields and entries."""
    cache = artifact.cache
    if cache.envelope is not None:
        return _precompile_cache(artifact, cache.envelope, provenance, files)
    if cache.upstream is not None and (cache.upstream.precompile or cache.upstream.mega_cache):
        return _mega_cache_holder(artifact, cache.upstream)
    if cache.upstream is not None:
        return _foreign_pickles(cache.kind, cache.upstream)
    if cache.kind not in ("missing", "absent"):
        return {"envelope": {"kind": cache.kind}}
    return {}


def _inlined_sources(sources) -> dict[str, str]:
    """Each inlined source by its module and code's sha256 (the second of the same code counted): its
    tokens' where capture hashed them (a comment, a blank line or spacing changed is the same code),
    else its text's; with the lines it sat on as the value: moved, it changed place, not what it does.
    (Against an artifact written before token hashes, every source is keyed otherwise: removed, added.)"""
    out: dict[str, str] = {}
    for source in sources:
        key = f"INLINED_SOURCES {source.module} {source.token_sha256 or source.sha256}"
        while key in out:
            key += "+"
        out[key] = f"lines {source.first_line}-{source.last_line}"
    return out


def _masked(text: str) -> str:
    return mask_artifact_names(mask_process_ids(text))


def _entries(mega: MegaCache) -> dict[str, str]:
    """A Mega-Cache entry by entry, keyed by (kind, key): its content, and what its pickle would import."""
    out = {}
    for entry in mega.entries:
        value = f"{entry.content} {entry.file.size} bytes sha256 {entry.file.sha256}"
        if entry.scan is not None:
            value += "; imports " + (", ".join(f"{i.module}.{i.name} ({i.risk})" for i in entry.scan.imports) or "nothing")
        out[f"{entry.kind} {entry.key}"] = value
    return out


def _code_sections(data: bytes | None) -> dict[str, str]:
    """Each section's text of python_code by its slug; {} when not text."""
    if data is None:
        return {}
    try:
        source = decode_source(data)
    except PrecompileError:
        return {}
    return {section.slug: text for section, text in split_sections(source)}


def _code_diffs(a_code: bytes | None, b_code: bytes | None, context: int) -> list[CodeDiff]:
    """The sections that differ as `code_lines` compares them, each a unified diff; past
    MAX_CHANGED_LINES in all, lines are counted, not shown. Sections of the same text are not compared."""
    ta, tb = _code_sections(a_code), _code_sections(b_code)
    na, nb = (positions.resume_numbers("\n".join(sections.values())) for sections in (ta, tb))
    room = MAX_CHANGED_LINES
    code: list[CodeDiff] = []
    for slug in [*ta, *(slug for slug in tb if slug not in ta)]:
        if ta.get(slug) == tb.get(slug):
            continue
        left, right = (compared_lines(positions.compared(text, numbers), opaque=slug.startswith("opaque"))
                       if text is not None else None for numbers, text in ((na, ta.get(slug)), (nb, tb.get(slug))))
        if left == right:
            continue
        shown = unified(left or [], right or [], f"a/{slug}", f"b/{slug}", context=context, max_lines=room)
        room -= shown.shown
        change: Change = "removed" if right is None else "added" if left is None else "changed"
        code.append(CodeDiff(section=slug, change=change, lines=shown.lines, lines_not_shown=shown.left_out))
    return code


def diff(a: Artifact, b: Artifact, a_code: bytes | None, b_code: bytes | None, *, context: int = 3,
         provenance: bool = False) -> DiffReport:
    """The semantic diff of two opened artifacts, given their python_code bytes (None: unreadable);
    `precompile.inspect.diff_report` reads those itself."""
    problems = tuple(
        p for art in (a, b) for p in (art.python_code.problem, art.cache.problem) if p is not None
    )
    files = (_bundle_or_none(a), _bundle_or_none(b))  # read once, for the bundle entries and the kernels' sources
    return compare_flattened(
        a.python_code.path or a.cache.path, b.python_code.path or b.cache.path,
        flatten(a, a_code, provenance=provenance, files=files[0] or {}),
        flatten(b, b_code, provenance=provenance, files=files[1] or {}), a_code, b_code,
        context=context, problems=problems, kernels=kernel_diffs(a, b, a_code, b_code, files, context=context),
        unpaired=tuple(side for side, art in (("a", a), ("b", b)) if art.pairs is False),
    )


def compare_flattened(a: str, b: str, fa: dict[str, dict[str, str]], fb: dict[str, dict[str, str]],
                      a_code: bytes | None, b_code: bytes | None, *, context: int = 3, problems: tuple[str, ...] = (),
                      kernels: tuple[KernelDiff, ...] = (), unpaired: tuple[str, ...] = ()) -> DiffReport:
    """The diff of two artifacts already flattened (`flatten`; a section missing from one is empty) and
    their python_code bytes, named `a` and `b`: what `diff` reports, for a caller that kept only those
    (a snapshot of the normalized sections)."""
    entries: list[DiffEntry] = []
    moved: list[DiffEntry] = []
    for section in SECTIONS:
        left, right = fa.get(section, {}), fb.get(section, {})
        for key in sorted(set(left) | set(right)):
            if key not in right:
                entries.append(DiffEntry(section=section, key=key, change="removed", a=left[key]))
            elif key not in left:
                entries.append(DiffEntry(section=section, key=key, change="added", b=right[key]))
            elif left[key] != right[key]:
                (moved if positions.is_move(key) else entries).append(
                    DiffEntry(section=section, key=key, change="changed", a=left[key], b=right[key]))
    code = _code_diffs(a_code, b_code, context)
    counts = {name: 0 for name in CATEGORIES}
    for entry in entries:
        counts[category(entry.section, entry.key)] += 1
    for section_diff in code:
        counts[code_category(section_diff.section)] += 1
    return DiffReport(
        a=a,
        b=b,
        equal=not entries and not code,
        categories={name: count for name, count in counts.items() if count},
        entries=tuple(entries),
        moved=tuple(moved),
        python_code=tuple(code),
        problems=problems,
        kernels=kernels,
        unpaired=unpaired,
    )


def gate_failures(report: DiffReport, fail_on: tuple[str, ...] | None) -> tuple[str, ...]:
    """The categories that fail the gate: those `fail_on` names (every one, without it) that differ,
    or, where a side's cache is not its python_code's (`unpaired`), every category the gate names."""
    gated = CATEGORIES if fail_on is None else fail_on
    if report.unpaired:
        return tuple(gated)
    return tuple(name for name in gated if report.categories.get(name))
