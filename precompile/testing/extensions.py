"""syrupy extensions for readable artifact snapshots: one file per snapshot, so a pull request shows a
change as a diff of code and of a guard table a reviewer reads."""
from __future__ import annotations

from pathlib import Path

from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode
from syrupy.location import PyTestLocation


class PythonSourceSnapshot(SingleFileSnapshotExtension):
    """One `.py` file per snapshot (`__snapshots__/<test module>/<test>.py`): a golden reads, and
    diffs, as the source it locks. Text, written as given, compared as written."""

    _write_mode = WriteMode.TEXT
    file_extension = "py"


class ModelCodeSnapshot(PythonSourceSnapshot):
    """The user's python_code (`user_code.normalized_code`): compared without the lines that name
    precompile's runtime, so a snapshot written under one precompile release holds under the next."""

    def matches(self, *, serialized_data, snapshot_data) -> bool:
        from precompile.testing.user_code import users_lines

        if not isinstance(serialized_data, str) or not isinstance(snapshot_data, str):
            return bool(serialized_data == snapshot_data)
        return users_lines(serialized_data) == users_lines(snapshot_data)


class GuardTableSnapshot(SingleFileSnapshotExtension):
    """An artifact's guard table and calling convention (`<test>.guards.txt`), beside its python_code."""

    _write_mode = WriteMode.TEXT
    file_extension = "guards.txt"


def torch_series() -> str:
    """`torch2.13` for torch 2.13.0+cpu: the name of this torch minor's snapshots."""
    import torch

    return "torch" + ".".join(torch.__version__.split(".")[:2])


def per_torch_dirname(test_location: PyTestLocation) -> str:
    """`__snapshots_torch2.13__/<test module>/` beside the test file: each torch minor's snapshots in a
    folder of their own, outside `__snapshots__` (syrupy scans all of that folder, for any extension,
    and would count another minor's files as unused, and delete them on --snapshot-update)."""
    return str(Path(test_location.filepath).parent / f"__snapshots_{torch_series()}__" / test_location.basename)


class PerTorchModelCode(ModelCodeSnapshot):
    """ModelCodeSnapshot, one golden per torch minor."""

    @classmethod
    def dirname(cls, *, test_location: PyTestLocation) -> str:
        return per_torch_dirname(test_location)


class PerTorchGuardTable(GuardTableSnapshot):
    """GuardTableSnapshot, one golden per torch minor."""

    @classmethod
    def dirname(cls, *, test_location: PyTestLocation) -> str:
        return per_torch_dirname(test_location)
