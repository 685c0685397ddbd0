"""Section names: the renderer writes each section's slug; files from before that keep the same names."""
from __future__ import annotations

import pytest

from snapshot_extensions import torch_series
from test_inspect_helpers import FIXTURES, ROOT

from precompile.inspect.parsing.sections import split_sections

GOLDENS = ROOT / "tests" / "codegen" / "goldens" / "test_codegen_snapshots"


def _slugs(source: str) -> list[str]:
    return [section.slug for section, _ in split_sections(source)]


def test_rendered_sections_carry_their_names_and_their_titles_stay_prose():
    golden = GOLDENS / torch_series() / "test_rendered_python_code[mlp_batchnorm].py"
    sections = [section for section, _ in split_sections(golden.read_text(encoding="utf-8"))]
    assert [s.slug for s in sections] == ["header", "metadata", "graph", "autograd-graph", "driver-sources", "read-checks", "driver"]
    assert sections[1].title == "Top-level literals. Tools read them with ast and never execute this file."


def test_a_slug_is_what_the_title_line_names_not_what_its_prose_says():
    banner = "# " + "=" * 40 + "\n"
    source = f"x = 1\n{banner}# 1. driver: Captured graph (eager backend)\n{banner}pass\n"
    assert _slugs(source) == ["header", "driver"]
    assert split_sections(source)[1][0].title == "Captured graph (eager backend)"


@pytest.mark.parametrize(
    ("fixture", "slugs"),
    [
        ("v1/mlp", ["header", "metadata", "graph", "driver"]),
        ("v1/mlp_inductor", ["header", "metadata", "kernel-runtime", "graph", "driver"]),
        ("v1/all_reduce_world", ["header", "metadata", "world", "graph", "driver"]),
        ("v1/dynamo_rows", ["header", "metadata", "opaque-state", "driver"]),
        ("v1/dynamo_break_eager",
         ["header", "metadata", "graph-0", "graph-1", "graph-2", "graph-3", "graph-4", "opaque-state", "driver"]),
    ],
)
def test_files_written_before_slugs_name_their_sections_the_same_way(fixture, slugs):
    assert _slugs((FIXTURES / f"{fixture}.py").read_text(encoding="utf-8")) == slugs
