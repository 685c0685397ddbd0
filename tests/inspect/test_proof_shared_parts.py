"""diff's two proofs run in one child: the second python_code is proven from the facts of the parts
the first had (by text) and parses only the rest, and each answer is the one it gets proven alone."""
from __future__ import annotations

import msgspec
import pytest
from conftest import ROOT

from precompile.artifact import bytecode
from precompile.artifact.pycode import code_hash, decode_source, parse_metadata, parse_source
from precompile.inspect.parsing import chunked_parse
from precompile.inspect.verify import bytecode_proof

BASE = (ROOT / "fixtures" / "v1" / "dynamo_rows.py").read_bytes()
# A non-canonical opaque part: load's rule finds a problem that names its line, which moves below.
OPAQUE_TAIL = b"\n_dynamo_state = 'a' + 'b'\n"


def _sealed(data: bytes):
    source = decode_source(data)
    tree = parse_source(source)
    compiled, _ = bytecode.prepare(source, code_hash(data), parse_metadata(tree), tree)
    return source, code_hash(data), compiled


def _proven(order, known=None):
    known = {False: {}, True: {}} if known is None else known
    return [bytecode_proof._problem(source, digest, compiled, known) for source, digest, compiled in order]


@pytest.fixture
def parses(monkeypatch):
    """The texts parsed, python_code cut into parts of about 2,000 characters (the fixture's 38 KB:
    several parts)."""
    monkeypatch.setattr(chunked_parse, "CHUNK_CHARS", 2000)
    counted = []
    parse = chunked_parse._read
    monkeypatch.setattr(chunked_parse, "_read", lambda text, *rest: counted.append(text) or parse(text, *rest))
    return counted


@pytest.mark.parametrize("tail", [b"", OPAQUE_TAIL], ids=["plain", "opaque problem"])
def test_a_release_proven_after_another_parses_only_its_own_parts_and_is_proven_as_alone(parses, tail):
    first = _sealed(BASE + tail)
    second = _sealed(b"RELEASE_NOTE = 2\n" + BASE + tail)  # every line of the first, one lower
    assert bool(first[2].opaque.problems) == bool(tail)
    assert _proven([first, second]) == [None, None]
    after_first = len(parses) - len(_parsed_alone(first, parses))
    assert _proven([second]) == [None]
    alone = len(_parsed_alone(second, parses))
    assert alone >= 5 and 0 < after_first <= 2  # the part where the second differs (its first), no other
    known = {False: {}, True: {}}
    assert _proven([second, first, second, first], known) == [None] * 4  # nothing shared was moved in place


def _parsed_alone(release, parses) -> list[str]:
    parses.clear()
    assert _proven([release]) == [None]
    counted = list(parses)
    parses.clear()
    return counted


def test_a_forged_release_proven_after_a_good_one_is_caught_as_alone():
    first = _sealed(BASE + OPAQUE_TAIL)
    shifted = _sealed(b"RELEASE_NOTE = 2\n" + BASE + OPAQUE_TAIL)
    # The second's bytecode, with the first's record of the opaque rule (its problem at the old line).
    forged = (shifted[0], shifted[1], msgspec.structs.replace(shifted[2], opaque=first[2].opaque))
    problems = _proven([first, forged])
    assert problems[0] is None
    assert problems[1] == _proven([forged])[0] and "opaque-state rule" in problems[1]


def test_one_child_answers_each_request_in_turn(monkeypatch):
    monkeypatch.setattr(bytecode_proof, "_made", {})
    monkeypatch.setattr(bytecode_proof, "_in_flight", {})
    good = _sealed(BASE)
    other = _sealed(b"RELEASE_NOTE = 2\n" + BASE)
    forged = (other[0], other[1], msgspec.structs.replace(other[2], filename="<elsewhere>"))
    requests = [(source.encode(), digest, compiled, bytecode_proof.proof_memory(len(source))) for source, digest, compiled in (good, forged)]
    bytecode_proof.start(*requests)
    assert len({id(running) for running, _ in bytecode_proof._in_flight.values()}) == 1
    outcomes = [bytecode_proof.prove(*request) for request in reversed(requests)]  # collected in any order
    assert outcomes[1] == bytecode_proof.Outcome()
    assert "compiled as '<elsewhere>'" in outcomes[0].problem
