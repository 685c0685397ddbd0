"""Hostile Mega-Cache entries for bench/stress.py (part 5): the fields torch runs from an entry, with
code in them, through `show` and `verify --host`; and entries built to make the scan's work grow
faster than the blob (`costly_case`), through `show` within a CPU bound per blob.

Each case is a blob holding one Inductor or AOTAutograd entry (a CompiledFxGraph as torch pickles
it, or, a third of the time, a real entry of fixtures/mega_cache/torch-2.13.0.bin.xz rewritten) whose
guard expression, output stride or cache_key carries what torch would evaluate or import: a payload
(an import, a builtin, an attribute walk, a lambda, a comprehension, ...) alone or hidden among guards
torch writes. Every payload would create a canary file if evaluated. A case is "shown" when show exits
1 naming the field and verify --host fails its "mega-cache code torch runs" check; an unshown eval is
a case either lets through. Benign cases (guards and strides as torch's printer writes them, drawn
from a small grammar of it) must show clean: a finding there is a false one. A share of the cases
(`unmarked_case`) is an entry whose output module, the source_code torch writes out and imports,
lacks Inductor's `async_compile = AsyncCompile()` line and opens with a payload: `show --json` must
list that source as the entry's code (by its sha256); an unshown import is a case it does not.
"""
from __future__ import annotations

import base64
import hashlib
import json
import lzma
import pickletools
import random
import time
import zlib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "fixtures" / "mega_cache" / "torch-2.13.0.bin.xz"
MODULE = "async_compile = AsyncCompile()\ndef call(args):\n    return args\n"
MUST_BE_ZERO = ("unshown evals", "unshown imports", "false findings", "executions (canary file created)", "tracebacks or hangs",
                "costly blobs over the CPU bound", "costly blobs not shown as findings")
COSTLY_SHARE = 0.1
"""Of the cases, those that are `costly_case`s."""
UNMARKED_SHARE = 0.1
"""Of the cases, those that are `unmarked_case`s."""
CPU_S, CPU_S_PER_MB = 1.0, 10.0
"""The CPU a costly blob's `show` may spend: linear in its size (the scan's work once was quadratic)."""


def _payloads(canary: Path) -> list[str]:
    path = repr(str(canary))
    return [
        f"__import__('pathlib').Path({path}).touch()", f"open({path}, 'w')", f"exec(\"open({path}, 'w')\")",
        f"eval(\"open({path}, 'w')\")", f"torch.load({path})", f"torch.save(1, {path})", f"math.__loader__.load_module({path})",
        f"L['t0'].__class__.__mro__[-1].__subclasses__()[0]({path})", f"getattr(torch, 'save')(1, {path})",
        f"(lambda: open({path}, 'w'))()", f"[open({path}, 'w') for _ in (1,)]", f"{{open({path}, 'w')}}",
        f"torch.ops.aten.__dict__['save']({path})", f"globals()['__builtins__'].open({path}, 'w')",
        f"IsNonOverlappingAndDenseIndicator.__globals__['open']({path}, 'w')", f"max(open({path}, 'w'), 1)",
        f"abs(__builtins__['open']({path}, 'w'))", f"f'{{open({path}, \"w\")}}'", f"(canary := open({path}, 'w'))",
        f"torch._dynamo.config.__dict__.update(x={path})", f"L.__setitem__('t0', open({path}, 'w'))",
        f"math.floor(x=open({path}, 'w'))", f"round(*[open({path}, 'w')])",
    ]


