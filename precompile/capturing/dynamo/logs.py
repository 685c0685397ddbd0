"""What Dynamo only logs or counts during a capture: frames that hit the recompile limit, backend
compiles that failed with an error Dynamo turned into a graph break, and why it broke graphs."""
from __future__ import annotations

import logging
import re
from collections import Counter
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


class GraphBreakReasons:
    """Why Dynamo broke a graph or gave up on a frame while the capture ran (its graph_break counter,
    which torch.compile's explain reads too): a capture that compiled nothing says why (an nn.LSTM:
    "Dynamo does not support RNN, GRU, or LSTM", with Dynamo's hint)."""

    _GENERIC_HINTS = ("It may be possible to write Dynamo tracing rules", "Please report an issue")

    def __init__(self) -> None:
        from precompile.torch_compat import dynamo_counters

        self._counts = dynamo_counters["graph_break"]
        self._before = Counter(self._counts)

    def since(self) -> list[str]:
        """Each reason counted since the capture began, in Dynamo's words: its first line, explanation
        and the hints that name a remedy."""
        reasons = []
        for text, count in self._counts.items():
            if count > self._before.get(text, 0):
                reasons.append(self._brief(str(text)))
        return list(dict.fromkeys(reasons))

    @classmethod
    def _brief(cls, text: str) -> str:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        parts = [lines[0]] if lines else []
        for line in lines[1:]:
            if line.startswith("Explanation:"):
                parts.append(line.removeprefix("Explanation:").strip())
            elif line.startswith("Hint:") and not line.removeprefix("Hint:").strip().startswith(cls._GENERIC_HINTS):
                parts.append(line.removeprefix("Hint:").strip())
        return ": ".join(parts[:1] + ["; ".join(parts[1:])] if len(parts) > 1 else parts)[:400]
