"""Time and peak memory of each inspect verb on big python_code, beside a bare `ast.parse` of the same file.

    python bench/inspect_big.py [--artifact PREFIX] [--sizes 1,10,100] [--shape mixed|code] [--timeout 600]

For each artifact, each of `show`, `guards`, `verify` and `diff` (against a changed copy) runs in a fresh
process, and so does a bare `ast.parse` of its python_code, just before each verb; the table gives
each verb's time and peak resident memory (read with wait4) and its time over the parse run beside
it (so a busy host slows both alike), and the fastest parse. `--artifact PREFIX`: a real pair PREFIX.py PREFIX.cache (e.g. the zoo's
densenet121 captured with the default tracer, eager backend), diffed against a copy with one
statement added in the middle of its python_code (two releases that differ in one place).
`--sizes`: python_code of each size (MB) built from the dynamo_rows fixture by appending what a big
artifact holds, and its cache beside it, sealed as capture seals one (it carries python_code's bytecode
and typed metadata, so `verify` proves the bytecode, compiling python_code again in a child bounded in
memory: inspect/verify/bytecode_proof.py). `mixed`: a third each of an opaque-state-like base64
literal (the renderer's one-chunk lines), a metadata-like tuple literal of one string per line, and
plain code lines. `code`: plain code lines only, the costliest shape to parse (its syntax tree takes
about 250 bytes per byte, which is why python_code is parsed a part at a time). The generated
artifact's `diff` compares it with a copy whose every 50th appended line changed. Nothing needs torch.
"""
from __future__ import annotations

import argparse
import base64
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "fixtures/v1/dynamo_rows"
CHANGE_EVERY = 50


def _code_lines(count: int, start: int) -> list[str]:
    return [f"value_{start + i} = value_{start + i - 1} + {i % 7} if {i} % 3 else None\n" for i in range(count)]


def _literal_lines(count: int) -> list[str]:
    return ["BIG_TABLE = (\n", *(f"    'entry {i}: {'abcdefgh' * 3}',\n" for i in range(count)), ")\n"]


