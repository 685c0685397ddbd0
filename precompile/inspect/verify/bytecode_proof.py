"""verify's proof that a cache's bytecode is its python_code's, run in a child process whose memory
and time are bounded, so that what a cache carries cannot make verify (or diff) take the machine.

The proof compiles python_code again as capture did and compares the marshalled bytes
(artifact/bytecode_check.py): whole, or a part at a time for python_code stored so (over 1 MiB:
artifact/code_parts.py), then in the memory of a part. Compiling whole takes about 40 bytes of
memory per byte of literal-heavy python_code and up to 150 per byte of dense code (measured on
Python 3.11; the syntax tree `ast` builds, which the proof never holds whole, takes 250). So the
child gets an address-space limit (RLIMIT_AS, above what it maps when it starts) of `--proof-memory`
MiB, else PRECOMPILE_PROOF_MEMORY, else 50 times python_code's size, at least 256 MiB and at most
1.5 GiB (so that each process stays under 2 GB unless told otherwise; 110 MB stored in parts is
proven within it, at 1.26 GB), and a time limit of a minute plus 4 seconds per MB. A proof that
needs more is not made: the check fails with "not proven" and says how to allow more. Nothing is
loaded or run.

diff's two proofs run in one child, one after the other, under the larger bound and the sum of the
time limits: the second parses and walks only the parts of its python_code the first did not have
(`chunked_parse.read_parts`, told by text), so two releases that differ in one place cost about one
proof and a compile.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from precompile.artifact import bytecode, bytecode_check, opaque_state
from precompile.artifact.envelope import CompiledCode
from precompile.artifact.pycode import code_hash, decode_source
from precompile.errors import PrecompileError, cause_of
from precompile.inspect.parsing.chunked_parse import parsed_chunks, read_parts

PROOF_MEMORY_ENV = "PRECOMPILE_PROOF_MEMORY"
MIN_PROOF_MEMORY = 256 * 1024 * 1024
MAX_DEFAULT_PROOF_MEMORY = 1536 * 1024 * 1024
"""The most a proof takes unless told to take more: with the reading verb beside it, under 2 GB a process."""
_MORE_THAN_ANY_MACHINE = 1 << 60
MEMORY_PER_BYTE = 50
NOT_PROVEN = "not proven"
_MiB = 1024 * 1024
_CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from precompile.inspect.verify.bytecode_proof import child_main; child_main()"
_SAFE_PATH = ("-P",) if sys.version_info >= (3, 11) else ()
_Request = tuple[str, bytes, CompiledCode]
Request = tuple[bytes, str, CompiledCode, int]
"""What `prove` takes: python_code's bytes, their sha256, the stored bytecode, the memory bound."""


@dataclass(frozen=True)
class Outcome:
    problem: str | None = None
    """Why the bytecode is not python_code's; None when proven (and not_proven is None)."""
    not_proven: str | None = None
    """Why the proof was not made (memory or time over its bound, the child failed)."""


def proof_memory(python_code_size: int, given_mib: int | None = None) -> int:
    """Bytes the proof may map: `given_mib` (--proof-memory), else PRECOMPILE_PROOF_MEMORY (MiB),
    else MEMORY_PER_BYTE * python_code_size, at least MIN_PROOF_MEMORY and at most MAX_DEFAULT_PROOF_MEMORY."""
    if given_mib is None and os.environ.get(PROOF_MEMORY_ENV, "").strip():
        text = os.environ[PROOF_MEMORY_ENV].strip()
        if not text.isdigit() or int(text) < 1:
            raise PrecompileError(f"{PROOF_MEMORY_ENV}={text!r} is not a whole number of MiB (1 or more): set it to, e.g., 4096")
        given_mib = int(text)
    if given_mib is not None:
        return min(given_mib * _MiB, _MORE_THAN_ANY_MACHINE)  # a larger number would overflow setrlimit's C long
    return min(MAX_DEFAULT_PROOF_MEMORY, max(MIN_PROOF_MEMORY, MEMORY_PER_BYTE * python_code_size))


def proof_seconds(python_code_size: int) -> float:
    return 60 + 4 * python_code_size / 1e6


def start(*requests: Request) -> None:
    """Begin the proofs `prove` will be asked for with these arguments now, in one child, so that they
    run while the caller goes on reading (verify and diff start them before they parse python_code);
    `prove` with the same arguments collects each. A child that cannot start is left to `prove` to
    report; a request proven or started already is not started again."""
    fresh: dict[tuple[str, str, int], Request] = {}
    for request in requests:
        key = _key(*request[1:])
        if key not in _in_flight and key not in _made:
            fresh.setdefault(key, request)
    if fresh:
        with contextlib.suppress(OSError):
            running = _Running(list(fresh.values()))
            for index, key in enumerate(fresh):
                _in_flight[key] = running, index


def prove(python_code: bytes, digest: str, compiled: CompiledCode, memory: int) -> Outcome:
    """Whether `compiled` is `python_code` (sha256 `digest`) compiled here: bytecode.bytecode_problem,
    in a child limited to `memory` bytes more than it maps at start, and to proof_seconds (counted
    from when it started, by `start` or here)."""
    key = _key(digest, compiled, memory)
    if key in _made:  # the same request proven again (diff of a pair and its copy): the same answer
        return _made[key]
    running, index = _in_flight.pop(key, (None, 0))
    if running is None:
        try:
            running = _Running([(python_code, digest, compiled, memory)])
        except OSError as exc:
            return Outcome(not_proven=f"the proof's process could not start: {exc.strerror or exc}")
    outcome = _made[key] = running.outcome(index)
    return outcome


