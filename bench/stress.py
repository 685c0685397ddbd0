"""Reliability figures: hostile inputs through every inspect verb, save() killed at random points,
and several processes saving one pair at once.

    python bench/stress.py [--mutations 10000] [--jobs 1] [--kills 200] [--capture-kills 10]
                           [--writers 2-8] [--trials 5] [--subprocess 30] [--load-mutations 5000]
                           [--mega-cases 2000] [--seed 0] [--parts mutations,kills,concurrency,load,mega,cotenant]

1. Mutations: seeded mutations of real fixture pairs (bit flips, truncations, splices, length-field
   lies, zstd frame and msgpack header damage in caches; syntax damage, changed and huge metadata
   literals, bad encodings and a replaced opaque blob in python_code) go through show, guards,
   verify, diff, extract and schema by the CLI's entry point in this process (and a few through
   `python -m precompile` in fresh processes). Every call must exit 0, 1 or 2 without a traceback,
   within a watchdog (a generous bound, so a hang is told from a busy machine). Every python_code
   carries statements, a metadata literal and a pickled blob that would create a canary file if
   anything ever executed or unpickled them: the file must never appear.
2. Kills: a child process writes a new pair over an old one and is SIGKILLed either before a
   random os call inside the writer (any step, between the two commit renames included) or after a
   random delay while it rewrites the pair in a loop; a few children run a real capture(...).save().
   Afterwards `load` must serve the old pair or the new one, whole, never a mix.
3. Concurrency: N writer processes (N from --writers) save distinct pairs to the same paths at
   once, 20 saves each: every writer must succeed and leave one writer's pair, whole, and nothing
   else, on disk.
4. Load fuzz (bench/load_fuzz.py): mutated caches (bundle paths, kinds, sizes, hashes, the kernel map,
   keys, provenance, format_version, payload framing, zstd bombs, 200k entries, msgpack nested deep,
   FIFOs) through `precompile.load`, each in a forked process with a sandboxed HOME, TMPDIR and
   Inductor and Triton cache dirs, a memory limit and a watchdog. Load must serve, degrade with a
   PrecompileWarning or raise PrecompileError; never raise anything else, hang, run out of memory,
   write outside Inductor's and Triton's cache dirs, or map a shared library from outside the bundle
   and the installs. About a third of the pairs are signed (honestly or not) and loaded under pinned
   keys, name and minimum release: each the pins refuse must be a PrecompileError. --jobs long-lived
   processes share the cases.
5. Hostile Mega-Cache entries (bench/mega_hostile.py): an Inductor or AOTAutograd entry whose guard
   expression, output stride or cache_key carries code torch would evaluate or import (alone, hidden
   among guards torch writes, or in a real entry of a fixture blob rewritten), and benign ones as
   torch's printer writes them, through show and verify --host. Every hostile case must be a finding
   in both (an unshown eval otherwise), no benign one may be, and no payload may ever run. A tenth of
   the cases are built to make the scan's work outgrow the blob (a memoized string encoded thousands
   of times, a memoized dict set as a state again and again, many entries holding nested pickles):
   each must be a finding of show within mega_hostile's CPU bound, linear in the blob's size. Another
   tenth hold an output module without Inductor's `async_compile = AsyncCompile()` line that opens
   with a payload: show --json must list it as the entry's code (an unshown import otherwise).
6. Co-tenants against the JIT path (bench/jit_cotenant.py): a second user (uid 65534) takes Inductor's
   default root first, or writes into this user's, and plants a library whose constructor leaves a
   mark at every path the pair's kernels and ISA probes, and a compile after load, will have; the
   mlp_inductor pair then loads in a fresh process as python_code alone, signed with a bundle for
   another machine (pinned and not) or one that fits, with a torch.compile after load. Foreign
   libraries mapped must be 0, and each case must be served or refused as docs/trust.md says.
 each part's figures as a table; exits 1 if any figure that must be zero is not.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import hashlib
import io
import logging
import multiprocessing
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/stress.py`: the bench package lies at the repository root
    sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "fixtures"
BASES = ("mlp", "mlp_inductor", "train_step", "dynamo_rows", "dynamo_break_eager")
VERBS = ("show", "guards", "verify", "diff", "extract", "schema", "report")
WATCHDOG_S = 60.0
FAILURES = Path(tempfile.gettempdir()) / "precompile-stress-failures"
"""Where the inputs of a failing mutation case are kept, to reproduce it."""
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


# -- part 1: mutations ---------------------------------------------------------------------------
class Hang(BaseException):
    """Raised into a call that ran past the watchdog (a BaseException, so no handler swallows it)."""


@contextlib.contextmanager
def watchdog(seconds: float):
    def expire(signum, frame):
        raise Hang(f"no answer within {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class CanaryPickle:
    """Unpickling this creates the canary file."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def canary_python_code(source: str, canary: Path) -> str:
    """`source` with code that creates `canary` wherever something could run it: top-level statements,
    a metadata literal that is really a call, a decorator, and (for Dynamo artifacts) the pickled state."""
    touch = f"__import__('pathlib').Path({str(canary)!r}).touch()"
    source = source.replace("\nFORMAT_VERSION = ", f"\n{touch}\nFORMAT_VERSION = ", 1)
    source = re.sub(r"\nFN_NAME = .*", lambda m: f"{m.group(0)}\nCANARY = {touch}", source, count=1)
    source += f"\n@(lambda f: {touch})\ndef _canary():\n    pass\n{touch}\n"
    blob = base64.b64encode(pickle.dumps(CanaryPickle(canary), protocol=2)).decode()
    return re.sub(r"\n_dynamo_state = \((?:\n    '[^']*')+\n\)", lambda m: f"\n_dynamo_state = (\n    {blob!r}\n)", source, count=1)


