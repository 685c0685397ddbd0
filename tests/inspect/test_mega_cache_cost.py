"""Scanning a Mega-Cache costs work bounded per blob and linear in its size, whatever its entries do:
a memoized string encoded again and again is scanned once, one budget bounds all the entries of a
blob, and a memoized dict BUILT again and again is not copied past a bound. What a limit stops is
reported as a finding, never a crash."""
from __future__ import annotations

import pickle
import time

from test_inspect_helpers import run_cli
from test_mega_cache_entries import _mega_cache

from precompile.inspect.formats.mega_cache import read_mega_cache

CPU_BOUND_S = 2.0
"""Well above what each blob here costs (~0.1 CPU-s), well below what it cost before (10-25 CPU-s)."""


def _unicode(text: str) -> bytes:
    data = text.encode("utf-8")
    return b"X" + len(data).to_bytes(4, "little") + data  # BINUNICODE


def encodes_of_a_memoized_string(size: int = 50_000, calls: int = 5_000) -> bytes:
    """A pickle that memoizes a string holding a pickle (importing os.system) and has _codecs.encode
    turn it into bytes `calls` times: each is a nested pickle, the same one."""
    inner = "\x80\x02cos\nsystem\n0" + "N0" * ((size - 16) // 2) + "N."
    return (b"\x80\x02c_codecs\nencode\nq\x00" + _unicode(inner) + b"q\x01" + _unicode("latin1") + b"q\x02"
            + b"h\x00h\x01h\x02\x86R0" * calls + b"N.")


def builds_of_a_memoized_dict(items: int = 20_000, calls: int = 8_000) -> bytes:
    """A pickle that fills a dict of `items` entries, memoized, and sets it as state `calls` times."""
    return (b"\x80\x02}q\x01(" + b"".join(b"M" + i.to_bytes(2, "little") + b"N" for i in range(items)) + b"u]"
            + b"h\x01b" * calls + b".")


def _show(capsys, tmp_path, blob: bytes) -> tuple[int, str, str, float]:
    path = tmp_path / "blob.bin"
    path.write_bytes(blob)
    started = time.process_time()
    rc, out, err = run_cli(capsys, ["show", str(path)])
    return rc, out, err, time.process_time() - started


def test_a_memoized_string_encoded_thousands_of_times_is_scanned_once(capsys, tmp_path):
    blob = _mega_cache([("inductor", "k", encodes_of_a_memoized_string())])
    assert len(blob) < 100_000
    rc, out, err, spent = _show(capsys, tmp_path, blob)
    assert spent < CPU_BOUND_S, spent
    assert rc == 1 and "os.system (dangerous)" in err, (out, err)  # what the nested pickle imports is still found


def test_a_memoized_dict_built_again_and_again_stops_the_scan_at_a_bound(capsys, tmp_path):
    blob = _mega_cache([("inductor", "k", builds_of_a_memoized_dict())])
    assert len(blob) < 110_000
    rc, out, err, spent = _show(capsys, tmp_path, blob)
    assert spent < CPU_BOUND_S, spent
    assert rc == 1 and "the states BUILD sets hold more than 1000000 items" in out + err, (out, err)


def test_one_budget_bounds_all_the_entries_of_a_blob(monkeypatch):
    monkeypatch.setattr("precompile.artifact.pickle_machine.MAX_NESTED_BYTES", 10_000)
    nested = pickle.dumps([b"x" * 6_000], protocol=4)
    content = pickle.dumps({"blob": nested}, protocol=4)
    found = read_mega_cache(_mega_cache([("inductor", "a", content), ("inductor", "b", content)]), where="blob")
    first, second = (entry.scan for entry in found.entries)
    assert first is not None and second is not None
    assert first.problem is None and first.nested == 1
    assert "past the nested-scan limits" in (second.problem or ""), second

