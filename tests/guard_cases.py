"""A global dict subclass whose own __setitem__ files an entry under another key, the shape of
transformers' _CanRecordRegistry: unpickling such a dict replays __setitem__, so a pickled copy of it
holds other keys than the live one. Importable by a fresh process (DynamoTracer needs that)."""
from __future__ import annotations


class FiledByType(dict):
    """Registering an object files it under its type's name; the live entries here were put in with
    dict's own __setitem__, under the names a caller chose."""

    def __setitem__(self, obj, value):
        super().__setitem__(str(type(obj)), value)


REGISTRY = FiledByType()
dict.__setitem__(REGISTRY, "scale", 3.0)


def scaled_by_the_first_entry(x):
    key = next(iter(REGISTRY))
    return x * REGISTRY[key]


class Settings:
    """A configuration object whose fields are read through its instance __dict__ by its own
    __getattribute__ (transformers' PretrainedConfig reads its fields so): Dynamo pins each field
    read that way by identity (ID_MATCH), which the artifact checks by type and value."""

    def __init__(self, mode: str, enabled: bool) -> None:
        self.mode = mode
        self.enabled = enabled

    def __getattribute__(self, name):
        fields = object.__getattribute__(self, "__dict__")
        return fields[name] if name in fields else object.__getattribute__(self, name)


def by_settings(settings, x):
    if settings.enabled and settings.mode == "double":
        return x * 2
    return x + 1
