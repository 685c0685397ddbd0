"""Time `precompile show` on a pair with a ~100 MB cache against `python -c "import torch"`.

    python bench/inspect_show.py [--size-mb 100] [--repeat 3]

Builds the pair in a temporary directory (the mlp fixture's python_code, and a cache whose kernel
bundle holds incompressible random bytes; no torch needed to build it), then runs both commands in
fresh processes, best of --repeat, and prints the times and their ratio. `show` reads the cache
header-first, so its time should not grow with the payload.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from precompile.artifact.codec import build_bundle, decode_header, encode_cache

ROOT = Path(__file__).resolve().parent.parent


def build_pair(directory: Path, size_mb: int) -> Path:
    import msgspec

    python_code = (ROOT / "fixtures/v1/mlp.py").read_bytes()
    envelope, _ = decode_header((ROOT / "fixtures/v1/mlp.cache").read_bytes())
    blob = os.urandom(size_mb * 1024 * 1024)
    bundle, payload = build_bundle({"kernels/big.cubin": ("binary", blob)}, {"torch": envelope.producer.torch})
    prefix = directory / "big"
    prefix.with_suffix(".py").write_bytes(python_code)
    prefix.with_suffix(".cache").write_bytes(encode_cache(msgspec.structs.replace(envelope, bundle=bundle), payload))
    return prefix


def best_of(argv: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - started)
        if proc.returncode not in (0, 1):
            sys.exit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr}")
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prefix = build_pair(Path(tmp), args.size_mb)
        cache_size = prefix.with_suffix(".cache").stat().st_size
        show = best_of([sys.executable, "-m", "precompile", "show", str(prefix)], args.repeat)
        torch = best_of([sys.executable, "-c", "import torch"], args.repeat)
    print(f"cache size:            {cache_size / 1e6:.1f} MB")
    print(f"precompile show:       {show * 1000:.0f} ms (best of {args.repeat}, fresh process)")
    print(f"python -c 'import torch': {torch * 1000:.0f} ms (best of {args.repeat}, fresh process)")
    print(f"ratio show / import torch: {show / torch:.2f}")


if __name__ == "__main__":
    main()
