"""syrupy extensions shared by the snapshot tests."""
from __future__ import annotations

from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode


class PythonSourceSnapshot(SingleFileSnapshotExtension):
    """One `.py` file per snapshot, so a golden reads (and diffs) as the source it locks."""

    _write_mode = WriteMode.TEXT
    file_extension = "py"
