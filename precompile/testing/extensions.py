"""syrupy extensions for readable artifact snapshots: one file per snapshot, so a pull request shows a
change as a diff of code and of a guard table a reviewer reads."""
from __future__ import annotations

from pathlib import Path

from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode
from syrupy.location import PyTestLocation


class PythonSourceSnapshot(SingleFileSnapshotExtension):
    """One `.py` file per snapshot (`__snapshots__/<test module>/<test>.py`): a golden reads, and
    diffs, as the source it locks. Text, written as given."""

    _write_mode = WriteMode.TEXT
    file_extension = "py"


class GuardTableSnapshot(SingleFileSnapshotExtension):
    """An artifact's guard table and calling convention (`<test>.guards.txt`), beside its python_code."""

    _write_mode = WriteMode.TEXT
    file_extension = "guards.txt"


def torch_series() -> str:
    """`torch2.13` for torch 2.13.0+cpu: the folder of this torch minor's snapshots."""
    import torch

    return "torch" + ".".join(torch.__version__.split(".")[:2])


def _per_torch_dirname(cls: type[SingleFileSnapshotExtension], test_location: PyTestLocation) -> str:
    """`__snapshots__/torch2.13/<test module>/`: each torch minor's snapshots in a folder of their own,
    which a run on another torch neither reads nor reports unused."""
    return str(Path(test_location.filepath).parent / cls.snapshot_dirname / torch_series() / test_location.basename)


class PerTorchPythonSource(PythonSourceSnapshot):
    """PythonSourceSnapshot, one golden per torch minor."""

    @classmethod
    def dirname(cls, *, test_location: PyTestLocation) -> str:
        return _per_torch_dirname(cls, test_location)


class PerTorchGuardTable(GuardTableSnapshot):
    """GuardTableSnapshot, one golden per torch minor."""

    @classmethod
    def dirname(cls, *, test_location: PyTestLocation) -> str:
        return _per_torch_dirname(cls, test_location)
