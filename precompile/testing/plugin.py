"""The pytest plugin (entry point `pytest11`: `precompile = "precompile.testing.plugin"`).

It defines the `precompile_snapshot` fixture, and keeps pytest from collecting the python_code
snapshots (`.py` files under `__snapshots__/`) as test modules. Importing it imports pytest only:
torch, syrupy and the capture side are imported when a test uses the fixture.
"""
from __future__ import annotations

from pathlib import Path

import pytest


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A python_code snapshot is Python named after its test (`test_block.py`): never a test module. It lies
    under `__snapshots__/`, or `__snapshots_torch2.13__/` for one torch minor's."""
    if collection_path.suffix == ".py" and any(part.startswith("__snapshots") for part in collection_path.parts):
        return True
    return None


@pytest.fixture
def precompile_snapshot(request: pytest.FixtureRequest, tmp_path: Path):
    """`precompile_snapshot(fn, *args, tolerance=None, per_torch=False, factory=None, **capture_kwargs)`:
    capture `fn(*args)` (`capture_kwargs` go to `precompile.capture`: tracer, backend, ...), serve the
    artifact in a fresh process under `no_compilation()` and compare it with eager (`tolerance`: rtol and
    atol; None: torch.testing.assert_close's defaults), then compare the python_code that is the user's
    (`.py`: precompile's runtime named by one line each, line numbers left out) and its guard table and
    calling convention (`.guards.txt`) with the snapshots under `__snapshots__/` (`per_torch=True`: one
    set per torch minor, under `__snapshots_torch2.13__/`). `factory` (instead of `args`): a module-level
    function returning the arguments, called here and in the fresh process, which builds the model as a
    serving process does and compares with its own eager call. A difference fails with `precompile
    diff`'s verdict and categories, then the changed python_code sections. Returns the captured pair's
    paths."""
    from precompile.testing.fixture import SnapshotCapture

    return SnapshotCapture(request, tmp_path)
