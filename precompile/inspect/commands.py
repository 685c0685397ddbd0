"""The inspect verbs of the `precompile` command: show, guards, diff, verify, extract, report, schema.

`register(verbs)` adds them to the CLI's subparsers. Every verb takes an artifact as
PYTHON_CODE CACHE, a directory holding one pair, or a prefix DIR/NAME (show, diff and extract also
one file alone, of any kind `reader.open_one` tells by content; guards says a bare Mega-Cache is not
supported, verify judges its container and scans as show does, and with --host whether this host
would hit it); has `--json`; prints data on
stdout and diagnostics on stderr; and exits 0 (clean), 1 (a finding: different, failed check,
unpaired or flagged) or 2 (trouble: a file is unreadable, undecodable, foreign or newer than
understood, or an option is wrong). With `--json`, stdout always holds one JSON object: the verb's
report, or, where trouble leaves no report to make, an `ErrorReport` naming the error (which
stderr prints too). docs/inspect.md has the table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from precompile.artifact.pair import pending_path
from precompile.artifact.pickle_scan import finding_text
from precompile.errors import PrecompileError
from precompile.inspect.formats.mega_cache_runs import run_finding
from precompile.inspect.model.artifact import Artifact
from precompile.inspect.reading.reader import (
    given_pair,
    is_mega_cache_file,
    open_artifact,
    open_given,
    open_one,
    python_code_bytes,
    resolve_pair,
)
from precompile.inspect.render import render_text
from precompile.inspect.render.terminal_text import printable

ARTIFACT_HELP = ("the artifact: PYTHON_CODE CACHE, a directory holding one pair, or a prefix DIR/NAME; each a path or an "
                 "fsspec URL (s3://, gs://, https://, hf://, file://; needs precompile[remote])")
ONE_FILE_HELP = (f"{ARTIFACT_HELP}; or one file alone of any kind known (told by content): a precompile or upstream "
                 "torch.compiler.precompile cache, a Mega-Cache blob, a bare pickle, python_code")


def _artifact(paths: list[str], *, deep: bool = False, prove: bool = False, proof_memory_mib: int | None = None) -> Artifact:
    python_code, cache = resolve_pair(paths)
    return open_artifact(python_code, cache, deep=deep, prove=prove, proof_memory_mib=proof_memory_mib)


def _emit(args, out, report, lines) -> None:
    if args.json:
        from precompile.inspect.model.report import encode

        out.file.write(encode(report))
        out.file.flush()
        return
    if not lines:
        return
    if out.no_color or not out.is_terminal:
        out.file.write("".join(f"{printable(text)}\n" for text, _ in lines))
        out.file.flush()
        return
    from rich.text import Text

    block = Text()
    for text, style in lines:
        block.append(printable(text), style=style)
        block.append("\n")
    block.rstrip()
    out.print(block, markup=False, highlight=False, emoji=False)


def _diagnose(err, problems, warnings=()) -> None:
    for problem in problems:
        err.print(printable(f"precompile: error: {problem}"), markup=False, highlight=False, emoji=False)
    for warning in warnings:
        err.print(printable(f"precompile: warning: {warning}"), markup=False, highlight=False, emoji=False)


def _findings(artifact: Artifact) -> tuple[str, ...]:
    from precompile.inspect.api import opaque_findings, pairing_findings

    found = list(pairing_findings(artifact))
    members: dict[tuple[str, str, str | None], list[str]] = {}
    for member, imp in artifact.flagged_imports:  # one line per import (and why, if it is a call), however many members perform it
        members.setdefault((f"{imp.module}.{imp.name}", imp.risk, imp.unresolved), []).append(member)
    for (name, risk, why), where in members.items():
        shown = ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "")
        found.append(f"{artifact.cache.path}: {_plural(len(where), 'pickle')} ({shown}) would import {name} ({risk}) if unpickled"
                     + (f": {why}" if why else ""))
    found.extend(f"{artifact.cache.path}: {finding_text(scan, None)}" for scan, imp in artifact.cache_findings if imp is None)
    if artifact.cache.upstream is not None:
        found.extend(f"{artifact.cache.path}: {run_finding(entry, run)}" for entry, run in artifact.cache.upstream.run_findings)
    pending = pending_path(Path(artifact.cache.path)) if artifact.cache.path else None
    if pending is not None and os.path.lexists(pending):
        found.append(f"{pending} exists (left by an interrupted write): load adopts it over the cache when the cache does "
                     "not pair and it passes every check; verify it as the cache, or delete it")
    return tuple(found) + opaque_findings(artifact)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _verdict(problems: tuple[str, ...], findings: tuple[str, ...]) -> str:
    """show's last line: whether the input is readable, and its findings counted."""
    if problems:
        return f"verdict: trouble ({_plural(len(problems), 'problem')}, {_plural(len(findings), 'finding')})"
    return f"verdict: {_plural(len(findings), 'finding')}" + (" (see the warnings)" if findings else ": nothing flagged")


