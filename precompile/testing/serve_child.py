"""`python -m precompile.testing.serve_child PYTHON_CODE CACHE INPUTS OUT`: serve an artifact in this
fresh process under `no_compilation()` and save what it returns to OUT. INPUTS, written by the test
that started this process, holds either the test's own arguments, or its fn and factory by name:
then the factory builds the arguments here, as a serving process builds its model, and OUT also
holds what fn returns eagerly on them, run after the served call."""
from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    import torch

    import precompile

    python_code, cache, inputs, out = argv
    kind, saved = torch.load(inputs, weights_only=False)  # written by the test itself
    fn, args = (None, saved) if kind == "args" else (saved[0], tuple(saved[1]()))
    served = precompile.load(python_code, cache)
    with precompile.no_compilation():
        result = served(*args)
    torch.save((result, None if fn is None else fn(*args)), out)


if __name__ == "__main__":
    main(sys.argv[1:])