def torch_guard(rng: random.Random, depth: int = 0) -> str:
    """A guard as ShapeGuardPythonPrinter writes one, over L['t<N>']."""
    def term(d: int) -> str:
        roll = rng.random()
        if d > 2 or roll < 0.4:
            return rng.choice([f"L['t{rng.randrange(4)}']", str(rng.randrange(1, 4097))])
        if roll < 0.7:
            return f"{term(d + 1)}{rng.choice([' + ', ' - ', '*', ' // ', ' % '])}{term(d + 1)}"
        call = rng.choice(["max({}, {})", "min({}, {})", "math.floor(torch.sym_float({}) / {})", "abs({} - {})"])
        return call.format(term(d + 1), term(d + 1))
    guard = f"{term(1)} {rng.choice(['==', '!=', '<', '<=', '>', '>='])} {term(1)}"
    guard = f"not ({guard})" if rng.random() < 0.1 else guard
    if depth < 2 and rng.random() < 0.5:
        return f"{guard}{rng.choice([' and ', ' or '])}{torch_guard(rng, depth + 1)}"
    return guard


def _hidden(rng: random.Random, payload: str) -> str:
    guard = torch_guard(rng)
    return rng.choice([payload, f"{guard} and {payload}", f"{payload} or {guard}", f"({guard}) and not ({payload})",
                       f"{guard} and ({payload} if {guard} else 1) == 1", f"max(L['t0'], {payload}) <= 8"])


def _str(value: str) -> bytes:
    data = value.encode("utf-8", "surrogatepass")
    return b"X" + len(data).to_bytes(4, "little") + data


def code_hash(source: str) -> str:
    return "c" + base64.b32encode(hashlib.sha256(source.strip().encode()).digest())[:51].decode().lower()


def _graph(fields: dict[str, bytes]) -> bytes:
    graph = b"\x8c\x1btorch._inductor.output_code\x8c\x0fCompiledFxGraph\x93"
    return b"\x80\x04" + graph + b")\x81}(" + b"".join(_str(k) + v for k, v in fields.items()) + b"ub."


def _strides(texts: list[str]) -> bytes:
    return b"](" + b"".join(b"(" + b"".join(_str(t) for t in group) + b"t" for group in (texts[:2], texts[2:]) if group) + b"e"


def blob(entries: list[tuple[str, str, bytes]]) -> bytes:
    """A Mega-Cache as torch writes it: crc32 | version 1 | per entry its kind, a count of 1, its key and content."""
    def raw(data: bytes) -> bytes:
        return len(data).to_bytes(8, "big") + data

    body = (1).to_bytes(8, "big") + b"".join(raw(base64.b64encode(kind.encode())) + (1).to_bytes(8, "big")
                                              + raw(base64.b64encode(key.encode())) + raw(content) for kind, key, content in entries)
    return zlib.crc32(body).to_bytes(4, "big") + body


def _rewritten(content: bytes, old: str, new: str) -> bytes:
    """A real entry's pickle with the string `old` written as `new` (frames dropped: they are optional)."""
    ops = list(pickletools.genops(content))
    ends = [pos for _, _, pos in ops[1:]] + [len(content)]
    return b"".join(_str(new) if arg == old and "UNICODE" in op.name else content[pos:end]
                    for (op, arg, pos), end in zip(ops, ends) if op.name != "FRAME")


def case(rng: random.Random, canary: Path, real: list[tuple[str, str, bytes]]) -> tuple[str, str, bytes]:
    """(what, the field a finding must name or "" for a benign case, the blob)."""
    kind = rng.choice(["inductor", "aot_autograd"])
    module = {"cache_key": _str(code_hash(MODULE)), "source_code": _str(MODULE)}
    roll = rng.random()
    if roll < 0.15:
        strides = [rng.choice(["1", "4", "s0", "s0*s1", "zf1", "2*s3 + 1"]) for _ in range(rng.randrange(1, 5))]
        return "benign guards and strides", "", blob([(kind, "k", _graph({**module, "guards_expr": _str(torch_guard(rng)),
                                                                         "output_strides": _strides(strides)}))])
    payload = rng.choice(_payloads(canary))
    if roll < 0.45 and real:
        index = rng.choice([i for i, (k, _, c) in enumerate(real) if k == "inductor" and b"2 <= L['t0']" in c])
        real_kind, key, content = real[index]
        old = next(a for _, a, _ in pickletools.genops(content) if isinstance(a, str) and a.startswith("2 <= L['t0']"))
        entries = list(real)
        entries[index] = (real_kind, key, _rewritten(content, old, _hidden(rng, payload)))
        return "guards_expr of a real entry", "guards_expr", blob(entries)
    if roll < 0.75:
        return "guards_expr", "guards_expr", blob([(kind, "k", _graph({**module, "guards_expr": _str(_hidden(rng, payload))}))])
    if roll < 0.9:
        return "output_strides", "output_strides[0]", blob([(kind, "k", _graph({**module, "output_strides": _strides(["1", payload])}))])
    key = rng.choice([f"/tmp/{canary.name}", f"../../{code_hash(MODULE)}", code_hash("x = 1"), f"c{payload}"])
    return "cache_key", "cache_key", blob([(kind, "k", _graph({"cache_key": _str(key), "source_code": _str(MODULE)}))])


