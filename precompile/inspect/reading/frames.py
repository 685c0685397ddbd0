"""How inspect names a Dynamo artifact's captured frames and says how each is served."""
from __future__ import annotations

from precompile.artifact.metadata import DynamoFrame


def frame_label(frame: DynamoFrame) -> str:
    """The frame's qualified name where the artifact records it (two frames can share a co_name:
    every nn.Module has a forward), else its code's name."""
    return frame.qualname or frame.name


def frame_role(frame: DynamoFrame, with_line: bool = True) -> str:
    """How a call reaches the frame: the entry, a continuation Dynamo's bytecode calls by name, or
    (installed artifacts) a function installed onto by module and qualified name; `with_line`: and the
    line its code starts on."""
    line = f", line {frame.first_line}" if frame.first_line and with_line else ""
    if frame.installed:
        return f"installed onto {frame.module}.{frame.qualname}{line}"
    if frame.resume_names:
        return f"continuation called as {', '.join(frame.resume_names)}{line}"
    return f"entry{line}"


def frame_served(frame: DynamoFrame) -> str:
    if frame.runs_as_python:
        return "runs as plain Python (compiled nothing)"
    return f"{frame.variants} variants" + (" (bypassed)" if frame.bypassed else "")
