"""A release pair that differs in one kernel (the same model, its activation ReLU then Sigmoid,
captured with the inductor backend): diff's Markdown, JUnit and the report name the kernel by its
Inductor name (`cpp_fused_…`) and show its source diff. Slow: two Inductor compiles per session."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from test_inspect_helpers import run_cli


def _step(model, x):
    return model(x)


@pytest.fixture(scope="module")
def kernel_pair(tmp_path_factory):
    """(relu, sigmoid): the prefixes of the two captures."""
    import torch

    import precompile

    directory = tmp_path_factory.mktemp("kernel-pair")
    prefixes = []
    for activation in (torch.nn.ReLU(), torch.nn.Sigmoid()):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), activation).eval()
        prefix = directory / type(activation).__name__.lower()
        with torch.no_grad(), precompile.capture(_step, artifact_path=f"{prefix}.py", cache_path=f"{prefix}.cache",
                                                 tracer=precompile.MakeFxTracer(), backend="inductor") as cap:
            cap(model, torch.randn(4, 8))
        prefixes.append(str(prefix))
    return prefixes


def test_markdown_shows_the_changed_kernel_by_inductor_name_with_its_source_diff(capsys, kernel_pair):
    rc, out, err = run_cli(capsys, ["diff", "--format", "markdown", "--fail-on", "kernels", *kernel_pair])
    assert rc == 1, err
    assert out.splitlines()[0].startswith("### verdict: differ in ") and out.splitlines()[0].endswith("; fails on kernels")
    assert "- `cpp_fused_relu_0 → cpp_fused_sigmoid_0` changed" in out
    fenced = out[out.index("```diff\n", out.index("Kernel sources by Inductor name")):]  # after the graph's own diff
    fenced = fenced[:fenced.index("\n```\n")]
    assert "--- a/cpp_fused_relu_0" in fenced and "+++ b/cpp_fused_sigmoid_0" in fenced
    removed = [line for line in fenced.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line for line in fenced.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert removed and added and any("exp()" in line for line in added) and not any("exp()" in line for line in removed)
    rc, text, _ = run_cli(capsys, ["diff", *kernel_pair])
    assert "  kernel cpp_fused_relu_0 → cpp_fused_sigmoid_0 (changed)" in text


def test_junit_fails_the_kernels_testcase_naming_the_kernel(capsys, tmp_path, kernel_pair):
    path = tmp_path / "j.xml"
    rc, _, err = run_cli(capsys, ["diff", "--junit", str(path), "--fail-on", "kernels,params", *kernel_pair])
    assert rc == 1, err
    cases = {case.get("name"): case for case in ET.parse(path).getroot().iter("testcase")}
    assert cases["kernels"].find("failure") is not None and cases["params"].find("failure") is None
    assert "~ kernel source cpp_fused_relu_0 → cpp_fused_sigmoid_0 (changed)" in cases["kernels"].find("failure").text


def test_the_report_opens_on_the_diff_with_the_kernel_source_side_by_side(capsys, tmp_path, kernel_pair):
    output = tmp_path / "r.html"
    rc, _, err = run_cli(capsys, ["report", *kernel_pair, "-o", str(output)])
    assert rc == 1, err
    html = output.read_text(encoding="utf-8")
    main = html[html.index("<main>"):]
    assert main.index('id="diff"') < main.index('id="diff-kernels"') < main.index('id="artifact-a"')
    kernels = main[main.index('id="diff-kernels"'):main.index('id="diff-code"')]
    assert '<span class="name">cpp_fused_relu_0 → cpp_fused_sigmoid_0</span>' in kernels
    assert '<tr class="changed">' in kernels and "exp()" in kernels
    assert "cpp_fused_relu_0 (" in main and "cpp_fused_sigmoid_0 (" in main  # each artifact's kernel titled by its name