def unmarked_case(rng: random.Random, canary: Path, real: list[tuple[str, str, bytes]]) -> tuple[str, str, bytes]:
    """(what, the output module's source, the blob): an entry whose source_code has no
    `async_compile = AsyncCompile()` line and opens with a payload, its cache_key torch's hash of
    it (so nothing else about it is a finding): synthetic, or a real entry's module rewritten."""
    payload = f"__import__('pathlib').Path({str(canary)!r}).touch()\n"
    if rng.random() < 0.5:
        source = payload + "def call(args):\n    return args\n"
        return "output module without its AsyncCompile line", source, blob([
            (rng.choice(["inductor", "aot_autograd"]), "k", _graph({"cache_key": _str(code_hash(source)), "source_code": _str(source)}))])
    index = rng.choice([i for i, (k, _, c) in enumerate(real) if k == "inductor" and b"async_compile = AsyncCompile()" in c])
    kind, key, content = real[index]
    old = next(a for _, a, _ in pickletools.genops(content) if isinstance(a, str) and "async_compile = AsyncCompile()\n" in a)
    source = payload + old.replace("async_compile = AsyncCompile()\n", "async_compile = __import__('torch')._inductor.async_compile.AsyncCompile()\n")
    entries = list(real)
    entries[index] = (kind, key, _rewritten(_rewritten(content, old, source), code_hash(old), code_hash(source)))
    return "a real entry's output module without its AsyncCompile line", source, blob(entries)


def _unmarked(rng: random.Random, canary: Path, real, path: Path, run_cli, figures: Counter, kinds: Counter,
              failures: list[str], number: int) -> None:
    what, source, data = unmarked_case(rng, canary, real)
    kinds[what] += 1
    figures["output modules without the AsyncCompile line"] += 1
    path.write_bytes(data)
    shown, shown_out = run_cli(["show", "--json", str(path)])
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()
    if not isinstance(shown, int):
        figures["tracebacks or hangs"] += 1
        failures.append(f"case {number} ({what}): {shown}")
    elif json.dumps(digest) not in shown_out:
        figures["unshown imports"] += 1
        failures.append(f"case {number} ({what}): show --json {shown} lists no code of sha256 {digest}")


def _unicode(text: str) -> bytes:
    data = text.encode("utf-8")
    return b"X" + len(data).to_bytes(4, "little") + data