def _base64_lines(size: int) -> list[str]:
    encoded = base64.b64encode(random.Random(0).randbytes(size * 3 // 4)).decode()
    return ["_big_state = (\n", *(f"    {encoded[i:i + 100]!r}\n" for i in range(0, len(encoded), 100)), ")\n"]


def appended_lines(size: int, shape: str) -> list[str]:
    """About `size` bytes of lines to append to the fixture's python_code."""
    if shape == "code":
        return _code_lines(size // 56, 1)
    third = size // 3
    return _base64_lines(third) + _literal_lines(third // 42) + _code_lines(third // 56, 1)


def write_pair(directory: Path, name: str, lines: list[str]) -> Path:
    prefix = directory / name
    with open(prefix.with_suffix(".py"), "w", encoding="utf-8") as handle:
        handle.write(BASE.with_suffix(".py").read_text(encoding="utf-8"))
        handle.writelines(lines)
    shutil.copy(BASE.with_suffix(".cache"), prefix.with_suffix(".cache"))
    return prefix


def seal(prefix: Path) -> None:
    """Give the copied cache python_code's code_hash, bytecode and typed metadata, as capture does
    (artifact/bytecode.prepare), parsing python_code a part at a time."""
    sys.path.insert(0, str(ROOT))  # this checkout's precompile, as `python -m precompile` run from it finds
    import msgspec

    from precompile.artifact import bytecode, codec
    from precompile.artifact.pycode import code_hash, decode_source, literal_assignments, metadata_of
    from precompile.inspect.parsing.chunked_parse import parsed_chunks

    data = prefix.with_suffix(".py").read_bytes()
    source, digest = decode_source(data), code_hash(data)
    values: dict = {}
    for chunk in parsed_chunks(source, filename=str(prefix)):
        values.update(literal_assignments(chunk.tree, first_line=chunk.first_line))
    compiled, metadata = bytecode.prepare(source, digest, metadata_of(values), parsed_chunks(source, filename=str(prefix)))
    if compiled is None:
        sys.exit(f"python_code of {len(data)} bytes is over what a cache carries compiled (artifact/bytecode.MAX_STORED_SIZE)")
    raw = prefix.with_suffix(".cache").read_bytes()
    envelope, offset = codec.decode_header(raw)
    envelope = msgspec.structs.replace(envelope, code_hash=digest, python_bytecode=compiled, metadata_msgpack=metadata)
    prefix.with_suffix(".cache").write_bytes(codec.encode_cache(envelope, raw[offset:]))


SEAL = f"import sys; from pathlib import Path; sys.path.insert(0, {str(ROOT / 'bench')!r}); import inspect_big; inspect_big.seal(Path(sys.argv[1]))"
ADD_ONE = (f"import sys; from pathlib import Path; sys.path.insert(0, {str(ROOT / 'bench')!r}); import inspect_big; "
           "Path(sys.argv[2]).write_text(inspect_big.one_statement_added(Path(sys.argv[1]).read_text(encoding='utf-8')), encoding='utf-8')")


def changed(lines: list[str]) -> list[str]:
    """The lines with every CHANGE_EVERY-th one that is code changed."""
    return [f"{line[:-1]}  # changed\n" if i % CHANGE_EVERY == 0 and line.startswith("value_") else line
            for i, line in enumerate(lines)]


def one_statement_added(source: str) -> str:
    """python_code with one statement added before the top-level statement nearest its middle line:
    the release that differs from it in one place (its cache is sealed again to pair with it)."""
    import ast

    lines = source.splitlines(keepends=True)
    starts = [node.lineno for node in ast.parse(source).body]
    at = min(starts, key=lambda line: abs(line - len(lines) // 2))
    return "".join([*lines[:at - 1], "_bench_added = 1\n", *lines[at - 1:]])


def measure(argv: list[str], timeout: float) -> tuple[str, str]:
    """(seconds, peak MB) of one command in a fresh process, or ('> timeout', '?') past the limit."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = started + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            os.wait4(proc.pid, 0)
            return f"> {timeout:.0f} s", "?"
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        sys.exit(f"{' '.join(argv)} failed ({code}): {proc.stderr.read().decode()[-2000:]}")
    return f"{seconds:.2f} s", f"{usage.ru_maxrss / 1024:.0f} MB"


VERBS = ("show", "guards", "verify", "diff")
PARSE = "import ast, sys; ast.parse(open(sys.argv[1], encoding='utf-8').read())"


def measure_verbs(a: Path, b: Path, timeout: float) -> dict[str, tuple[str, str, str]]:
    """{"parse" and each verb: (seconds, peak MB, time over the parse's)} of the pair `a` (a prefix),
    `b` its copy for diff. The parse runs again just before each verb, and the verb is compared with
    that run: a host whose load changes slows both alike."""
    verb = [sys.executable, "-m", "precompile"]
    pair = [str(a.with_suffix(".py")), str(a.with_suffix(".cache"))]
    argv = {
        "show": [*verb, "show", *pair],
        "guards": [*verb, "guards", *pair],
        "verify": [*verb, "verify", *pair],
        "diff": [*verb, "diff", *pair, str(b.with_suffix(".py")), str(b.with_suffix(".cache"))],
    }
    parse = [sys.executable, "-c", PARSE, pair[0]]
    out, parses = {}, []
    for name, command in argv.items():
        parses.append(measure(parse, timeout))
        seconds, peak = measure(command, timeout)
        out[name] = (seconds, peak, _ratio(seconds, parses[-1][0]))
    fastest = min(parses, key=lambda p: float(p[0].split()[0]) if not p[0].startswith(">") else float("inf"))
    return {"parse": (*fastest, "1.0x"), **out}


def _ratio(verb: str, parse: str) -> str:
    if verb.startswith(">") or parse.startswith(">"):
        return "?"
    return f"{float(verb.split()[0]) / float(parse.split()[0]):.1f}x"


def _row(label: str, size: float, times: dict[str, tuple[str, str, str]]) -> str:
    cells = [f"{label:<22}", f"{size:>7.1f} MB", f"parse {times['parse'][0]:>9} {times['parse'][1]:>7}"]
    cells += [f"{verb} {times[verb][0]:>9} {times[verb][1]:>7} {times[verb][2]:>6}" for verb in VERBS]
    return "  ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifact", action="append", default=[], metavar="PREFIX",
                        help="a real pair PREFIX.py PREFIX.cache to measure too (repeatable)")
    parser.add_argument("--sizes", default="1,10,100", help="generated python_code sizes in MB, comma separated ('' for none)")
    parser.add_argument("--shape", choices=("mixed", "code"), default="mixed")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one command may take")
    args = parser.parse_args()
    rows = []
    for prefix in map(Path, args.artifact):
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "copy"
            shutil.copy(prefix.with_suffix(".cache"), copy.with_suffix(".cache"))
            # In processes of their own, as the generated pairs are sealed (this one's pages would count in each peak).
            subprocess.run([sys.executable, "-c", ADD_ONE, str(prefix.with_suffix(".py")), str(copy.with_suffix(".py"))], check=True)
            subprocess.run([sys.executable, "-c", SEAL, str(copy)], check=True)
            times = measure_verbs(prefix, copy, args.timeout)
        rows.append(_row(prefix.name, prefix.with_suffix(".py").stat().st_size / 1e6, times))
        print(rows[-1], file=sys.stderr)
    for size_mb in (float(s) for s in args.sizes.split(",") if s):
        with tempfile.TemporaryDirectory() as tmp:
            lines = appended_lines(int(size_mb * 1024 * 1024), args.shape)
            a = write_pair(Path(tmp), "a", lines)
            b = write_pair(Path(tmp), "b", changed(lines))
            del lines
            # Sealed in a process of its own: pages this process held would count in each measured child's peak
            # (a forked child holds them until it runs its command).
            subprocess.run([sys.executable, "-c", SEAL, str(a)], check=True)
            size = a.with_suffix(".py").stat().st_size / 1e6
            times = measure_verbs(a, b, args.timeout)
        rows.append(_row(f"generated ({args.shape})", size, times))
        print(rows[-1], file=sys.stderr)
    print(f"each verb: time, peak resident memory, time over a bare ast.parse of the same python_code in its own process "
          f"(a real pair diffed against a copy with one statement added in its middle; generated: shape {args.shape}, "
          f"diffed against a copy with every {CHANGE_EVERY}th appended code line changed)")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
