"""The README's front door works as written: its quickstart runs in a fresh interpreter, in an empty
directory, and leaves a pair the CLI verifies; every relative link in it and in docs/ names a file."""
from __future__ import annotations

import re
from pathlib import Path

from conftest import ROOT, run_fresh
from precompile.cli.main import main

README = (ROOT / "README.md").read_text(encoding="utf-8")


def _quickstart() -> str:
    section = README[README.index("## Quickstart") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_quickstart_runs_as_written_and_leaves_a_pair_that_verifies(tmp_path, monkeypatch, capsys):
    code = _quickstart()
    assert len(code.strip().splitlines()) <= 20
    monkeypatch.chdir(tmp_path)
    proc = run_fresh(code)
    assert proc.returncode == 0, proc.stderr
    assert "served <PrecompiledRunnable __main__.step from step.py" in proc.stdout
    assert main(["verify", "step"]) == 0
    assert "verified: ok" in capsys.readouterr().out


def test_every_relative_link_of_the_readme_and_docs_names_a_file():
    missing = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s#:]+)\)", page.read_text(encoding="utf-8")):
            if not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert missing == []