def costly_case(rng: random.Random) -> tuple[str, bytes]:
    """(what, the blob): a memoized string holding a pickle (importing os.system) encoded by
    _codecs.encode thousands of times, a memoized dict set as a state past the copy bound, or many
    entries each holding a nested pickle. Each must be a finding (what it imports, or the bound)."""
    roll = rng.random()
    if roll < 0.4:
        size, calls = rng.randrange(10_000, 60_000), rng.randrange(1_000, 8_000)
        inner = "\x80\x02cos\nsystem\n0" + "N0" * ((size - 16) // 2) + "N."
        content = (b"\x80\x02c_codecs\nencode\nq\x00" + _unicode(inner) + b"q\x01" + _unicode("latin1") + b"q\x02"
                   + b"h\x00h\x01h\x02\x86R0" * calls + b"N.")
        return "a memoized string encoded again and again", blob([("inductor", "k", content)])
    if roll < 0.7:
        items = rng.randrange(5_000, 20_000)
        content = (b"\x80\x02}q\x01(" + b"".join(b"M" + i.to_bytes(2, "little") + b"N" for i in range(items)) + b"u]"
                   + b"h\x01b" * (1_000_000 // items + rng.randrange(1, 2_000)) + b".")
        return "a memoized dict set as a state again and again", blob([("inductor", "k", content)])
    nested = b"\x80\x02cos\nsystem\n0" + b"N0" * rng.randrange(1_000, 20_000) + b"N."
    content = b"\x80\x02]q\x00B" + len(nested).to_bytes(4, "little") + nested + b"a."
    return "many entries holding a nested pickle", blob([("inductor", f"k{i}", content) for i in range(rng.randrange(2, 50))])


def _costly(rng: random.Random, path: Path, run_cli, figures: Counter, kinds: Counter, failures: list[str], number: int) -> None:
    what, data = costly_case(rng)
    kinds[what] += 1
    figures["costly blobs"] += 1
    path.write_bytes(data)
    started = time.process_time()
    shown, shown_out = run_cli(["show", str(path)])
    spent, bound = time.process_time() - started, CPU_S + CPU_S_PER_MB * len(data) / 1e6
    figures["costly blobs: most CPU-ms per MB"] = max(figures["costly blobs: most CPU-ms per MB"], round(spent * 1e9 / len(data)))
    if not isinstance(shown, int):
        figures["tracebacks or hangs"] += 1
        failures.append(f"case {number} ({what}): {shown}")
    elif spent > bound:
        figures["costly blobs over the CPU bound"] += 1
        failures.append(f"case {number} ({what}, {len(data)} bytes): show took {spent:.1f} CPU-s, over {bound:.1f}")
    elif shown != 1:
        figures["costly blobs not shown as findings"] += 1
        failures.append(f"case {number} ({what}): show {shown}: {shown_out[-300:]}")


def run(count: int, seed: str, work: Path, run_cli) -> dict:
    """`count` cases through show and verify --host by `run_cli(argv) -> (rc, output)`; the figures."""
    from precompile.inspect.formats.mega_cache import entry_contents

    rng = random.Random(f"mega-{seed}")
    canary = work / "MEGA_CANARY"
    real = entry_contents(lzma.decompress(FIXTURE.read_bytes()))
    figures: Counter = Counter()
    kinds: Counter = Counter()
    failures: list[str] = []
    path = work / "mega.bin"
    for number in range(count):
        roll = rng.random()
        if roll < COSTLY_SHARE:
            _costly(rng, path, run_cli, figures, kinds, failures, number)
            continue
        if roll < COSTLY_SHARE + UNMARKED_SHARE:
            _unmarked(rng, canary, real, path, run_cli, figures, kinds, failures, number)
            continue
        what, field, data = case(rng, canary, real)
        kinds[what] += 1
        path.write_bytes(data)
        shown, shown_out = run_cli(["show", str(path)])
        host, host_out = run_cli(["verify", "--host", str(path)])
        if not isinstance(shown, int) or not isinstance(host, int):
            figures["tracebacks or hangs"] += 1
            failures.append(f"case {number} ({what}): {shown} / {host}")
            continue
        named = f": {field}" in shown_out and "FAIL  mega-cache code torch runs" in host_out
        if field:
            figures["hostile cases"] += 1
            if shown == 1 and named:
                figures["shown as findings (show exit 1, verify --host FAIL)"] += 1
            else:
                figures["unshown evals"] += 1
                failures.append(f"case {number} ({what}): show {shown}, verify --host {host}")
        else:
            figures["benign cases"] += 1
            if shown != 0 or "FAIL  mega-cache code torch runs" in host_out:
                figures["false findings"] += 1
                failures.append(f"case {number} ({what}): show {shown}: {shown_out[-300:]}")
    figures["executions (canary file created)"] = int(canary.exists())
    return {"figures": figures, "kinds": kinds, "failures": failures}
