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


def _first_result_totals() -> dict[tuple[int, str], float]:
    """docs/performance.md's depth table: {(layers, scenario): seconds to the first result}."""
    text = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    table = re.search(r"```\nlayers  scenario .*?\n(.*?)```", text, re.S).group(1)
    return {(int(layers), scenario): float(total)
            for layers, scenario, total in re.findall(r"^\s+(\d+)\s+(\S+)\s+([\d.]+)", table, re.M)}


def test_the_first_screen_says_what_precompile_is_for_and_shows_the_first_result_table_with_its_command():
    first_screen = "\n".join(README.splitlines()[:40])
    assert "**What it is for:**" in first_screen
    assert "python bench/depth.py --layers 1,48" in first_screen
    rows = {cells[0]: cells[1:] for line in first_screen.splitlines() if line.startswith("| ")
            for cells in [[cell.strip().strip("*") for cell in line.strip("|").split("|")]]}
    totals = _first_result_totals()
    scenarios = {"eager, nothing compiled": "eager", "`torch.compile`, its cache warm from an earlier process": "compile-warm",
                 "`torch.compile` with the Mega-Cache loaded": "compile-mega", "AOTInductor (`aoti_load_package`)": "aoti"}
    for row, scenario in scenarios.items():
        assert rows[row] == [f"{totals[(layers, scenario)]:.2f}" for layers in (1, 48)], row
    served = rows["precompile `load`** (MakeFx or Dynamo, eager or Inductor)"]
    for layers, shown in zip((1, 48), served):
        ours = [total for (at, scenario), total in totals.items() if at == layers and scenario.startswith(("makefx", "dynamo"))]
        assert shown == f"{min(ours):.2f}-{max(ours):.2f}", (layers, shown)