def _u32(value: int) -> bytes:
    return value.to_bytes(4, "little")


HOSTILE_LITERALS = (
    "99", "-1", "None", "'x'", "b'\\x00'", "()", "{}", "[]", "1e309", "(1, 2, 3)", "{'a': {'b': {'c': ()}}}",
    "'a' * 10", "1" + "0" * 5000, "[" * 150 + "]" * 150, "(" * 300 + ")" * 300, "'\\udcff'", "{1: 2, 1: 3}",
    "__import__('os').getpid()", "'" + "A" * 2_000_000 + "'", "(" + "0, " * 200_000 + ")", "f'{1}'", "lambda: 0",
)
SYNTAX_DAMAGE = ("(", ")", "[", "{", "'", '"', '"""', "\\", ":", "\n", "\t", " = ", "\x00", "#", "\r", "if", "yield")
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def mutate_cache(rng: random.Random, data: bytes, donors: list[bytes]) -> tuple[str, bytes]:
    data = bytearray(data)
    header_end = 12 + int.from_bytes(data[8:12], "little") if len(data) >= 12 else len(data)
    kind = rng.choice(("bit flips", "truncation", "splice", "length lie", "zstd frame", "msgpack header", "replaced"))
    if kind == "bit flips":
        for _ in range(rng.randint(1, 8)):
            index = rng.randrange(min(len(data), header_end + 64)) if rng.random() < 0.7 else rng.randrange(len(data))
            data[index] ^= 1 << rng.randrange(8)
    elif kind == "truncation":
        del data[rng.randrange(min(len(data), header_end + 16)) if rng.random() < 0.7 else rng.randrange(len(data)) :]
    elif kind == "splice":
        donor = rng.choice(donors)
        start = rng.randrange(len(donor))
        chunk = donor[start : start + rng.randint(1, 4096)]
        index = rng.randrange(len(data) + 1)
        data[index : index + (len(chunk) if rng.random() < 0.5 else 0)] = chunk
    elif kind == "length lie":
        if rng.random() < 0.5:
            data[8:12] = _u32(rng.choice((0, 1, header_end - 13, header_end - 11, 2**31, 2**32 - 1, 64 * 1024 * 1024 + 1)))
        else:  # a msgpack str/bin/array/map length in the header, made huge or short
            markers = [i for i in range(12, min(header_end, len(data) - 5)) if data[i] in (0xC5, 0xC6, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF)]
            if markers:
                index = rng.choice(markers)
                width = 2 if data[index] in (0xC5, 0xDA, 0xDC, 0xDE) else 4
                data[index + 1 : index + 1 + width] = rng.choice((b"\xff" * width, b"\x00" * width, b"\x7f" + b"\xff" * (width - 1)))
    elif kind == "zstd frame":
        start = data.find(ZSTD_MAGIC)
        if start < 0:
            data += ZSTD_MAGIC + bytes(rng.randrange(256) for _ in range(rng.randint(0, 32)))
        else:
            action = rng.randrange(4)
            if action == 0:  # frame header descriptor and declared content size
                for offset in range(4, 4 + rng.randint(1, 9)):
                    if start + offset < len(data):
                        data[start + offset] = rng.randrange(256)
            elif action == 1:  # the frame cut short
                del data[start + rng.randint(4, 64) :]
            elif action == 2:  # junk after the frame, or a second frame
                data += rng.choice((ZSTD_MAGIC, b"")) + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
            else:  # block damage inside the frame
                for _ in range(rng.randint(1, 16)):
                    index = rng.randrange(start, len(data))
                    data[index] = rng.randrange(256)
    elif kind == "msgpack header":
        for _ in range(rng.randint(1, 6)):
            if header_end > 12:
                index = rng.randrange(12, min(header_end, len(data))) if len(data) > 12 else 0
                data[index] = rng.choice((0xC0, 0xC1, 0xC2, 0xC3, 0xD4, 0xD9, 0xDC, 0xDE, 0xDF, 0x90, 0x80, 0xA0, rng.randrange(256)))
    else:
        data = bytearray(rng.choice((b"", b"\x89PCACHE\n", b"\x89PCACHE\n\xff\xff\xff\xff", rng.choice(donors), os.urandom(64))))
    return f"cache: {kind}", bytes(data)


