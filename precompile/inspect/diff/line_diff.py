"""A unified line diff whose time and memory grow with its inputs, never with their product.

difflib's SequenceMatcher is quadratic on long sequences (a file where every other line changed
takes minutes at a megabyte). Here lines are interned to integers and matched region by region:
the common prefix and suffix first; then, in a small region, difflib itself (its output is the one
people know); in a large one, the lines that occur exactly once on each side, kept where they are in
the same order (their longest increasing run, patience-diff style), which split the region into
smaller ones. The work is capped at a multiple of the input's length: past it, a region left is
reported as replaced wholesale, which is still a correct diff, only a less minimal one. The
rendering is capped as well: past `max_lines` changed lines, the rest are counted, not shown.
"""
from __future__ import annotations

import bisect
import difflib
import hashlib
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import NamedTuple

Opcode = tuple[str, int, int, int, int]
Block = tuple[int, int, int]
"""A run of equal lines: its start in a, its start in b, its length."""

SMALL_REGION = 250_000
"""A region is matched by difflib when the product of its two lengths is at most this."""
DIFFLIB_BUDGET = 10_000_000
"""The sum of those products over one diff; past it, regions are matched by unique lines only. The
worst region found for difflib at the cap (1250 x 199 lines of two values) takes 0.06 s: a few
seconds in all at worst."""
WORK_PER_LINE = 16
"""Lines visited by the unique-line matching, per line of input, before what is left is replaced."""
MAX_SHOWN_CHARS = 2000
"""A longer line is shown as its head, its length and its sha256."""


def _interned(a: Sequence[str], b: Sequence[str]) -> tuple[list[int], list[int]]:
    ids: dict[str, int] = {}
    return [ids.setdefault(line, len(ids)) for line in a], [ids.setdefault(line, len(ids)) for line in b]


def _unique_anchors(a: Sequence[int], b: Sequence[int], alo: int, ahi: int, blo: int, bhi: int) -> list[tuple[int, int]]:
    """(i, j) of the lines found exactly once in a[alo:ahi] and once in b[blo:bhi], in the order of
    both: the longest run of them increasing in j as i increases."""
    count_a = Counter(a[alo:ahi])
    count_b = Counter(b[blo:bhi])
    where_b = {b[j]: j for j in range(blo, bhi) if count_b[b[j]] == 1}
    pairs = [(i, where_b[a[i]]) for i in range(alo, ahi) if count_a[a[i]] == 1 and a[i] in where_b]
    return _longest_increasing(pairs)