def _show(args, out, err) -> int:
    from precompile.inspect.api import show_report

    artifact = open_given(args.artifact)
    report = show_report(artifact)
    problems, findings = report.problems, _findings(artifact)
    signed = _signature_line(artifact) if not args.json else []
    lines = render_text.render_show(report) + signed + [(_verdict(problems, findings), None)] if not args.json else ()
    _emit(args, out, report, lines)
    _diagnose(err, problems, findings)
    return 2 if problems else 1 if findings else 0


def _signature_line(artifact: Artifact) -> list:
    """show's line on the pair's signature file, when there is one: the identity it says it binds (name,
    release, created, signer key id), not checked (verify --trusted-key checks it)."""
    from precompile.signing.pair import check_pair

    if artifact.given == "cache" or not artifact.python_code.path:
        return []
    verdict = check_pair(artifact.python_code.path, artifact.cache.path or "", None)
    return [] if verdict.message.startswith("unsigned") else [(f"signature: {verdict.message}", None)]


def _mega_cache_alone(paths: list[str], verb: str, remedy: str) -> str | None:
    """The path when the one file given is a bare Mega-Cache blob; raises for a verb that cannot read one."""
    if len(paths) != 1 or not is_mega_cache_file(paths[0]):
        return None
    if remedy:
        raise PrecompileError(f"{verb} is not supported for Mega-Cache {paths[0]}: {remedy}")
    return paths[0]


def _guards(args, out, err) -> int:
    from precompile.inspect.api import guards_report

    _mega_cache_alone(args.artifact, "guards", (
        "it holds no guards (torch looks its entries up by cache key when a compile asks for them; its PGO entries, if any, "
        "record automatic-dynamic sizes); `precompile show` lists its entries and kernels"))
    report = guards_report(_artifact(args.artifact), frame=args.frame, kind=args.type, risky_only=args.risky)
    _emit(args, out, report, render_text.render_guards(report) if not args.json else ())
    _diagnose(err, report.problems, report.findings)
    return 2 if report.guards is None or report.problems else 1 if report.findings else 0


def _diff(args, out, err) -> int:
    from precompile.inspect.api import diff_report
    from precompile.inspect.verify.verify import start_proofs

    if len(args.paths) not in (2, 4):
        raise PrecompileError(f"diff compares two artifacts: A B, or A.py A.cache B.py B.cache; got {len(args.paths)} paths")
    sides = [args.paths[:1], args.paths[1:]] if len(args.paths) == 2 else [args.paths[:2], args.paths[2:]]
    pairs = [given_pair(side) if len(args.paths) == 2 else resolve_pair(side) for side in sides]
    start_proofs(pair for pair in pairs if pair is not None)  # beside the reading of either artifact
    a, b = (open_artifact(*pair) if pair is not None else open_one(side[0]) for pair, side in zip(pairs, sides))
    fail_on = _fail_on(args.fail_on)
    output = _diff_format(args)
    report = diff_report(a, b, context=args.context, provenance=args.provenance)
    if output == "markdown":
        from precompile.inspect.render.render_markdown import render_markdown

        out.file.write(render_markdown(report, stat=args.stat, fail_on=fail_on))
        out.file.flush()
    else:
        _emit(args, out, report, render_text.render_diff(report, stat=args.stat, fail_on=fail_on) if output == "text" else ())
    if args.junit is not None:
        from precompile.inspect.render.junit import write_junit

        write_junit(args.junit, report, fail_on)
    _diagnose(err, report.problems)
    if report.problems:
        return 2
    if fail_on is not None:
        from precompile.inspect.diff.diff import gate_failures

        return 1 if gate_failures(report, fail_on) else 0
    return 0 if report.equal and not report.unpaired else 1


def _diff_format(args) -> str:
    """diff's output format: --format, with --json its shorthand for `--format json` (naming two is an error)."""
    if args.json and args.format not in (None, "json"):
        raise PrecompileError(f"--json and --format {args.format} ask for two outputs: pass one of them")
    args.json = args.json or args.format == "json"
    return "json" if args.json else args.format or "text"


