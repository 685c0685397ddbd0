"""Guards that read a set by its members' places: Dynamo reads a set of members it cannot fold as
constants (enum members, objects) as a list, and guards each member where it sits
(`CONSTANT_MATCH list(G['MODES'])[0]._name_`, `DUPLICATE_INPUT G['Kind'].RED is list(G['MODES'])[0]`). A set's order is its hash table's: members that hash
by a string (an enum member hashes by its name) take the order of the process's string hash seed,
members hashed by identity that of their addresses. A serving process that orders the set otherwise
refuses the call, since the graph may have baked the order in (a loop over the set), and the driver
says why (drivers/dynamo_checks.py). Capture warns of it here, where the remedy is cheapest.
"""
from __future__ import annotations

import logging
import os
import re
import warnings

from precompile.capturing.dynamo.guard_expressions import PAIRED
from precompile.errors import PrecompileWarning

log = logging.getLogger("precompile")

# `list(<source>)[N]`, torch 2.14's `___set_getitem(<source>, N)`: Dynamo's read of a set's N-th member;
# a source may call `dict(type(...).__dict__)` (a class attribute). A dict's keys read so are spelled
# `list(dict.keys(...))[N]`, in the dict's insertion order, which every process shares.
_SOURCE = rf"((?!dict\.keys\(){PAIRED})"
_SET_MEMBER = re.compile(rf"\blist\({_SOURCE}\)\[\d+\]|\b___set_getitem\({_SOURCE}, \d+\)")


# The label a rendered guard function names a check by before it runs it (standalone python_code, an
# installed variant's readable `rendered` text inside it): what a serving call's refusal names.
_FAILING = re.compile(r"failing = (\"|')(.+?)\1")


def warn_set_order(python_code: str) -> None:
    """Warns, naming each set, where the checks python_code renders read a set's members by place."""
    sets = sorted({found.group(1) or found.group(2) for label in _FAILING.finditer(python_code)
                   for found in _SET_MEMBER.finditer(label.group(2))})
    if not sets:
        return
    seed = os.environ.get("PYTHONHASHSEED", "random")
    seed_text = "under a random hash seed" if seed == "random" else f"under PYTHONHASHSEED={seed}"
    message = (
        f"the guards read set {', '.join(sets)} member by member, in the order this process iterates "
        f"{'it' if len(sets) == 1 else 'them'} (this capture ran {seed_text}); members that hash by a string (enum "
        "members, strings) are ordered by the process's hash seed, others by their addresses, so a serving "
        "process that orders it otherwise refuses the call. Make it a tuple, or (members that hash by a string) "
        "capture and serve under one fixed PYTHONHASHSEED"
    )
    log.warning("%s", message)
    warnings.warn(message, PrecompileWarning, stacklevel=6)
