"""What Dynamo only logs during a capture: frames that hit the recompile limit, and backend
compiles that failed with an error Dynamo turned into a graph break."""
from __future__ import annotations

import logging
import re
from pathlib import Path


class TruncationLog(logging.Handler):
    """Records the frames Dynamo stopped recompiling at recompile_limit (it logs a warning for each)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.frames: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if not str(record.msg).startswith("torch._dynamo hit config.") or len(args) < 3:
            return
        match = re.match(r"'(.+)' \((.+):(\d+)\)", str(args[2]))
        if match is not None:
            name, filename, line = match.groups()
            frame = f"{name} ({Path(filename).name}:{line})"
            if frame not in self.frames:
                self.frames.append(frame)


class BackendFallbackLog(logging.Handler):
    """Records the graphs whose backend compile failed with an error Dynamo turns into a graph break
    (it logs a warning and runs that code uncompiled): the capture would otherwise look complete."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = str(record.msg)
        if not text.startswith("Backend compiler exception"):
            return
        explanation = next((line.strip() for line in text.splitlines() if "Explanation:" in line), text.splitlines()[0])
        message = "BackendCompilerFailed: " + explanation.replace("Explanation:", "").strip()
        if message not in self.errors:
            self.errors.append(message)
