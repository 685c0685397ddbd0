"""Module-level functions reading a dict registry as transformers reads `_CAN_RECORD_REGISTRY` (keyed
by the model's class name, filled in the order the process built its models), for DynamoTracer tests
of what an artifact checks of such a dict (key_lookups)."""
from __future__ import annotations

import torch


class Registry(dict):
    """Keyed by the model's class name, as transformers' `_CanRecordRegistry` keys by `str(model.__class__)`."""

    def get(self, model):
        return super().get(type(model).__name__) or {}


REGISTRY = Registry()


CASES = ("scaled", "scaled_by_all", "scaled_after_break")


def fill(*entries: tuple[str, float]) -> None:
    """The registry as a process's history left it: these class names, in this order."""
    REGISTRY.clear()
    for name, scale in entries:
        REGISTRY[name] = {"scale": scale}


def scaled(model, x):
    """Reads its own class's entry by key only."""
    return model(x) * REGISTRY.get(model)["scale"]


def scaled_by_all(model, x):
    """Iterates the registry: every key and its order are part of what it computed."""
    return model(x) * sum(spec["scale"] for spec in REGISTRY.values())


def scaled_after_break(model, x):
    """Reads its entry before a graph break and uses it after: the served bytecode rebuilds the entry
    from where Dynamo found it."""
    spec = REGISTRY.get(model)
    y = model(x)
    torch._dynamo.graph_break()
    return y * spec["scale"]


class Table(dict):
    """A dict subclass: Dynamo reads it item by item, so a lookup guards the key's position."""


WEIGHTS = {name: torch.full((2, 4), float(index + 1)) for index, name in enumerate(("Other", "Linear", "Third"))}
TABLES = {"weights": Table()}
"""A registry nested in a global dict: the served bytecode reaches it as TABLES['weights'], a constant key."""


def fill_tables(*names: str) -> None:
    TABLES["weights"].clear()
    TABLES["weights"].update((name, WEIGHTS[name]) for name in names)


def weighted(x):
    """Reads a tensor by key from a nested registry: the graph input is fetched by the key's position."""
    return x * TABLES["weights"]["Linear"]


class Defaults(dict):
    """A dict subclass whose missing keys read as 1.0: Dynamo checks a miss by the keys it looked past."""

    def __missing__(self, key):
        return 1.0


DEFAULTS = Defaults()


def fill_defaults(*entries: tuple[str, float]) -> None:
    DEFAULTS.clear()
    DEFAULTS.update(entries)


def defaulted(x):
    """Reads a present key and a missing one (its default, through __missing__)."""
    return x * DEFAULTS["Linear"] * DEFAULTS["Missing"]


QUOTED = Table()
QUOTING = "list(dict.keys(G['QUOTED']))[1]"
"""A key that spells the guard source of another key's position in QUOTED."""


def fill_quoted(*entries: tuple[str, float]) -> None:
    QUOTED.clear()
    QUOTED.update(entries)


def quoted(x):
    return x * QUOTED[QUOTING] * QUOTED["b"]


FALLBACK = Table()


def fill_fallback(*entries: tuple[str, float]) -> None:
    FALLBACK.clear()
    FALLBACK.update(entries)


def fallback(x):
    """Catches the KeyError of a missing key: Dynamo checks the miss only by the keys it looked past."""
    try:
        missing = FALLBACK["Missing"]
    except KeyError:
        missing = 1.0
    return x * FALLBACK["Linear"] * missing
