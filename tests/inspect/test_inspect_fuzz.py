"""Thousands of seeded random mutations of a fixture's cache and python_code: every one gives exit
0, 1 or 2 with a clean report or a clean error, never a traceback or a hang; and hostile python_code
whose statements, metadata and pickled state would create a canary file is never run by any verb.
(bench/stress.py runs the same checks at scale and prints the figures.)"""
from __future__ import annotations

import base64
import contextlib
import io
import pickle
import random
import re
import shutil
import signal

import pytest

from test_inspect_helpers import FIXTURES

CASES = 1500
WATCHDOG_S = 120.0
"""A hang guard, not a speed target: a call takes well under a second, so only a real hang reaches it."""


class Hang(BaseException):
    """Raised into a call that ran past the watchdog (a BaseException, so no handler swallows it)."""


@contextlib.contextmanager
def watchdog(seconds: float = WATCHDOG_S):
    def expire(signum, frame):
        raise Hang(f"no answer within {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        kind = rng.randrange(4)
        if kind == 0 and data:
            del data[rng.randrange(len(data)) :]
        elif kind == 1 and data:
            index = rng.randrange(len(data))
            data[index] ^= 1 << rng.randrange(8)
        elif kind == 2:
            index = rng.randrange(len(data) + 1)
            data[index:index] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        elif data:
            index = rng.randrange(len(data))
            data[index] = rng.choice((0, 0xFF, 0x7F, 0x80, ord("("), ord("'"), ord("\n")))
    return bytes(data)


_PARSER = []


def _run(argv) -> int:
    from rich.console import Console

    from precompile.cli.main import build_parser
    from precompile.errors import PrecompileError

    if not _PARSER:
        _PARSER.append(build_parser())
    args = _PARSER[0].parse_args(["--color", "never", *argv])
    out = Console(file=io.StringIO(), no_color=True, soft_wrap=True)
    err = Console(file=io.StringIO(), no_color=True, soft_wrap=True)
    try:
        with watchdog():
            return args.handler(args, out, err)
    except PrecompileError:
        return 2


@pytest.mark.parametrize("target", ["cache", "python_code"])
def test_fuzz(tmp_path, target):
    rng = random.Random(f"inspect-fuzz-{target}")
    base = {
        "python_code": (FIXTURES / "v1/mlp_inductor.py").read_bytes(),
        "cache": (FIXTURES / "v1/mlp_inductor.cache").read_bytes(),
    }
    zip_cache = (FIXTURES / "damaged/upstream.cache").read_bytes()
    py, cache = tmp_path / "f.py", tmp_path / "f.cache"
    codes = set()
    for case in range(CASES):
        python_code = base["python_code"]
        cache_bytes = base["cache"]
        if target == "cache":
            cache_bytes = _mutate(rng, zip_cache if case % 5 == 0 else cache_bytes)
        else:
            # the banner and metadata sections: where the reader looks hardest
            python_code = _mutate(rng, python_code[: python_code.index(b"\n# 2. ")])
        py.write_bytes(python_code)
        cache.write_bytes(cache_bytes)
        verb = ("verify", "show", "guards", "diff")[case % 4]
        if verb == "diff":
            rc = _run(["diff", str(tmp_path / "f"), str(FIXTURES / "v1/mlp")])
        else:
            rc = _run([verb, str(py), str(cache)])
        assert rc in (0, 1, 2), (case, verb)
        codes.add(rc)
    assert {1, 2} <= codes or {0, 2} <= codes


class Canary:
    """Unpickling this creates the canary file."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def canary_python_code(source: str, canary) -> str:
    """`source` with code that creates `canary` wherever something could run it: a top-level statement,
    a metadata literal that is really a call, a decorator, and the pickled Dynamo state."""
    touch = f"__import__('pathlib').Path({str(canary)!r}).touch()"
    source = source.replace("\nFORMAT_VERSION = ", f"\n{touch}\nFORMAT_VERSION = ", 1)
    source = re.sub(r"\nFN_NAME = .*", lambda m: f"{m.group(0)}\nCANARY = {touch}", source, count=1)
    source += f"\n@(lambda f: {touch})\ndef _canary():\n    pass\n"
    blob = base64.b64encode(pickle.dumps(Canary(canary), protocol=2)).decode()
    return re.sub(r"\n_dynamo_state = \((?:\n    '[^']*')+\n\)", lambda m: f"\n_dynamo_state = (\n    {blob!r}\n)", source, count=1)


HOSTILE = ("99", "None", "'x'", "{}", "[" * 150 + "]" * 150, "1" + "0" * 5000, "__import__('os').getpid()", "'" + "A" * 10**6 + "'")


def _mutate_source(rng: random.Random, source: str) -> str:
    names = re.findall(r"(?m)^([A-Z_][A-Z_0-9]*) = ", source)
    kind = rng.randrange(3)
    if kind == 0:  # a metadata literal changed
        name = rng.choice(names)
        return re.sub(rf"(?m)^{name} = .*$", lambda m: f"{name} = {rng.choice(HOSTILE)}", source, count=1)
    if kind == 1:  # syntax damage in the banner and metadata
        index = rng.randrange(len(source) // 2)
        return source[:index] + rng.choice(("(", "'", "\n", ":", "\x00", '"""')) + source[index:]
    return source  # the canary payloads alone


def test_the_canary_payloads_would_fire(tmp_path):
    """The hostile python_code below is really hostile: running it or unpickling its state creates the file."""
    canary = tmp_path / "CANARY"
    source = canary_python_code((FIXTURES / "v1/dynamo_rows.py").read_text(), canary)
    exec(next(line for line in source.splitlines() if "touch()" in line), {})  # noqa: S102
    assert canary.exists()
    canary.unlink()
    blob = re.search(r"\n_dynamo_state = \(\n    '([^']*)'", source).group(1)
    pickle.loads(base64.b64decode(blob))  # noqa: S301
    assert canary.exists()


def test_no_verb_runs_hostile_python_code(tmp_path):
    canary = tmp_path / "CANARY"
    rng = random.Random("inspect-canary")
    sources = {name: canary_python_code((FIXTURES / f"v1/{name}.py").read_text(), canary) for name in ("mlp", "dynamo_rows")}
    py, cache = tmp_path / "f.py", tmp_path / "f.cache"
    for case in range(300):
        name = rng.choice(tuple(sources))
        py.write_text(_mutate_source(rng, sources[name]))
        cache.write_bytes((FIXTURES / f"v1/{name}.cache").read_bytes())
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
        verb = ("show", "guards", "verify", "diff", "extract")[case % 5]
        argv = {
            "diff": ["diff", str(tmp_path / "f"), str(FIXTURES / f"v1/{name}")],
            "extract": ["extract", str(py), str(cache), str(tmp_path / "out")],
        }.get(verb, [verb, str(py), str(cache)])
        assert _run(argv) in (0, 1, 2), (case, verb)
    assert not canary.exists()
