"""The `precompile` command: argument parsing, exit codes, and nothing else."""
from __future__ import annotations

import argparse
import gc
import os
import sys
import warnings
from pathlib import Path
from typing import NoReturn

from rich.console import Console

from precompile._version import __version__
from precompile.cli.signing import register as register_signing_verbs
from precompile.errors import PrecompileError
from precompile.inspect.commands import register as register_inspect_verbs
from precompile.inspect.render.terminal_text import printable


def _demo(args: argparse.Namespace, out: Console, err: Console) -> int:
    from precompile.capturing import progress
    from precompile.cli.demo import TOLERANCE, run_demo

    with progress.shown(True):  # each step as it runs: live on a terminal, plain lines when piped
        report = run_demo(Path(args.directory), args.backend)
    if args.json:
        out.file.write(report.to_json())
        out.file.flush()
    else:
        _print_demo(report, out)
    served = report.served
    assert served is not None  # run_demo raises when the fresh process printed no report
    if not report.ok:
        err.print(
            f"precompile: error: the pair served in a fresh process differs from eager by {served['max_abs_diff']:.3g} "
            f"(over the {TOLERANCE:g} tolerance): ({report.artifact_path}, {report.cache_path}) does not reproduce the model; "
            "report it with both files",
            markup=False,
        )
    return 0 if report.ok else 1


def _print_demo(report, out: Console) -> None:
    for step, seconds in report.steps:
        out.print(f"{seconds:8.2f} s  {step}")
    served = report.served
    out.print(
        f"fresh process: load {served['load_s'] * 1000:.1f} ms, first call {served['first_call_s'] * 1000:.1f} ms, "
        f"cache {'used' if served['cache_used'] else 'NOT used'}, nothing compiled, "
        f"torch._inductor {'imported' if served['inductor_imported'] else 'not imported'}"
    )
    out.print(f"max |served - eager| = {served['max_abs_diff']:.3g}: {'match' if report.ok else 'MISMATCH'}")
    out.print(f"artifact: {report.artifact_path}")
    out.print(f"cache:    {report.cache_path}")


def _doctor(args: argparse.Namespace, out: Console, err: Console) -> int:
    from precompile.capturing import progress
    from precompile.cli.doctor import diagnose

    with progress.shown(True):
        report = diagnose(probe_compiler=not args.no_compiler_probe)
    if args.json:
        out.print(report.to_json(), markup=False)
        return 0
    out.print(report.summary(), markup=False)
    for feature in report.features:
        out.print(f"  {'yes' if feature.works else 'no ':3}  {feature.name:24} {feature.detail}", markup=False)
    return 0


COLORS = ("auto", "always", "never")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="precompile", description="Capture, load and inspect precompile artifacts.")
    parser.add_argument("--version", action="version", version=f"precompile {__version__}")
    parser.add_argument("--color", choices=COLORS, default="auto", help="colour output (default: auto)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    demo = verbs.add_parser("demo", help="capture the built-in transformer, reload it in a fresh process, compare with eager")
    demo.add_argument("directory", nargs="?", default="precompile-demo", help="where to write the pair (default: ./precompile-demo)")
    demo.add_argument("--backend", choices=("inductor", "eager"), default="inductor", help="how the captured graph is realized (default: inductor)")
    demo.add_argument("--json", action="store_true", help="print the result (steps, paths, the fresh process's report, ok) as JSON")
    demo.set_defaults(handler=_demo)
    doctor = verbs.add_parser("doctor", help="which features work with this torch, Python and host, and why not")
    doctor.add_argument("--json", action="store_true", help="the report as JSON")
    doctor.add_argument("--no-compiler-probe", action="store_true", help="skip building an empty library with the C++ compiler")
    doctor.set_defaults(handler=_doctor)
    register_inspect_verbs(verbs)
    register_signing_verbs(verbs)
    for sub in verbs.choices.values():
        # Global flags are accepted after the verb too; SUPPRESS leaves the one given before it (or the default) alone.
        sub.add_argument("--color", choices=COLORS, default=argparse.SUPPRESS, help="colour output (default: auto)")
    return parser


def consoles(color: str) -> tuple[Console, Console]:
    if color == "always" or (color == "auto" and os.environ.get("FORCE_COLOR")):
        force, no_color = True, False
    elif color == "never" or (color == "auto" and "NO_COLOR" in os.environ):
        force, no_color = None, True
    else:
        force, no_color = None, False
    return (
        Console(force_terminal=force, no_color=no_color, highlight=False, soft_wrap=True),
        Console(stderr=True, force_terminal=force, no_color=no_color, highlight=False, soft_wrap=True),
    )


def main(argv: list[str] | None = None) -> int:
    # torch warns on import when numpy is absent; the CLI never needs numpy, so keep its output clean.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    args = build_parser().parse_args(argv)
    out, err = consoles(args.color)
    try:
        return args.handler(args, out, err)
    except PrecompileError as exc:
        err.print(printable(f"precompile: error: {exc}"), markup=False)
        return 2


def run() -> NoReturn:
    """The `precompile` command: main() with the cyclic collector off, then exit without the
    interpreter's final collections walking what the verb read. What a verb reads are syntax trees
    and models, which hold no cycles (reference counting frees them), and a verb ends within
    seconds of its last read: the collector could free nothing of them, but it walked each kept node
    as it promoted it (a fifth of `diff`'s time on a 4 MB python_code) and again at exit (longer
    than the verb took to read them): the objects left are frozen out of it first."""
    gc.disable()
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
