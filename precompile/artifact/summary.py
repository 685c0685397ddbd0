"""PrecompileSummary: coverage and guard accounting of an observed capture (data only).

Torch-free, so inspect rebuilds it from an artifact's literals. `str(summary)` is the one-line
digest the spec defines; everything here describes the calls that ran, not every possible input.
A guard slot is (guard_type, source) with the local scope stripped (L['self'].act -> self.act).
"""

import re
from collections import Counter

import msgspec

Slot = tuple[str, str]

_OBJECT_IDS = re.compile(r"(?<![\w.])\d{9,}(?![\w.])|(?<= at )0x[0-9a-fA-F]+")


def without_object_ids(check: str) -> str:
    """A dropped guard's code with what names objects of the capturing process masked: an id
    (`___check_obj_id(x, 140234...)`) and an address (`<built-in method relu ... at 0x7ff3...>`), so
    the same capture in another process writes the same text (a decimal of 9 or more digits is
    taken for an id)."""
    return _OBJECT_IDS.sub("<id>", check)

_LIST_LIMIT = 5


class PrecompileSummary(msgspec.Struct, frozen=True, kw_only=True):
    frames: int
    resume_functions: int
    guarded_codes: int
    backend_graphs: int
    bypassed: tuple[str, ...] = ()
    truncated: tuple[str, ...] = ()
    uncovered_frames: tuple[str, ...] = ()
    wont_generalize: tuple[str, ...] = ()
    dropped_guards: tuple[Slot, ...] = ()
    kept_guards: tuple[Slot, ...] = ()
    risky_dropped_guards: tuple[Slot, ...] = ()
    policy_dropped_guards: tuple[Slot, ...] = ()
    dropped_guard_code: tuple[tuple[str, str, str], ...] = ()
    capture_errors: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """Coverage only: nothing bypassed, truncated, uncovered or raised, and something compiled."""
        return not (self.bypassed or self.truncated or self.uncovered_frames or self.capture_errors) and (
            self.guarded_codes > 0 and self.backend_graphs > 0
        )

    @property
    def dropped_guard_types(self) -> dict[str, int]:
        return dict(Counter(guard_type for guard_type, _ in self.dropped_guards))

    @property
    def kept_guard_types(self) -> dict[str, int]:
        return dict(Counter(guard_type for guard_type, _ in self.kept_guards))

    def __str__(self) -> str:
        parts = [
            f"{_count(self.frames, 'frame')} ({self.resume_functions} from graph breaks)",
            _count(self.guarded_codes, "guarded code"),
            _count(self.backend_graphs, "backend graph"),
        ]
        if self.dropped_guards:
            parts.append(f"dropped guards {self.dropped_guard_types} ({len(self.kept_guards)} kept)")
        if self.risky_dropped_guards:
            parts.append("RISKY drops " + _first_five([f"{t} {s}" for t, s in self.risky_dropped_guards]))
        if self.policy_dropped_guards:
            parts.append(_count(len(self.policy_dropped_guards), "policy-dropped guard"))
        if self.wont_generalize:
            parts.append(_count(len(self.wont_generalize), "value-pinned source"))
        if self.uncovered_frames:
            parts.append(f"{len(self.uncovered_frames)} UNCOVERED: {_first_five(self.uncovered_frames)}")
        if self.truncated:
            parts.append(f">={len(self.truncated)} TRUNCATED: {_first_five(self.truncated)}")
        if self.bypassed:
            parts.append(f"{len(self.bypassed)} BYPASSED: {_first_five(self.bypassed)}")
        if self.capture_errors:
            label = "CAPTURE ERROR" if len(self.capture_errors) == 1 else "CAPTURE ERRORS"
            more = f" +{len(self.capture_errors) - 1} more" if len(self.capture_errors) > 1 else ""
            parts.append(f"{len(self.capture_errors)} {label}: {_first_line(self.capture_errors[0])!r}{more}")
        return ", ".join(parts)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _first_five(items) -> str:
    items = list(items)
    shown = repr(items[:_LIST_LIMIT])
    return shown if len(items) <= _LIST_LIMIT else f"{shown} +{len(items) - _LIST_LIMIT} more"


def _first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), "")
