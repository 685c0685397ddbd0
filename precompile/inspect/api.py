"""The inspect verbs as Python functions: each returns, typed, what `precompile VERB --json` prints.

Open an artifact once (`open_path` or `open_artifact`), then ask about it: `show_report`,
`guards_report`, `diff_report` (two opened artifacts), `verify_report`. Torch-free, and nothing here
executes or unpickles anything from an artifact. docs/api.md has examples.
"""
from __future__ import annotations

from collections.abc import Sequence

from precompile.artifact.pickle_scan import finding_text
from precompile.inspect.diff.diff import diff
from precompile.inspect.model.artifact import Artifact
from precompile.inspect.model.report import DiffReport, GuardsReport, ShowReport, VerifyReport
from precompile.inspect.reading.guards import filtered, guards_of
from precompile.inspect.reading.reader import open_given, python_code_bytes
from precompile.inspect.verify.verify import verify
from precompile.signing.identity import Expectation
from precompile.signing.keys import Key


def open_path(*paths: str, deep: bool = False) -> Artifact:
    """The artifact the paths name, as the CLI takes them: PYTHON_CODE CACHE, a directory holding one
    pair, a prefix DIR/NAME, or one file alone of any kind `show` knows (told by its content).
    `deep=True` also reads the cache's payload (what `verify_report` checks the bundle against).
    Each may be an fsspec URL (docs/remote.md): fetched into the fetch cache, where the artifact's
    paths then point. Raises PrecompileError when nothing readable is named."""
    from precompile.inspect.remote_arguments import local_forms

    return open_given(local_forms(list(paths)), deep=deep)


def problems_of(artifact: Artifact) -> tuple[str, ...]:
    """Why either file cannot be read as what it claims to be (the CLI's exit 2)."""
    return tuple(p for p in (artifact.python_code.problem, artifact.cache.problem) if p is not None)


def pairing_findings(artifact: Artifact) -> tuple[str, ...]:
    """That the cache does not pair with python_code (load would not use it), naming both files."""
    if artifact.pairs is False:
        return (f"{artifact.cache.path} does not pair with {artifact.python_code.path}: {artifact.pairing_problem}",)
    return ()


def opaque_findings(artifact: Artifact) -> tuple[str, ...]:
    """What the scan of python_code's opaque state flags: a spelling load refuses, a dangerous or
    unresolved import, each naming the file."""
    code = artifact.python_code
    return (tuple(f"{code.path}: {problem}" for problem in code.opaque_problems)
            + tuple(f"{code.path}: {finding_text(scan, imp)}" for scan, imp in artifact.opaque_findings))


def show_report(artifact: Artifact) -> ShowReport:
    """`precompile show --json`: the artifact's typed model (tags, versions, calling convention,
    hashes, pairing, bundle) with the reasons a file cannot be read."""
    return ShowReport(artifact=artifact, problems=problems_of(artifact))


def guards_report(artifact: Artifact, *, frame: str | None = None, kind: str | None = None,
                  risky_only: bool = False) -> GuardsReport:
    """`precompile guards --json`: what the artifact checks before serving a call and what it does
    not (`guards` is None when python_code cannot be read; `problems`: why either file cannot be read,
    the CLI's exit 2), optionally only one frame, one guard type or specialization kind, or the risky
    slots."""
    guards = guards_of(artifact, python_code_bytes(artifact))
    if guards is not None:
        guards = filtered(guards, frame=frame, kind=kind, risky_only=risky_only)
    problems = problems_of(artifact)
    return GuardsReport(python_code=artifact.python_code.path, guards=guards, problems=problems,
                        pickles=artifact.python_code.pickles, findings=pairing_findings(artifact) + opaque_findings(artifact))


def diff_report(a: Artifact, b: Artifact, *, context: int = 3, provenance: bool = False) -> DiffReport:
    """`precompile diff --json A B`: every difference sorted into a category (`report.categories`,
    see `CATEGORIES`), python_code's changed sections as unified diffs with `context` lines, changed
    kernels by name; `provenance=True` also compares where and how kernels were built."""
    return diff(a, b, python_code_bytes(a), python_code_bytes(b), context=context, provenance=provenance)


def verify_report(artifact: Artifact, *, host: bool = False, trusted_keys: Sequence[Key] | None = None,
                  expect: Sequence[Expectation] = (), proof_memory_mib: int | None = None) -> VerifyReport:
    """`precompile verify --json`: integrity (open the artifact with `deep=True` so the bundle's bytes
    are checked), the signature (by one of `trusted_keys` when given: `precompile.signing.pair.
    read_trusted_keys` reads them), and with `host=True` whether this machine can serve it.
    `proof_memory_mib`: the memory the bytecode proof may take (inspect/verify/bytecode_proof.py)."""
    return verify(artifact, host=host, trusted_keys=trusted_keys, expect=expect, proof_memory_mib=proof_memory_mib)
