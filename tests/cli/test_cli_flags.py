"""The `precompile` command's global flags: --version, and --color before or after the verb."""
from __future__ import annotations

import subprocess
import sys

import pytest

from precompile._version import __version__
from precompile.cli.main import build_parser, main
from test_inspect_helpers import ROOT


def test_version_prints_the_package_version():
    proc = subprocess.run([sys.executable, "-m", "precompile", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout == f"precompile {__version__}\n"


@pytest.mark.parametrize(
    ("argv", "color"),
    [
        (["show", "x"], "auto"),
        (["--color", "never", "show", "x"], "never"),
        (["show", "--color", "always", "x"], "always"),
        (["show", "x", "--color", "never"], "never"),
        (["--color", "always", "show", "x", "--color", "never"], "never"),  # the later one wins
        (["--color", "never", "diff", "a", "b"], "never"),  # given before the verb only: kept
        (["doctor", "--color", "never"], "never"),
        (["demo", "--color", "never"], "never"),
        (["report", "a", "--color", "always", "-o", "r.html"], "always"),
        (["keygen", "--out", "k", "--color", "never"], "never"),
    ],
)
def test_color_is_accepted_before_and_after_the_verb(argv, color):
    assert build_parser().parse_args(argv).color == color


def test_every_verb_takes_color_after_it():
    parser = build_parser()
    verbs = next(action for action in parser._actions if action.dest == "verb").choices
    assert {"show", "guards", "diff", "verify", "extract", "report", "schema", "demo", "doctor"} <= set(verbs)
    for name, sub in verbs.items():
        assert any("--color" in action.option_strings for action in sub._actions), name


def test_color_after_the_verb_colours_the_output(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    for name in ("FORCE_COLOR", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    assert main(["show", "fixtures/v1/mlp", "--color", "always"]) == 0
    assert "\x1b[" in capsys.readouterr().out
    assert main(["--color", "always", "show", "fixtures/v1/mlp", "--color", "never"]) == 0
    assert "\x1b[" not in capsys.readouterr().out


def test_a_bad_color_after_the_verb_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["show", "--color", "bogus", "x"])
    assert exc.value.code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err