def _fail_on(value: str | None) -> tuple[str, ...] | None:
    """The categories of `--fail-on a,b`, each one of diff's CATEGORIES."""
    from precompile.inspect.diff.diff import CATEGORIES

    if value is None:
        return None
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in names if name not in CATEGORIES]
    if unknown or not names:
        raise PrecompileError(f"--fail-on {value!r}: {', '.join(unknown) or 'no category'} is not one of {', '.join(CATEGORIES)}")
    return names


def _verify(args, out, err) -> int:
    from precompile.inspect.api import verify_report

    if _mega_cache_alone(args.artifact, "verify", ""):
        return _verify_mega_cache(args, out, err)
    artifact = _artifact(args.artifact, deep=True, prove=True, proof_memory_mib=args.proof_memory)
    report = verify_report(artifact, host=args.host, trusted_keys=_trusted_keys(args.trusted_key),
                           expect=_expectations(args.expect_name, args.min_release), proof_memory_mib=args.proof_memory)
    _emit(args, out, report, render_text.render_verify(report, verbose=args.verbose) if not args.json else ())
    failed = [f"{c.name}: {c.message}" for c in report.checks if c.status == "fail"]
    # a file that cannot be read as a precompile artifact at all is trouble (2), as `show` says;
    # one read whose checks fail is a finding (1)
    trouble = artifact.python_code.problem is not None or artifact.cache.problem is not None or artifact.cache.newer
    _diagnose(err, failed if trouble else (), () if trouble else failed)
    return 2 if trouble else 0 if report.ok else 1


