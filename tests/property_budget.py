"""How hard the property tests (hypothesis) search, by profile.

`repeatable` (the default: `./dev test`, `./dev quick`, CI) draws the same examples on every run of
the same commit (derandomized, no example database), so a landing never fails on a counterexample its
change did not make. `fuzz` (`./dev fuzz`, PRECOMPILE_HYPOTHESIS=fuzz) searches afresh on every run,
`FUZZ_FACTOR` times as many examples (10 unless the environment says), keeps what it finds in
./.hypothesis/ so the next fuzz run replays it first, and prints each failure's reproducing blob: turn
a counterexample into an `@example` beside its property before fixing it.
"""
from __future__ import annotations

import os

from hypothesis import settings

PROFILE = os.environ.get("PRECOMPILE_HYPOTHESIS", "repeatable")
FACTOR = int(os.environ.get("FUZZ_FACTOR", "10")) if PROFILE == "fuzz" else 1

settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True)
settings.register_profile("fuzz", derandomize=False, print_blob=True)
if PROFILE not in ("repeatable", "fuzz"):
    raise ValueError(f"PRECOMPILE_HYPOTHESIS={PROFILE!r}: the profiles are 'repeatable' (the default) and 'fuzz'")
settings.load_profile(PROFILE)


def examples(repeatable: int) -> int:
    """The examples a property draws: `repeatable` in the default profile, FACTOR times that when fuzzing."""
    return repeatable * FACTOR
