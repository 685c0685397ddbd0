"""What `precompile diff` masks as a position must be digits where the renderer writes them, nothing that
says what load checks: load's INLINED_FILES proof skips re-reading a module's inlined lines where the
hashed spans still match, so a proof forged to cover no bytes (the sha256 of nothing) makes load serve
code whose inlined source changed. Such an edit must not diff equal against the artifact it came from."""
from __future__ import annotations

import hashlib

from precompile.inspect.diff import positions

REAL = """INLINED_FILES = ({'module': 'm',
  'sha256': '524f1dd54ea95a18e327562c685d1860cac0de237ea634afd8cf961731838b7f',
  'spans': ((0, 14), (15, 47), (49, 285))},)
"""
FORGED = REAL.replace("524f1dd54ea95a18e327562c685d1860cac0de237ea634afd8cf961731838b7f",
                      hashlib.sha256(b"").hexdigest()).replace("((0, 14), (15, 47), (49, 285))", "((0, 0),)")
MOVED = REAL.replace("((0, 14), (15, 47), (49, 285))", "((0, 14), (36, 68), (70, 306))")


def test_a_forged_inlined_files_proof_does_not_compare_equal():
    assert positions.compared(REAL, {}) != positions.compared(FORGED, {})


def test_a_proof_whose_spans_only_moved_compares_equal():
    assert positions.compared(REAL, {}) == positions.compared(MOVED, {})


RENDERED = """        "        failing = 'CONSTANT_MATCH G['settings'].SCALE'  # "
              'pkg/model.py:{line} in forward: return y * settings.SCALE\\n'
              '        if not (s1.SCALE == {value}):\\n'
"""


def test_a_rendered_check_whose_comment_only_moved_compares_equal_and_a_changed_one_not():
    """An installed variant's rendered checks (GUARDS' `rendered`) break the comment naming the user's
    line across string pieces: the line number is masked there too, the check itself is not."""
    before = positions.compared(RENDERED.format(line=70, value=2.0), {})
    assert positions.compared(RENDERED.format(line=75, value=2.0), {}) == before
    assert positions.compared(RENDERED.format(line=75, value=3.0), {}) != before