def _mib(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of MiB (1 or more)")
    return int(text)


def _verify_mega_cache(args, out, err) -> int:
    """verify of a bare Mega-Cache: the container and each entry's scan (what `show` judges), and with
    --host whether this host would hit its entries; it has nothing to pair or sign."""
    from precompile.inspect.verify.mega_cache_host import mega_cache_host_report

    if args.trusted_key:
        raise PrecompileError(f"--trusted-key: Mega-Cache {args.artifact[0]} carries no signature; verify it without the flag")
    report = mega_cache_host_report(open_given(args.artifact), host=args.host)
    _emit(args, out, report, render_text.render_verify(report, verbose=args.verbose) if not args.json else ())
    _diagnose(err, (), [f"{c.name}: {c.message}" for c in report.checks if c.status == "fail"])
    return 0 if report.ok else 1


def _trusted_keys(paths: list[str] | None):
    """verify --trusted-key: the public keys a signature must be by; None (not checked) without the flag."""
    from precompile.signing.pair import read_trusted_keys

    return read_trusted_keys(paths) if paths else None


def _expectations(name: str | None, min_release: str | None):
    """verify --expect-name/--min-release: the identity the signature must bind; none without either flag."""
    if name is None and min_release is None:
        return ()
    from precompile.signing.identity import expectation

    found = expectation("--expect-name/--min-release", name, min_release)
    return () if found is None else (found,)


def _extract(args, out, err) -> int:
    from precompile.inspect.reading.extract import extract

    if len(args.paths) < 2:
        raise PrecompileError("extract needs an artifact and a directory: extract ARTIFACT [CACHE] DIR")
    artifact = open_given(args.paths[:-1], deep=True)
    report = extract(artifact, python_code_bytes(artifact) or b"", args.paths[-1])
    _emit(args, out, report, render_text.render_extract(report) if not args.json else ())
    _diagnose(err, report.problems)
    return 2 if report.problems else 0


def _report_artifacts(paths: list[str]) -> list[Artifact]:
    """report's PAIR [PAIR]: one artifact (a directory, a prefix, one file, or PYTHON_CODE CACHE: a .py
    then a .cache), or two (A B, or A.py A.cache B.py B.cache)."""
    if len(paths) == 1:
        return [open_given(paths)]
    if len(paths) == 2 and paths[0].endswith(".py") and paths[1].endswith(".cache"):
        return [open_given(paths)]
    if len(paths) == 2:
        return [open_given(paths[:1]), open_given(paths[1:])]
    if len(paths) == 4:
        return [_artifact(paths[:2]), _artifact(paths[2:])]
    raise PrecompileError(f"report takes one artifact or two: A, A B, PY CACHE, or A.py A.cache B.py B.cache; got {len(paths)} paths")


def _report(args, out, err) -> int:
    import hashlib

    from precompile.inspect.api import problems_of
    from precompile.inspect.model.report import HtmlReport
    from precompile.inspect.render.html_report import artifact_page, render

    artifacts = _report_artifacts(args.paths)
    inputs = {os.path.realpath(p) for artifact in artifacts for p in (artifact.python_code.path, artifact.cache.path) if p}
    if os.path.realpath(args.output) in inputs:
        raise PrecompileError(f"-o {args.output} is one of the artifact's files; refusing to overwrite it: pass another HTML path")
    codes = [python_code_bytes(artifact) for artifact in artifacts]
    problems = [p for artifact in artifacts for p in problems_of(artifact)]
    findings = [f for artifact in artifacts for f in _findings(artifact)]
    pages = [artifact_page(f"artifact-{label.lower()}", f"Artifact {label}" if len(artifacts) > 1 else "Artifact", artifact, code,
                           problems=problems_of(artifact), findings=_findings(artifact))
             for label, artifact, code in zip("AB", artifacts, codes)]
    report = None
    if len(artifacts) == 2:
        from precompile.inspect.diff.diff import diff

        report = diff(artifacts[0], artifacts[1], codes[0], codes[1], context=args.context)
        problems += [p for p in report.problems if p not in problems]
    problems += [p for page in pages for p in page.problems if p not in problems]
    findings += [f for page in pages for f in page.findings if f not in findings]
    from precompile.inspect.remote_arguments import relabel

    html = relabel(render(pages, report), getattr(args, "fetched_from", {})).encode("utf-8")  # URLs, not the fetch cache
    with open(args.output, "wb") as handle:
        handle.write(html)
    sections = tuple(f"{page.id}{part}" for page in pages for part in ("", "-summary", "-frames", "-guards", "-kernels", "-code"))
    written = HtmlReport(
        output=args.output, artifacts=tuple(page.title for page in pages), size=len(html), sha256=hashlib.sha256(html).hexdigest(),
        sections=(("diff", "diff-entries", "diff-kernels", "diff-code") if report is not None else ()) + sections,
        equal=report.equal if report is not None else None, problems=tuple(problems), findings=tuple(findings),
    )
    summary = [(f"wrote {args.output} ({len(html)} bytes): " + " vs ".join(written.artifacts), None)]
    if report is not None:
        summary.append(("the artifacts are equal" if report.equal else "the artifacts differ", None))
    _emit(args, out, written, summary if not args.json else ())
    _diagnose(err, problems, findings)
    return 2 if problems else 1 if findings or (report is not None and not report.equal) else 0


def _schema(args, out, err) -> int:
    from precompile.artifact.envelope import CacheEnvelope
    from precompile.artifact.jsonschema import render
    from precompile.artifact.metadata import ArtifactMetadata
    from precompile.inspect.model.report import render_schema

    schemas = {
        "cache-envelope": lambda: render(CacheEnvelope),
        "python-code-metadata": lambda: render(ArtifactMetadata),
        "inspect-report": render_schema,
    }
    if args.which != "all":
        out.file.write(schemas[args.which]())
    else:
        combined = {name: json.loads(make()) for name, make in schemas.items()}
        out.file.write(json.dumps(combined, indent=2, sort_keys=True) + "\n")
    out.file.flush()
    return 0


def guarded(handler):
    """Fetch artifacts given as URLs (remote_arguments.py), and turn OS-level failures into the CLI's
    `precompile: error:` exit 2; never a traceback. With --json, the error is also stdout's one JSON
    object (an ErrorReport), so that a tool reading stdout always gets JSON."""

    def run(args, out, err) -> int:
        from precompile.inspect.remote_arguments import fetched_arguments

        try:
            try:
                with fetched_arguments(args, out, err):
                    return handler(args, out, err)
            except (OSError, ValueError, RecursionError, MemoryError) as exc:
                raise PrecompileError(f"{type(exc).__name__}: {exc}") from None
        except PrecompileError as exc:
            if getattr(args, "json", False):  # keygen has no --json
                from precompile.inspect.model.report import ErrorReport, encode

                out.file.write(encode(ErrorReport(verb=args.verb, error=str(exc))))
                out.file.flush()
            raise

    return run


def register(verbs: argparse._SubParsersAction) -> None:
    """Add the inspect verbs to the `precompile` command's subparsers."""

    def add(name: str, help_text: str, handler, *, artifact: bool = True, one_file: bool = False) -> argparse.ArgumentParser:
        parser = verbs.add_parser(name, help=help_text, description=help_text)
        if artifact:
            parser.add_argument("artifact", nargs="+", metavar="ARTIFACT", help=ONE_FILE_HELP if one_file else ARTIFACT_HELP)
        parser.add_argument("--json", action="store_true", help="print the versioned JSON report instead of text")
        parser.set_defaults(handler=guarded(handler))
        return parser

    add("show", "show tags, versions, calling convention, hashes, pairing and bundle contents of an artifact", _show, one_file=True)
    guards = add("guards", "show what an artifact checks before serving a call, and what it does not", _guards)
    guards.add_argument("--frame", help="only this frame (name or variant number)")
    guards.add_argument("--type", help=("only this guard type or specialization kind (shape, dtype, device, constant, param, buffer, "
                                       "global_state, attribute, global, closure)"))
    guards.add_argument("--risky", action="store_true", help="only risky slots")
    diff = add("diff", "semantic diff of two artifacts; exit 0 equal, 1 different, 2 trouble", _diff, artifact=False)
    diff.add_argument("paths", nargs="+", metavar="PATH", help=(
        "A B (each a directory holding one pair, a prefix DIR/NAME, or one file alone of a kind `show` knows), "
        "or A.py A.cache B.py B.cache"))
    diff.add_argument("--context", type=int, default=3, help="lines of context in the python_code diff (default: 3)")
    diff.add_argument("--stat", action="store_true", help="only how many differences fall in each category, and the verdict")
    diff.add_argument("--fail-on", metavar="CATEGORIES", help=(
        "exit 1 only for differences in these comma-separated categories (guards, calling-convention, params, graph, "
        "kernels, versions, code, metadata); others are shown and exit 0. A side given with another build's cache "
        "(unpaired) fails every gate"))
    diff.add_argument("--format", choices=("text", "markdown", "json"), help=(
        "text (the default), markdown (a summary for a pull request comment: verdict, categories, changed guards with "
        "both values, other differences, kernel source diffs) or json (the same as --json)"))
    diff.add_argument("--junit", metavar="FILE", help=(
        "also write a JUnit XML report to FILE (atomically): one testcase per category, failed when it differs and "
        "--fail-on names it (any difference without --fail-on); the exit code is the same"))
    diff.add_argument("--provenance", action="store_true", help=(
        "also compare where and how the kernels were built (producer paths, compiler command, library bytes)"))
    verify = add("verify", "check a pair's integrity and signature; --host: whether this machine can serve it; exit 0/1/2", _verify)
    verify.add_argument("-v", "--verbose", action="store_true", help="list every check, not only the verdict and what failed")
    verify.add_argument("--host", action="store_true", help="also check this host's Python and torch against the artifact")
    verify.add_argument("--trusted-key", action="append", metavar="PUB", help=(
        "check the pair's signature (NAME.sig): it must be by this public key; repeatable (any one of them); needs precompile[sign]"))
    verify.add_argument("--expect-name", metavar="NAME", help=(
        "the signature must bind this name (sign --name): another model signed by a trusted key fails; needs --trusted-key"))
    verify.add_argument("--min-release", metavar="N", help=(
        "the signature must bind a release at least N (sign --release; PEP 440 order: 10 > 9, 1.10 > 1.9): an older "
        "release put back fails; needs --trusted-key"))
    verify.add_argument("--proof-memory", type=_mib, metavar="MIB", help=(
        "memory the proof that the cache's bytecode is python_code's may take, in MiB (default: PRECOMPILE_PROOF_MEMORY, "
        "else 50 times python_code's size, at least 256 and at most 1536); a proof that needs more fails as 'not proven' (exit 1)"))
    extract = add("extract", "write python_code sections, metadata, envelope and bundle files into a new directory", _extract, artifact=False)
    extract.add_argument("paths", nargs="+", metavar="ARTIFACT... DIR", help=f"{ONE_FILE_HELP}; then the directory to create")
    report = add("report", "write one self-contained HTML page about an artifact, or two and their diff side by side; "
                 "exit 0 ok, 1 a finding (the two differ, unpaired, flagged), 2 trouble", _report, artifact=False)
    report.add_argument("paths", nargs="+", metavar="PAIR", help=(
        f"{ONE_FILE_HELP}; two of them (A B, or A.py A.cache B.py B.cache) for a report with their diff. "
        "Two paths NAME.py NAME.cache (a .py then a .cache) are one pair"))
    report.add_argument("-o", "--output", default="report.html", metavar="HTML", help="the HTML file to write (default: report.html)")
    report.add_argument("--context", type=int, default=3, help="lines of context in the python_code diff (default: 3)")
    schema = add("schema", "print the JSON Schemas of the cache envelope, the python_code metadata and the --json report", _schema, artifact=False)
    schema.add_argument("which", nargs="?", default="all", choices=("all", "cache-envelope", "python-code-metadata", "inspect-report"))


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run `precompile <verb>`")
