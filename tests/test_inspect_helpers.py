"""Shared helpers of the inspect tests (not collected: no test_ prefix)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
GOOD = ("mlp", "mlp_b4", "mlp_inductor", "two_modules", "train_step", "dynamo_break", "dynamo_break_eager", "dynamo_rows",
        "dynamo_rows_risky", "dynamo_installed", "dynamo_lowered")
DAMAGED = ("truncated", "bitflip", "mismatched", "foreign", "newer", "upstream", "poisoned")
HOSTILE = ("dynamo_os_system",)
ALL = tuple(f"v1/{n}" for n in GOOD) + tuple(f"damaged/{n}" for n in DAMAGED) + tuple(f"hostile/{n}" for n in HOSTILE)


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    from precompile.cli.main import main

    capsys.readouterr()
    try:
        rc = main(["--color", "never", *argv])
    except SystemExit as exc:  # argparse usage errors
        rc = exc.code
    captured = capsys.readouterr()
    return rc, captured.out, captured.err
