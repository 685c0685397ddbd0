"""Fresh-process half of `precompile demo`: load the pair and serve one call under
no_compilation() (so anything that would compile raises), then compare with eager.

Prints one JSON line: timings, the largest difference from eager, and whether Inductor was imported.
"""
from __future__ import annotations

import json
import sys
import time


def main(artifact_path: str, cache_path: str) -> None:
    started = time.perf_counter()
    import torch

    import precompile
    from precompile.examples.transformer import make_demo, run

    imported = time.perf_counter()
    model, x = make_demo()
    with torch.no_grad(), precompile.no_compilation():  # the grad mode the demo captures in
        started_load = time.perf_counter()
        runnable = precompile.load(artifact_path, cache_path)
        loaded = time.perf_counter()
        served = runnable(model, x)
        called = time.perf_counter()
    inductor_imported = any(name.startswith("torch._inductor") for name in sys.modules)
    with torch.no_grad():
        expected = run(model, x)
    print(
        json.dumps(
            {
                "import_s": imported - started,
                "load_s": loaded - started_load,
                "first_call_s": called - loaded,
                "max_abs_diff": (served - expected).abs().max().item(),
                "cache_used": runnable.cache_used,
                "inductor_imported": inductor_imported,
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])
