"""A fast slice of the load fuzz (bench/load_fuzz.py; bench/stress.py --parts load runs 5,000 cases):
mutated caches through `precompile.load`, each in a forked, sandboxed, memory-limited process. Every
load serves, degrades with a PrecompileWarning or raises PrecompileError; none raises anything else,
hangs, runs out of memory, writes outside Inductor's and Triton's cache dirs or maps a shared library
from outside the extracted bundle and the installs. The slice holds a FIFO cache, a FIFO at a bundle
destination, a zstd bomb and hostile bundle paths beside the common mutations."""
from __future__ import annotations

import pytest

from bench import load_fuzz

CASES = [*range(120), 139, 173]
"""The first 120 cases, and the first to name a bundle path triton/0/<absolute> and triton/x."""
WATCHDOG_S = 5.0
"""A case serves in a tenth of a second; this bounds the FIFO cases' cost if load hangs on them."""


def describe(result: dict) -> str:
    return (f"case {result['case']} ({result['label']}): {result['outcome']} {result['detail'][:160]}"
            f"{' writes ' + str(result['outside'][:2]) if result['outside'] else ''}"
            f"{' maps ' + str(result['foreign'][:2]) if result['foreign'] else ''}")


def test_the_slice_holds_the_slow_mutations():
    rare = {load_fuzz.rare_mutation(case)[0].__name__ for case in CASES if load_fuzz.rare_mutation(case)}
    assert rare == {"mutate_fifo_cache", "mutate_fifo_destination", "lie_bomb"}


def test_the_slice_signs_pairs_every_way_it_loads_them_under_pins():
    drawn = {load_fuzz.signed.draw("0", case) for case in CASES}
    assert drawn - {None} == set(load_fuzz.signed.SCHEMES)


def test_mutated_caches_are_served_degraded_or_refused(tmp_path):
    results = load_fuzz.fuzz(CASES, seed="0", failures=tmp_path / "failures", watchdog_s=WATCHDOG_S)
    assert len(results) == len(CASES)
    failing = [describe(result) for result in results if load_fuzz.failed(result)]
    assert not failing, f"{len(failing)} of {len(results)} loads failed (inputs under {tmp_path / 'failures'}):\n" + "\n".join(failing)