def _longest_increasing(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest subsequence of `pairs` (sorted by i) whose j increases too (patience sorting)."""
    tails: list[int] = []
    tail_index: list[int] = []
    previous: list[int] = []
    for index, (_, j) in enumerate(pairs):
        pile = bisect.bisect_left(tails, j)
        previous.append(tail_index[pile - 1] if pile else -1)
        if pile == len(tails):
            tails.append(j)
            tail_index.append(index)
        else:
            tails[pile] = j
            tail_index[pile] = index
    chain = []
    index = tail_index[-1] if tail_index else -1
    while index >= 0:
        chain.append(pairs[index])
        index = previous[index]
    return chain[::-1]


class _Matcher:
    """Matching blocks of two interned sequences, within the work caps of the module."""

    def __init__(self, a: list[int], b: list[int]) -> None:
        self.a, self.b = a, b
        self.blocks: list[Block] = []
        self.difflib_left = DIFFLIB_BUDGET
        self.work_left = WORK_PER_LINE * (len(a) + len(b)) + 100_000

    def match(self) -> list[Block]:
        regions = [(0, len(self.a), 0, len(self.b))]
        while regions:
            regions.extend(self._split(*regions.pop()))
        return sorted(self.blocks)

    def _split(self, alo: int, ahi: int, blo: int, bhi: int) -> list[tuple[int, int, int, int]]:
        """Record the matches of one region that need no further search; the regions left to search."""
        if self._by_difflib(alo, ahi, blo, bhi):
            return []
        alo, ahi, blo, bhi = self._trimmed(alo, ahi, blo, bhi)
        if alo == ahi or blo == bhi or self._by_difflib(alo, ahi, blo, bhi):
            return []
        self.work_left -= (ahi - alo) + (bhi - blo)
        if self.work_left < 0:
            return []
        anchors = _unique_anchors(self.a, self.b, alo, ahi, blo, bhi)
        self.blocks.extend((i, j, 1) for i, j in anchors)
        bounds = [(alo - 1, blo - 1), *anchors, (ahi, bhi)]
        return [(i + 1, i2, j + 1, j2) for (i, j), (i2, j2) in zip(bounds, bounds[1:]) if i + 1 < i2 and j + 1 < j2]

    def _trimmed(self, alo: int, ahi: int, blo: int, bhi: int) -> tuple[int, int, int, int]:
        """The region without its common prefix and suffix, which are recorded as matches."""
        a, b = self.a, self.b
        start = 0
        while alo + start < ahi and blo + start < bhi and a[alo + start] == b[blo + start]:
            start += 1
        end = 0
        while alo + start < ahi - end and blo + start < bhi - end and a[ahi - end - 1] == b[bhi - end - 1]:
            end += 1
        if start:
            self.blocks.append((alo, blo, start))
        if end:
            self.blocks.append((ahi - end, bhi - end, end))
        return alo + start, ahi - end, blo + start, bhi - end

    def _by_difflib(self, alo: int, ahi: int, blo: int, bhi: int) -> bool:
        """Match the region with difflib when it is small enough (and the budget allows); whether it did."""
        size = (ahi - alo) * (bhi - blo)
        if size > SMALL_REGION or size > self.difflib_left:
            return False
        self.difflib_left -= size
        matcher = difflib.SequenceMatcher(None, self.a[alo:ahi], self.b[blo:bhi])
        self.blocks.extend((alo + i, blo + j, n) for i, j, n in matcher.get_matching_blocks() if n)
        return True


def opcodes(a: Sequence[str], b: Sequence[str]) -> list[Opcode]:
    """How to turn a into b, as difflib's `get_opcodes` spells it."""
    ia, ib = _interned(a, b)
    result: list[Opcode] = []
    i = j = 0
    for bi, bj, size in [*_Matcher(ia, ib).match(), (len(a), len(b), 0)]:
        tag = "replace" if i < bi and j < bj else "delete" if i < bi else "insert" if j < bj else ""
        if tag:
            result.append((tag, i, bi, j, bj))
        if size:
            if result and result[-1][0] == "equal":
                _, ei, _, ej, _ = result.pop()
                result.append(("equal", ei, bi + size, ej, bj + size))
            else:
                result.append(("equal", bi, bi + size, bj, bj + size))
        i, j = bi + size, bj + size
    return result


def _hunks(codes: list[Opcode], context: int) -> Iterator[list[Opcode]]:
    """The opcodes grouped into hunks with `context` equal lines around each change (difflib's grouping)."""
    if all(code[0] == "equal" for code in codes):
        return
    codes = list(codes)
    if codes[0][0] == "equal":
        _, i1, i2, j1, j2 = codes[0]
        codes[0] = ("equal", max(i1, i2 - context), i2, max(j1, j2 - context), j2)
    if codes[-1][0] == "equal":
        _, i1, i2, j1, j2 = codes[-1]
        codes[-1] = ("equal", i1, min(i2, i1 + context), j1, min(j2, j1 + context))
    group: list[Opcode] = []
    for tag, i1, i2, j1, j2 in codes:
        if tag == "equal" and i2 - i1 > 2 * context:
            group.append((tag, i1, min(i2, i1 + context), j1, min(j2, j1 + context)))
            yield group
            group = []
            i1, j1 = max(i1, i2 - context), max(j1, j2 - context)
        group.append((tag, i1, i2, j1, j2))
    if group and not (len(group) == 1 and group[0][0] == "equal"):
        yield group


def _range(start: int, stop: int) -> str:
    """A hunk range as unified diffs write it (difflib's `_format_range_unified`)."""
    length = stop - start
    first = start + 1 if length else start
    return str(first) if length == 1 else f"{first},{length}"


def shown(line: str) -> str:
    """A line as a diff prints it: as it is, or past MAX_SHOWN_CHARS its head, length and digest."""
    if len(line) <= MAX_SHOWN_CHARS:
        return line
    digest = hashlib.sha256(line.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{line[:MAX_SHOWN_CHARS]}... [line of {len(line)} characters, sha256 {digest}]"


def around_change(a: str, b: str, width: int) -> tuple[str, str]:
    """Two values that differ, each cut to about `width` characters around where they first differ
    (a long guard value that changed past its head shows the change, not only the head it shares),
    with what was cut said: "[N characters] ..." before, "... [N characters]" after."""
    if len(a) <= width and len(b) <= width:
        return a, b
    common = 0
    for x, y in zip(a, b):
        if x != y:
            break
        common += 1
    start = max(0, common - width // 4)

    def cut(text: str) -> str:
        if len(text) <= width:
            return text
        head = f"[{start} characters] ..." if start else ""
        end = min(len(text), start + width)
        tail = f"... [{len(text) - end} characters]" if end < len(text) else ""
        return f"{head}{text[start:end]}{tail}"

    return cut(a), cut(b)


class Unified(NamedTuple):
    lines: tuple[str, ...]
    shown: int
    """Changed lines shown (`-` and `+` lines)."""
    left_out: int
    """Changed lines counted but not shown, past the `max_lines` asked for."""


def unified(a: Sequence[str], b: Sequence[str], from_name: str, to_name: str, *, context: int, max_lines: int) -> Unified:
    """A unified diff of a and b (difflib's format), showing at most `max_lines` changed lines."""
    out: list[str] = []
    changed = left_out = 0
    for group in _hunks(opcodes(a, b), max(context, 0)):
        if not out:
            out += [f"--- {from_name}", f"+++ {to_name}"]
        if changed >= max_lines:
            left_out += sum(i2 - i1 + j2 - j1 for tag, i1, i2, j1, j2 in group if tag != "equal")
            continue
        first, last = group[0], group[-1]
        out.append(f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out.extend(" " + shown(line) for line in a[i1:i2] if changed < max_lines)
                continue
            for sign, lines in (("-", a[i1:i2]), ("+", b[j1:j2])):
                room = max(max_lines - changed, 0)
                out.extend(sign + shown(line) for line in lines[:room])
                changed += min(len(lines), room)
                left_out += max(len(lines) - room, 0)
    return Unified(tuple(out), changed, left_out)
