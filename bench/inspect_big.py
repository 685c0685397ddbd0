"""Time and peak memory of `precompile show`, `diff` and `verify` on big python_code, side by side.

    python bench/inspect_big.py [--sizes 1,10,100] [--shape mixed|code] [--timeout 600]

Builds python_code of each size (MB) from the dynamo_rows fixture by appending what a big artifact
holds, and its cache beside it, sealed as capture seals one: it carries python_code's bytecode and
typed metadata, so `verify` proves the bytecode (compiling python_code again, in a child bounded in
memory: inspect/bytecode_proof.py; its peak is the larger of the two processes'). `mixed`: a third each of an opaque-state-like base64 literal (the
renderer's one-chunk lines), a metadata-like tuple literal of one string per line, and plain code
lines. `code`: plain code lines only, the costliest shape to parse (its syntax tree takes about 250
bytes per byte, which is why python_code is parsed a part at a time). The `diff` compares the file with a copy whose every 50th appended line
changed. Each command runs in a fresh process; its peak resident memory is read with wait4.
Nothing needs torch.
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
    from precompile.inspect.chunked_parse import parsed_chunks

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


def changed(lines: list[str]) -> list[str]:
    """The lines with every CHANGE_EVERY-th one that is code changed."""
    return [f"{line[:-1]}  # changed\n" if i % CHANGE_EVERY == 0 and line.startswith("value_") else line
            for i, line in enumerate(lines)]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,10,100", help="python_code sizes in MB, comma separated")
    parser.add_argument("--shape", choices=("mixed", "code"), default="mixed")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one command may take")
    args = parser.parse_args()
    rows = []
    for size_mb in (float(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            lines = appended_lines(int(size_mb * 1024 * 1024), args.shape)
            a = write_pair(Path(tmp), "a", lines)
            b = write_pair(Path(tmp), "b", changed(lines))
            del lines
            # Sealed in a process of its own: pages this process held would count in each measured child's peak
            # (a forked child holds them until it runs its command).
            subprocess.run([sys.executable, "-c", SEAL, str(a)], check=True)
            size = a.with_suffix(".py").stat().st_size / 1e6
            show = measure([sys.executable, "-m", "precompile", "show", str(a)], args.timeout)
            diff = measure([sys.executable, "-m", "precompile", "diff", str(a), str(b)], args.timeout)
            verify = measure([sys.executable, "-m", "precompile", "verify", str(a)], args.timeout)
        rows.append((f"{size:.1f} MB", *show, *diff, *verify, _ratio(verify, show)))
        print(f"{rows[-1][0]:>10}  show {show[0]:>10} {show[1]:>8}   diff {diff[0]:>10} {diff[1]:>8}   "
              f"verify {verify[0]:>10} {verify[1]:>8}", file=sys.stderr)
    print(f"shape {args.shape}; diff against a copy with every {CHANGE_EVERY}th appended code line changed; "
          "verify / show: the ratio of their times and of their peaks")
    print(f"{'python_code':>12}  {'show time':>10}  {'show peak':>9}  {'diff time':>10}  {'diff peak':>9}  "
          f"{'verify time':>11}  {'verify peak':>11}  {'verify / show':>13}")
    for size, show_time, show_peak, diff_time, diff_peak, verify_time, verify_peak, ratio in rows:
        print(f"{size:>12}  {show_time:>10}  {show_peak:>9}  {diff_time:>10}  {diff_peak:>9}  "
              f"{verify_time:>11}  {verify_peak:>11}  {ratio:>13}")


def _ratio(verify: tuple[str, str], show: tuple[str, str]) -> str:
    """'time x, peak y' of verify over show, from measure's texts ('?' where one ran out of time)."""
    try:
        times = float(verify[0].split()[0]) / float(show[0].split()[0])
        peaks = float(verify[1].split()[0]) / float(show[1].split()[0])
    except ValueError:
        return "?"
    return f"{times:.1f}x, {peaks:.1f}x"


if __name__ == "__main__":
    main()
