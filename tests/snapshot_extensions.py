"""syrupy extensions shared by the snapshot tests: the shipped PythonSourceSnapshot, kept per torch minor."""
from __future__ import annotations

from pathlib import Path

from precompile.testing.extensions import PythonSourceSnapshot


class TorchVersionedSource(PythonSourceSnapshot):
    """A `.py` golden per torch minor version (`goldens/<test module>/torch-2.13/...` beside the test file): torch
    prints other ATen graphs, guard listings and versions on each, so every claimed version keeps its
    own goldens, written by `./dev compat VERSION tests/... --snapshot-update` on that version. They
    live outside `__snapshots__`, whose .ambr discovery would count the other versions' files as
    unused snapshots of this run."""

    @classmethod
    def dirname(cls, *, test_location) -> str:
        return str(Path(test_location.filepath).parent / "goldens" / test_location.basename / torch_series())


def torch_series() -> str:
    """`torch-2.13` for torch 2.13.0+cpu: the folder of this torch's goldens."""
    import torch

    return "torch-" + ".".join(torch.__version__.split(".")[:2])
