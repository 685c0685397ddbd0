"""`python -m precompile.testing.serve_child PYTHON_CODE CACHE INPUTS OUT`: serve an artifact in this
fresh process under `no_compilation()` on the arguments `precompile_snapshot` saved (INPUTS, written
by the test that started this process), and save what it returns to OUT."""
from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    import torch

    import precompile

    python_code, cache, inputs, out = argv
    args = torch.load(inputs, weights_only=False)  # the test's own arguments, saved by the test itself
    served = precompile.load(python_code, cache)
    with precompile.no_compilation():
        result = served(*args)
    torch.save(result, out)


if __name__ == "__main__":
    main(sys.argv[1:])
