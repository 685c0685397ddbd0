"""The rendered python_code of representative captures, locked by snapshots.

Each golden is also compiled and served, so a snapshot that no longer runs fails here, not in
production. Each torch minor version keeps its own goldens (`torch-2.13/`, ...): torch versions print
other ATen graphs and versions.
"""
from __future__ import annotations

import pytest
import torch

from pathlib import Path

from cases import CASES
from snapshot_extensions import TorchVersionedSource, torch_series

GOLDENS = Path(__file__).parent / "goldens" / "test_codegen_snapshots" / torch_series()


@pytest.fixture
def snapshot_py(snapshot):
    return snapshot.use_extension(TorchVersionedSource)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_python_code(name, captured, snapshot_py):
    artifact, _ = captured[name]
    assert artifact.read_text(encoding="utf-8") == snapshot_py


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_compiles_and_serves(name):
    """The committed golden itself runs (plain exec, no precompile load) and matches eager."""
    import torch.utils._pytree as pytree

    location = GOLDENS / f"test_rendered_python_code[{name}].py"
    source = location.read_text(encoding="utf-8")
    namespace = {}
    exec(compile(source, str(location), "exec"), namespace)
    case = CASES[name]
    with torch.set_grad_enabled(case.grad):
        served, eager = namespace["forward"](*case.args()), case.fn(*case.args())
    served_leaves, served_spec = pytree.tree_flatten(served)
    eager_leaves, eager_spec = pytree.tree_flatten(eager)
    assert served_spec == eager_spec
    for s, e in zip(served_leaves, eager_leaves):
        assert torch.allclose(s, e, atol=1e-5) if isinstance(s, torch.Tensor) else s == e
