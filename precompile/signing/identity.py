"""What a deployment pins about a signed pair's identity: its name, and the oldest release it serves.

A release is a PEP 440 version (an integer is one), compared as one: 10 > 9, 1.10 > 1.9, 2.0rc1 < 2.0.
Each pin stands on its own (load's arguments, the environment): neither loosens the other.
Torch-free; comparing releases needs `packaging` (the sign extra).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from precompile.errors import PrecompileError
from precompile.signing.keys import EXTRA
from precompile.signing.statement import PairIdentity

__all__ = ["EXPECT_NAME_ENV", "MIN_RELEASE_ENV", "Expectation", "expectation", "expectations_for", "identity_problem", "release"]

EXPECT_NAME_ENV = "PRECOMPILE_EXPECT_NAME"
"""The name a signed pair must carry for load() to serve it."""
MIN_RELEASE_ENV = "PRECOMPILE_MIN_RELEASE"
"""The oldest release load() serves: a signed pair of an older release is refused."""


def release(text: str, what: str) -> Any:
    """`text` as a PEP 440 version (packaging.version.Version); anything else is a PrecompileError naming `what`."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError as exc:
        raise PrecompileError(f"comparing releases needs the packaging package, which cannot be imported here ({exc}); "
                              f"install the extra: {EXTRA}") from None
    try:
        return Version(str(text))
    except (InvalidVersion, ValueError):  # ValueError: a number over the interpreter's 4,300-digit limit
        raise PrecompileError(f"{what} {text!r} is not a release: pass an integer (1, 2, ...) or a PEP 440 version "
                              "(1.10, 2.0rc1) that grows with every release") from None


@dataclass(frozen=True)
class Expectation:
    """One pin on a signed pair's identity, and who set it (for messages)."""

    source: str
    name: str | None = None
    min_release: str | None = None


def expectation(source: str, name: str | None, min_release: str | int | None) -> Expectation | None:
    """The pin `source` sets: a name, a minimum release (checked to be a release), or both; None for neither."""
    if name is None and min_release is None:
        return None
    if name is not None and not isinstance(name, str):
        raise PrecompileError(f"{source}: the expected name must be text, got {type(name).__name__} {name!r}"[:300])
    if min_release is not None and (type(min_release) not in (str, int)):
        raise PrecompileError(f"{source}: the minimum release must be an integer or a PEP 440 version as text "
                              f"(\"1.10\", not the float 1.1), got {type(min_release).__name__} {min_release!r}"[:300])
    if name is not None and not name.strip():
        raise PrecompileError(f"{source}: the expected name is empty; pass the name the release was signed with, or none")
    floor = None if min_release is None else str(release(str(min_release), f"{source}: the minimum release"))
    return Expectation(source=source, name=name, min_release=floor)


def expectations_for(expect_name: str | None, min_release: str | int | None, *, argument: str) -> list[Expectation]:
    """The identity pins: the caller's (`argument` names them, e.g. "load(expect_name=, min_release=)")
    and the environment's, each its own."""
    found = [expectation(argument, expect_name, min_release),
             expectation(f"{EXPECT_NAME_ENV}/{MIN_RELEASE_ENV}", os.environ.get(EXPECT_NAME_ENV), os.environ.get(MIN_RELEASE_ENV))]
    return [pin for pin in found if pin is not None]


def identity_problem(identity: PairIdentity, pin: Expectation) -> str | None:
    """Why a signed identity does not meet a pin, naming both values; None when it does."""
    if pin.name is not None and identity.name != pin.name:
        return (f"it is signed as name {identity.name!r} (release {identity.release}), but {pin.source} expects name "
                f"{pin.name!r}: another model signed by a trusted key")
    if pin.min_release is not None:
        floor = release(pin.min_release, "the minimum release")
        if release(identity.release, "the signed release") < floor:
            return (f"it is signed as release {identity.release} of {identity.name!r}, older than the minimum release "
                    f"{pin.min_release} that {pin.source} requires: a rollback to an older release")
    return None