_in_flight: dict[tuple[str, str, int], tuple[_Running, int]] = {}
_made: dict[tuple[str, str, int], Outcome] = {}


def _key(digest: str, compiled: CompiledCode, memory: int) -> tuple[str, str, int]:
    """A proof's request, whole: every field of the stored bytecode counts (its sha256 covers only
    its bytes; a blob resealed with another filename or left_out list is another request)."""
    return digest, hashlib.sha256(msgspec.msgpack.encode(compiled)).hexdigest(), memory


class _Running:
    """One child proving `requests` in order, started: they are handed over in an unnamed temporary
    file, so that starting never waits for the child to read them. It may map the largest of their
    bounds and take the sum of their time limits; it prints one answer a request."""

    def __init__(self, requests: list[Request]) -> None:
        root = str(Path(__file__).resolve().parents[3])  # the folder holding the precompile package
        self.sizes = [len(python_code) for python_code, *_ in requests]
        self.memory = max(memory for *_, memory in requests)
        self.seconds = sum(map(proof_seconds, self.sizes))
        self.deadline = time.monotonic() + self.seconds
        self.answers: tuple[int, list[str], bytes, bool] | None = None
        with tempfile.TemporaryFile() as handed:
            handed.write(msgspec.msgpack.encode([(digest, python_code, compiled) for python_code, digest, compiled, _ in requests]))
            handed.seek(0)
            self.proc = subprocess.Popen([sys.executable, *_SAFE_PATH, "-c", _CHILD, root, str(self.memory)], stdin=handed,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root)
        atexit.register(self._stop)

    def _stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def outcome(self, index: int) -> Outcome:
        if self.answers is None:
            atexit.unregister(self._stop)
            timed_out = False
            try:
                stdout, stderr = self.proc.communicate(timeout=max(0.0, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._stop()
                stdout, stderr = self.proc.communicate()
                timed_out = True
            lines = [line for line in stdout.decode("utf-8", "replace").splitlines() if line.strip()]
            self.answers = self.proc.returncode, lines, stderr, timed_out
        returncode, lines, stderr, timed_out = self.answers
        size = self.sizes[index]
        if index < len(lines):
            return _answer(lines[index], 0, b"", size, self.memory)
        if timed_out:
            return Outcome(not_proven=f"the proofs took over {self.seconds:.0f} s (python_code is {size} bytes)")
        # Unanswered: the memory limit stopped the child (its last line says so), or it failed.
        return _answer(lines[-1] if lines and lines[-1] == _MEMORY_LINE else None, returncode, stderr, size, self.memory)


_MEMORY_LINE = '{"memory": true}'


def _answer(line: str | None, returncode: int, stderr: bytes, size: int, memory: int) -> Outcome:
    allow = f"allow more with --proof-memory MIB or {PROOF_MEMORY_ENV}=MIB and verify again"
    try:
        answer = json.loads(line) if returncode == 0 and line is not None else None
    except ValueError:
        answer = None
    if isinstance(answer, dict) and "problem" in answer:
        return Outcome(problem=answer["problem"])
    if isinstance(answer, dict) and answer.get("memory") or b"MemoryError" in stderr or returncode < 0:
        return Outcome(not_proven=f"compiling python_code ({size} bytes) needs more than the "
                                  f"{memory // _MiB} MiB the proof may take; {allow}")
    tail = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit status {returncode}"]
    return Outcome(not_proven=f"the proof's process failed ({tail[0][:300]})")


def child_main() -> None:
    """The child: limit its memory (argv[2] bytes above what it maps now), read the requests from
    stdin, print {"problem": ...} for each in turn, or {"memory": true} when the limit was reached
    (and stop). It runs with the cyclic collector off (the trees and code objects it builds hold no
    cycles; collections walking them took a fifth of its time) and exits without freeing what it built."""
    gc.disable()
    _limit_address_space(int(sys.argv[2]))
    known: dict[bool, dict] = {False: {}, True: {}}  # part facts by the sha256 of a part's text, walked or not
    try:
        requests = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=list[_Request])
        while requests:
            digest, python_code, compiled = requests.pop(0)
            if code_hash(python_code) != digest:
                problem: str | None = "python_code is not the file verify read"
            else:
                source = decode_source(python_code)
                del python_code  # its text is all the proof reads from here
                problem = _problem(source, digest, compiled, known)
                del source
            sys.stdout.write(json.dumps({"problem": problem}) + "\n")
            sys.stdout.flush()
    except MemoryError:
        os.write(1, b"\n" + _MEMORY_LINE.encode() + b"\n")  # on a line of its own, whatever was half written
    os._exit(0)


def _problem(source: str, digest: str, compiled: CompiledCode, known: dict[bool, dict]) -> str | None:
    """bytecode_problem, from the facts of python_code's parts (`known` holds those of the parts
    proven before in this child, by text and by whether they were walked for opaque parts), or from
    its trees where the stored bytecode leaves literals out (that proof needs the whole tree)."""
    parts: bytecode.Statements
    if compiled.left_out:
        parts = parsed_chunks(source, filename="python_code")
    else:
        named = opaque_state.mentioned(source)
        read = functools.partial(bytecode.part_facts, opaque=named)
        parts = read_parts(source, filename="python_code", read=read, known=known[named])
    try:
        return bytecode_check.bytecode_problem(source, digest, compiled, parts)
    except PrecompileError as exc:
        if cause_of(exc, MemoryError) is not None:
            raise MemoryError from None
        return str(exc)


def _limit_address_space(extra: int) -> None:
    """RLIMIT_AS to what this process maps now plus `extra` (Linux: /proc/self/status; elsewhere the
    time limit alone bounds the proof)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + extra
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