def mutate_python_code(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    kind = rng.choice(("syntax", "literal", "renamed name", "huge literal", "encoding", "opaque blob", "bytes"))
    text = data.decode("utf-8", "surrogateescape")
    names = re.findall(r"(?m)^([A-Z_][A-Z_0-9]*) = ", text)
    if kind == "syntax":
        for _ in range(rng.randint(1, 3)):
            index = rng.randrange(len(text) // 2)  # the banner and metadata, where the reader looks hardest
            text = text[:index] + rng.choice(SYNTAX_DAMAGE) + text[index + rng.choice((0, 0, 1, 5)) :]
    elif kind == "literal" and names:
        name = rng.choice(names)
        text = re.sub(rf"(?m)^{name} = .*$", lambda m: f"{name} = {rng.choice(HOSTILE_LITERALS)}", text, count=1)
    elif kind == "renamed name" and names:
        name = rng.choice(names)
        replacement = rng.choice((f"{name}X", f"{name} = 1\n{name}", f"{name}: int", f"del {name}\n{name}", f"{name}, _"))
        text = re.sub(rf"(?m)^{name}\b", lambda m: replacement, text, count=1)
    elif kind == "huge literal":
        value = rng.choice(("'" + "B" * rng.choice((10**5, 10**6, 8 * 10**6)) + "'", "[" * 1000 + "]" * 1000, "(" + "1," * 10**5 + ")", "9" * 100_000))
        text = text.replace("\nFORMAT_VERSION = ", f"\n{rng.choice(names or ['HUGE'])} = {value}\nFORMAT_VERSION = ", 1)
    elif kind == "encoding":
        raw = text.encode("utf-8", "surrogateescape")
        index = rng.randrange(len(raw) // 2)
        insert = rng.choice((b"\xff\xfe", b"\xc3", b"\xef\xbb\xbf", b"\x00", b"# -*- coding: latin-1 -*-\n", b"# coding: rot13\n", b"\xed\xa0\x80"))
        return f"python_code: {kind}", raw[:index] + insert + raw[index:] if rng.random() < 0.7 else insert + raw
    elif kind == "opaque blob":
        blob = rng.choice(("'!!not base64!!'", "'QUJD'", "''", repr(base64.b64encode(os.urandom(rng.randint(1, 4096))).decode()), "b'abc'"))
        text = re.sub(r"\n_dynamo_state = \((?:\n    '[^']*')+\n\)", lambda m: f"\n_dynamo_state = ({blob})", text, count=1)
    else:
        raw = bytearray(text.encode("utf-8", "surrogateescape"))
        for _ in range(rng.randint(1, 8)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        if rng.random() < 0.3:
            del raw[rng.randrange(len(raw)) :]
        return f"python_code: {kind}", bytes(raw)
    return f"python_code: {kind}", text.encode("utf-8", "surrogateescape")


def run_cli(argv: list[str]) -> tuple[int | str, str]:
    """Run the CLI's entry point in this process: (exit code, or the name of what escaped it, its output)."""
    from precompile.cli import main as cli

    if not hasattr(cli.build_parser, "cache_info"):  # building argparse's parser is most of a small call
        cli.build_parser = functools.cache(cli.build_parser)
    main = cli.main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            with watchdog(WATCHDOG_S):
                rc = main(["--color", "never", *argv])
        except SystemExit as exc:
            rc = exc.code
        except Hang:
            rc = "hang"
        except BaseException as exc:  # noqa: BLE001 - anything escaping the CLI is what this counts
            rc = f"traceback: {type(exc).__name__}: {str(exc)[:200]}"
    return rc, out.getvalue() + err.getvalue()


def verb_argv(verb: str, rng: random.Random, py: Path, cache: Path, base: str, scratch: Path) -> list[str]:
    json_flag = ["--json"] if rng.random() < 0.3 else []
    if verb == "diff":
        other = FIXTURES / "v1" / rng.choice((base, *BASES))
        return ["diff", *json_flag, str(py.with_suffix("")), str(other)] if rng.random() < 0.5 else ["diff", str(other), str(py.with_suffix(""))]
    if verb == "extract":
        return ["extract", str(py), str(cache), str(scratch / "extracted")]
    if verb == "report":
        other = [str(FIXTURES / "v1" / rng.choice((base, *BASES)))] if rng.random() < 0.5 else []
        return ["report", *json_flag, str(py), str(cache), *other, "-o", str(scratch / "report.html")]
    if verb == "schema":
        return ["schema", rng.choice(("all", "cache-envelope", "python-code-metadata", "inspect-report"))]
    extra = {"guards": rng.choice(([], ["--risky"], ["--type", "shape"], ["--frame", "0"])), "verify": rng.choice(([], ["--host"]))}.get(verb, [])
    return [verb, *json_flag, *extra, str(py), str(cache)]


def mutation_worker(args, work: Path, worker: int) -> dict:
    """Cases worker, worker + jobs, ... each seeded by its number, so any case reruns alone."""
    canary = work / "CANARY"
    pairs = {}
    for base in BASES:
        source = (FIXTURES / "v1" / f"{base}.py").read_text()
        pairs[base] = (canary_python_code(source, canary).encode(), (FIXTURES / "v1" / f"{base}.cache").read_bytes())
    donors = [data for pair in pairs.values() for data in pair]
    scratch = work / f"mutated-{worker}"
    scratch.mkdir()
    py, cache = scratch / "f.py", scratch / "f.cache"
    outcomes, kinds, by_verb, failures, slowest = Counter(), Counter(), Counter(), [], 0.0
    every = max(1, args.mutations // max(1, args.subprocess))
    subprocess_runs = subprocess_failures = 0
    for case in range(worker, args.mutations, args.jobs):
        rng = random.Random(f"stress-{args.seed}-{case}")
        base = rng.choice(BASES)
        python_code, cache_bytes = pairs[base]
        target = rng.choice(("cache", "python_code", "both"))
        labels = []
        if target != "python_code":
            label, cache_bytes = mutate_cache(rng, cache_bytes, donors)
            labels.append(label)
        if target != "cache":
            label, python_code = mutate_python_code(rng, python_code)
            labels.append(label)
        kinds.update(labels)
        py.write_bytes(python_code)
        cache.write_bytes(cache_bytes)
        shutil.rmtree(scratch / "extracted", ignore_errors=True)
        verb = VERBS[case % len(VERBS)]
        argv = verb_argv(verb, rng, py, cache, base, scratch)
        by_verb[verb] += 1
        call_started = time.perf_counter()
        if args.subprocess and case % every == every - 1:
            subprocess_runs += 1
            try:
                proc = subprocess.run([sys.executable, "-m", "precompile", "--color", "never", *argv], capture_output=True, text=True,
                                      timeout=WATCHDOG_S * 2, env=ENV)
                rc, output = proc.returncode, proc.stdout + proc.stderr
            except subprocess.TimeoutExpired:
                rc, output = "hang", ""
            if rc not in (0, 1, 2) or "Traceback (most recent call last)" in output:
                subprocess_failures += 1
        else:
            rc, output = run_cli(argv)
        slowest = max(slowest, time.perf_counter() - call_started)
        if rc in (0, 1, 2) and "Traceback (most recent call last)" in output:
            rc = "traceback printed"
        outcomes[rc if rc in (0, 1, 2, "hang") else "traceback"] += 1
        if case % 1000 == worker:
            print(f"mutation case {case} of {args.mutations}", file=sys.stderr, flush=True)
        if rc not in (0, 1, 2):
            failures.append((case, base, labels, argv[0], rc))
            keep = FAILURES / f"case-{case}"
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(py, keep / "f.py")
            shutil.copy(cache, keep / "f.cache")
    return {
        "outcomes": outcomes, "kinds": kinds, "by_verb": by_verb, "failures": failures, "slowest": slowest,
        "torch_imported": "torch" in sys.modules, "subprocess": Counter(runs=subprocess_runs, failures=subprocess_failures),
    }


def mutations(args, work: Path) -> dict:
    started = time.perf_counter()
    if args.jobs == 1:
        results = [mutation_worker(args, work, 0)]
    else:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = pool.starmap(mutation_worker, [(args, work, worker) for worker in range(args.jobs)])
    merged = {key: Counter() for key in ("outcomes", "kinds", "by_verb", "subprocess")}
    for result in results:
        for key in merged:
            merged[key].update(result[key])
    return {
        **merged, "cases": args.mutations, "failures": [f for r in results for f in r["failures"]],
        "slowest": max(r["slowest"] for r in results), "torch_imported": any(r["torch_imported"] for r in results),
        "executed": (work / "CANARY").exists(), "seconds": time.perf_counter() - started,
    }


# -- part 2: kills -------------------------------------------------------------------------------
KILLED_WRITER = r"""
import os, signal, sys, time
from pathlib import Path
from precompile.artifact import writer

class Steps:
    '''os, except that calls are counted and the `kill_at`-th one (if any) is replaced by SIGKILL.'''
    def __init__(self, kill_at):
        self.calls, self.kill_at = [], kill_at
    def __getattr__(self, attr):
        real = getattr(os, attr)
        if not callable(real):
            return real
        def call(*args, **kwargs):
            self.calls.append(attr)
            if len(self.calls) == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)
        return call

artifact, cache, kill_at = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
sources = [Path(s) for s in sys.argv[4:]]
pairs = [(s.with_suffix(".py").read_bytes(), s.with_suffix(".cache").read_bytes()) for s in sources]
writer.os = steps = Steps(kill_at)
if kill_at:
    writer.write_pair(artifact, cache, *pairs[0])
    print(" ".join(steps.calls))
else:  # rewrite the pairs in turn until killed
    print("ready", flush=True)
    for i in range(10**9):
        writer.write_pair(artifact, cache, *pairs[i % len(pairs)])
"""

KILLED_CAPTURE = r"""
import sys, torch, precompile
from pathlib import Path
from precompile.artifact import writer
sys.path.insert(0, sys.argv[4])
from stress_kill import Steps
writer.os = Steps(int(sys.argv[3]))
with precompile.capture(torch.sin, artifact_path=Path(sys.argv[1]), cache_path=Path(sys.argv[2]),
                        tracer=precompile.MakeFxTracer(), backend="eager") as cap:
    cap(torch.ones(3))
    cap.save()
"""


def variant(directory: Path, tag: str) -> Path:
    """The mlp fixture pair with its python_code tagged by a comment (so loadable, and distinct per tag)."""
    import msgspec

    from precompile.artifact.codec import decode_header, encode_cache

    python_code = (FIXTURES / "v1/mlp.py").read_bytes() + f"# writer {tag}\n".encode()
    envelope, _ = decode_header((FIXTURES / "v1/mlp.cache").read_bytes())
    envelope = msgspec.structs.replace(envelope, code_hash=hashlib.sha256(python_code).hexdigest())
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{tag}.py").write_bytes(python_code)
    (directory / f"{tag}.cache").write_bytes(encode_cache(envelope))
    return directory / tag


def pair_bytes(source: Path) -> tuple[bytes, bytes]:
    return source.with_suffix(".py").read_bytes(), source.with_suffix(".cache").read_bytes()


def classify_after_load(artifact: Path, cache: Path, old: tuple[bytes, bytes], new: list[tuple[bytes, bytes]] | None) -> str:
    """Load the pair (which finishes an interrupted write) and say whose it is: old, new, or what went wrong.
    `new` None: any whole pair other than the old one counts as new (a capture's, not known in advance)."""
    import precompile
    from precompile.artifact.pair import declared_code_hash

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", precompile.PrecompileWarning)
            precompile.load(artifact, cache)
    except Exception as exc:  # noqa: BLE001 - a failed load is the figure
        return f"load failed: {type(exc).__name__}: {str(exc)[:120]}"
    on_disk = (artifact.read_bytes(), cache.read_bytes())
    if on_disk == old:
        return "old"
    if new is None:
        return "new" if declared_code_hash(on_disk[1]) == hashlib.sha256(on_disk[0]).hexdigest() else "mix"
    return "new" if on_disk in new else "mix"


def kills(args, work: Path) -> dict:
    from precompile.artifact.writer import write_pair

    rng = random.Random(f"kills-{args.seed}")
    staged = work / "staged"
    old, new, newer = variant(staged, "old"), variant(staged, "new"), variant(staged, "newer")
    (work / "stress_kill.py").write_text(KILLED_WRITER.split("artifact, cache, kill_at")[0])
    # the os calls of one write over an existing pair, in order: the steps a kill can land before
    write_pair(work / "trace/m.py", work / "trace/m.cache", *pair_bytes(old))
    trace = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(work / "trace/m.py"), str(work / "trace/m.cache"), "-1", str(new)],
                           capture_output=True, text=True, env=ENV, timeout=120, check=True).stdout.split()
    outcomes, steps_hit, problems = Counter(), Counter(), []
    capture_kills = min(args.capture_kills, args.kills)
    started = time.perf_counter()
    for run in range(args.kills):
        directory = work / f"kill-{run}"
        artifact, cache = directory / "m.py", directory / "m.cache"
        write_pair(artifact, cache, *pair_bytes(old))
        if run < capture_kills:
            how = "capture().save(), at a random step"
            kill_at = rng.randint(1, len(trace))
            argv = ["-c", KILLED_CAPTURE, str(artifact), str(cache), str(kill_at), str(work)]
            expected_new = None
        elif run % 2:
            how = "writer, at a random step"
            kill_at = rng.randint(1, len(trace))
            argv = ["-c", KILLED_WRITER, str(artifact), str(cache), str(kill_at), str(new)]
            expected_new = [pair_bytes(new)]
            steps_hit[f"{kill_at:2d} {trace[kill_at - 1]}"] += 1
        else:
            how = "writer looping, after a random delay"
            argv = ["-c", KILLED_WRITER, str(artifact), str(cache), "0", str(new), str(newer)]
            expected_new = [pair_bytes(new), pair_bytes(newer)]
        child = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        if how.startswith("writer looping"):
            ready = child.stdout.readline()
            time.sleep(rng.uniform(0, 0.05))
            child.send_signal(signal.SIGKILL)
            if ready.strip() != "ready":
                problems.append((run, how, "child did not start"))
        try:
            _, stderr = child.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            child.kill()
            _, stderr = child.communicate()
        killed = child.returncode == -signal.SIGKILL
        result = classify_after_load(artifact, cache, pair_bytes(old), expected_new)
        outcomes[(how, "killed" if killed else f"exit {child.returncode}", result)] += 1
        if result not in ("old", "new") or not killed:
            problems.append((run, how, result, stderr.strip().splitlines()[-1:] if stderr else ""))
        shutil.rmtree(directory, ignore_errors=True)
    return {"outcomes": outcomes, "problems": problems, "trace": trace, "steps_hit": steps_hit, "seconds": time.perf_counter() - started}


# -- part 3: concurrency -------------------------------------------------------------------------
CONCURRENT_WRITER = r"""
import sys, time
from pathlib import Path
from precompile.artifact.writer import write_pair
artifact, cache, source, rounds = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
python_code, cache_bytes = source.with_suffix(".py").read_bytes(), source.with_suffix(".cache").read_bytes()
source.with_suffix(".ready").touch()
deadline = time.monotonic() + 60
while not (source.parent / "go").exists():
    if time.monotonic() > deadline:
        sys.exit("no go signal within 60 s")
    time.sleep(0.001)
for _ in range(rounds):
    write_pair(artifact, cache, python_code, cache_bytes)
"""


def concurrency(args, work: Path) -> dict:
    low, high = (int(n) for n in args.writers.split("-"))
    rows = []
    for writers in range(low, high + 1):
        failed_writers = whole = leftovers = 0
        errors = []
        for trial in range(args.trials):
            directory = work / f"concurrent-{writers}-{trial}"
            sources = [variant(directory / "staged", f"w{i}") for i in range(writers)]
            artifact, cache = directory / "out/m.py", directory / "out/m.cache"
            processes = [
                subprocess.Popen([sys.executable, "-c", CONCURRENT_WRITER, str(artifact), str(cache), str(source), "20"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
                for source in sources
            ]
            deadline = time.monotonic() + 120
            while not all(s.with_suffix(".ready").exists() for s in sources) and time.monotonic() < deadline:
                time.sleep(0.01)
            (directory / "staged/go").touch()
            for process in processes:
                try:
                    _, stderr = process.communicate(timeout=300)
                except subprocess.TimeoutExpired:
                    process.kill()
                    _, stderr = process.communicate()
                if process.returncode != 0:
                    failed_writers += 1
                    errors.append(stderr.strip().splitlines()[-1:] if stderr else [f"exit {process.returncode}"])
            if artifact.exists() and cache.exists() and (artifact.read_bytes(), cache.read_bytes()) in [pair_bytes(s) for s in sources]:
                whole += 1
            if sorted(p.name for p in artifact.parent.iterdir()) != ["m.cache", "m.py"]:
                leftovers += 1
            shutil.rmtree(directory, ignore_errors=True)
        rows.append({"writers": writers, "trials": args.trials, "saves": writers * 20 * args.trials, "failed_writers": failed_writers,
                     "whole": whole, "leftovers": leftovers, "errors": errors[:3]})
    return {"rows": rows}


# -- part 4: load fuzz ---------------------------------------------------------------------------
def load_fuzz(args) -> dict:
    from bench import load_fuzz as fuzz

    started = time.perf_counter()
    results = fuzz.fuzz(range(args.load_mutations), seed=args.seed, jobs=args.jobs, failures=FAILURES)
    return {"results": results, "figures": fuzz.figures(results), "findings": fuzz.findings(results),
            "seconds": time.perf_counter() - started, "slowest": max((r["seconds"] for r in results), default=0.0)}


def report_load_fuzz(f: dict) -> int:
    """Print part 4's tables; return how many figures that must be zero are not."""
    from bench.load_fuzz import MUST_BE_ZERO, WATCHDOG_S

    figures = f["figures"]
    table(
        f"4. mutated caches through load, one forked process each ({f['seconds']:.0f} s; watchdog {WATCHDOG_S:.0f} s a case)",
        ("figure", "value"),
        [
            ("cases", figures["cases"]),
            ("served", figures["served"]),
            ("served, compiling its kernels without a warning", figures["served, compiling its kernels without a warning"]),
            ("degraded with a PrecompileWarning", figures["degraded with a PrecompileWarning"]),
            ("PrecompileError", figures["PrecompileError"]),
            ("raw exceptions", figures["raw exception"]),
            ("hangs", figures["hang"]),
            ("memory kills (MemoryError or killed)", figures["memory"]),
            ("cases writing outside the cache roots", figures["writes outside the cache roots"]),
            ("cases mapping a foreign shared library", figures["foreign libraries"]),
            ("signed cases, loaded under pinned keys, name and release", figures["signed cases, loaded under pins"]),
            ("  of those the pins refuse, refused (PrecompileError)", figures["refused by their pins (PrecompileError)"]),
            ("  of those the pins refuse, served or degraded", figures["served against its pins"]),
            ("slowest case (s, not a target)", f"{f['slowest']:.2f}"),
        ],
    )
    if f["findings"]:
        table("   findings (paths relative to the case's dir)", ("finding", "cases", "first case", "its mutations"),
              [(name, len(cases), cases[0]["case"], cases[0]["label"][:70]) for name, cases in f["findings"].items()])
        print(f"   failing inputs kept under {FAILURES}/load-case-N")
    return sum(figures[name] for name in MUST_BE_ZERO)


# -- part 5: hostile Mega-Cache entries ------------------------------------------------------------
def report_mega(args, work: Path) -> int:
    """Run and print part 5; return how many figures that must be zero are not."""
    from bench import mega_hostile

    started = time.perf_counter()
    result = mega_hostile.run(args.mega_cases, args.seed, work, run_cli)
    figures = result["figures"]
    names = ("hostile cases", "shown as findings (show exit 1, verify --host FAIL)", "unshown evals",
             "output modules without the AsyncCompile line", "unshown imports", "benign cases",
             "false findings", "executions (canary file created)", "tracebacks or hangs", "costly blobs",
             "costly blobs over the CPU bound", "costly blobs not shown as findings", "costly blobs: most CPU-ms per MB")
    table(f"5. hostile Mega-Cache entries through show and verify --host ({time.perf_counter() - started:.0f} s)",
          ("figure", "value"), [(name, figures[name]) for name in names])
    table("   cases by field", ("field", "count"), sorted(result["kinds"].items()))
    for failure in result["failures"][:10]:
        print("   FAILURE", failure)
    return sum(figures[name] for name in mega_hostile.MUST_BE_ZERO)


# -- part 6: co-tenants against the JIT path -----------------------------------------------------
def report_cotenant() -> int:
    """Run and print part 6; return how many figures that must be zero are not."""
    from bench import jit_cotenant

    result = jit_cotenant.run()
    if result["skipped"]:
        print(f"\n6. co-tenants against the JIT path: skipped ({result['skipped']})")
        return 0
    table(f"6. co-tenants against the JIT path ({result['seconds']:.0f} s)", ("figure", "value"),
          list(result["figures"].items()))
    table("   cases", ("case", "the rule says", "outcome", "foreign libraries mapped"), result["rows"])
    return sum(result["figures"][name] for name in jit_cotenant.MUST_BE_ZERO)


# -- report --------------------------------------------------------------------------------------
def table(title: str, header: tuple[str, ...], rows: list[tuple]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    print(f"\n{title}")
    for row in (header, tuple("-" * w for w in widths), *rows):
        print("  " + "  ".join(str(cell).ljust(w) if i == 0 else str(cell).rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))


def main() -> int:
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy, as the CLI does
    logging.getLogger("precompile").setLevel(logging.ERROR)  # load's "finished an interrupted write" is expected here
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutations", type=int, default=10_000)
    parser.add_argument("--subprocess", type=int, default=30, help="of the mutations, how many run in a fresh process")
    parser.add_argument("--jobs", type=int, default=1, help="processes running the mutations (of parts 1 and 4)")
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--capture-kills", type=int, default=10, help="of the kills, how many kill a real capture().save()")
    parser.add_argument("--writers", default="2-8", help="range of concurrent writer counts (default 2-8)")
    parser.add_argument("--trials", type=int, default=5, help="trials per writer count")
    parser.add_argument("--seed", default="0")
    parser.add_argument("--load-mutations", type=int, default=5_000, help="mutated caches through load (part 4)")
    parser.add_argument("--mega-cases", type=int, default=2_000, help="hostile and benign Mega-Cache entries (part 5)")
    parser.add_argument("--parts", default="mutations,kills,concurrency,load,mega,cotenant")
    args = parser.parse_args()
    known = ("mutations", "kills", "concurrency", "load", "mega", "cotenant")
    unknown = [part for part in args.parts.split(",") if part not in known]
    if unknown:  # a misspelt part would run nothing and report every figure as required
        parser.error(f"unknown parts {unknown}; choose from {list(known)}")
    bad = 0
    with tempfile.TemporaryDirectory(prefix="precompile-stress-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        parts = args.parts.split(",")
        if "mutations" in parts:
            m = mutations(args, work)
            o = m["outcomes"]
            sub_runs, sub_failures = m["subprocess"]["runs"], m["subprocess"]["failures"]
            table(
                f"1. mutated inputs through every inspect verb ({m['seconds']:.0f} s; watchdog {WATCHDOG_S:.0f} s a call)",
                ("figure", "value"),
                [
                    ("mutated pairs", m["cases"]),
                    ("  by verb", ", ".join(f"{v} {n}" for v, n in sorted(m["by_verb"].items()))),
                    ("exit 0 / 1 / 2", f"{o[0]} / {o[1]} / {o[2]}"),
                    ("tracebacks", o["traceback"]),
                    ("hangs", o["hang"]),
                    ("executions (canary file created)", int(m["executed"])),
                    ("fresh-process runs / failures", f"{sub_runs} / {sub_failures}"),
                    ("torch imported by inspect", "yes" if m["torch_imported"] else "no"),
                    ("slowest call (s, not a target)", f"{m['slowest']:.2f}"),
                ],
            )
            table("   mutation kinds", ("kind", "count"), sorted(m["kinds"].items()))
            for failure in m["failures"][:10]:
                print("   FAILURE", failure)
            bad += o["traceback"] + o["hang"] + int(m["executed"]) + sub_failures + int(m["torch_imported"])
        if "kills" in parts:
            k = kills(args, work)
            table(
                f"2. save() killed with SIGKILL ({sum(k['outcomes'].values())} runs, {k['seconds']:.0f} s; the writer makes {len(k['trace'])} os calls)",
                ("how", "child", "after load", "runs"),
                [(*key, n) for key, n in sorted(k["outcomes"].items())],
            )
            table("   random steps killed at (before this os call of the writer)", ("step", "runs"), sorted(k["steps_hit"].items()))
            for problem in k["problems"][:10]:
                print("   PROBLEM", problem)
            bad += len(k["problems"])
        if "concurrency" in parts:
            c = concurrency(args, work)
            table(
                "3. processes saving the same pair at once (20 saves each)",
                ("writers", "trials", "saves", "failed writers", "whole pair", "leftover files"),
                [(r["writers"], r["trials"], r["saves"], r["failed_writers"], f"{r['whole']}/{r['trials']}", r["leftovers"]) for r in c["rows"]],
            )
            for row in c["rows"]:
                for error in row["errors"]:
                    print(f"   ERROR ({row['writers']} writers)", error)
            bad += sum(r["failed_writers"] + r["trials"] - r["whole"] + r["leftovers"] for r in c["rows"])
        if "load" in parts:
            bad += report_load_fuzz(load_fuzz(args))
        if "mega" in parts:
            bad += report_mega(args, work)
        if "cotenant" in parts:
            bad += report_cotenant()
    print(f"\n{'all figures as required' if not bad else f'{bad} failures'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
