"""Signed pairs with pins in the load fuzz (bench/load_fuzz.py): about a third of the cases sign their
mutated pair, honestly or not, and load them under pinned keys and a pinned identity.

A case's signing scheme is drawn from a random stream of its own (the mutations each case draws are
those it drew before signing joined the fuzz). The pins: trusted_keys=[release.pub],
expect_name=PINNED_NAME, min_release=PINNED_RELEASE. A scheme the pins accept goes on through every
other check load makes, as an unsigned case does; a scheme they refuse must end in PrecompileError,
else the case fails as "served against its pins".
"""
from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass
from pathlib import Path

PINNED_NAME = "fuzz-model"
PINNED_RELEASE = "3"
SIGNED_SHARE = 0.35

SCHEMES: dict[str, bool] = {
    # scheme: whether the pins accept the pair it signs
    "signed as pinned": True,
    "signed as a newer release": True,
    "signed as an older release": False,
    "signed as another model": False,
    "signed without identity (first format)": False,
    "signed by an untrusted key": False,
    "statement edited after signing": False,
    "signature bytes flipped": False,
    "signature file garbage": False,
}


@dataclass(frozen=True)
class Keys:
    release: Path
    """The release key pair's prefix (release.key, release.pub): the pins trust release.pub."""
    other: Path
    """A key pair no pin trusts."""

    def pins(self) -> dict:
        """load()'s keyword arguments for a signed case."""
        return {"trusted_keys": [str(self.release.with_suffix(".pub"))], "expect_name": PINNED_NAME, "min_release": PINNED_RELEASE}


def make_keys(directory: Path) -> Keys:
    from precompile.signing import generate

    directory.mkdir(parents=True, exist_ok=True)
    generate(directory / "release")
    generate(directory / "other")
    return Keys(release=directory / "release", other=directory / "other")


def draw(seed: str, number: int) -> str | None:
    """The case's signing scheme, or None for an unsigned, unpinned case."""
    rng = random.Random(f"load-fuzz-sign-{seed}-{number}")
    return rng.choice(sorted(SCHEMES)) if rng.random() < SIGNED_SHARE else None


def _identity(scheme: str) -> tuple[str | None, str | None]:
    return {
        "signed as a newer release": (PINNED_NAME, "3.1"),
        "signed as an older release": (PINNED_NAME, "2.9"),
        "signed as another model": ("another-model", PINNED_RELEASE),
        "signed without identity (first format)": (None, None),
    }.get(scheme, (PINNED_NAME, PINNED_RELEASE))


def sign_case(scheme: str, python_code: Path, cache: Path, keys: Keys, number: int) -> None:
    """Write the case's `<stem>.sig` as `scheme` says."""
    from precompile.signing import sign_pair

    name, release = _identity(scheme)
    key = keys.other if scheme == "signed by an untrusted key" else keys.release
    path, _ = sign_pair(python_code, cache, key.with_suffix(".key"), name=name, release=release)
    rng = random.Random(f"load-fuzz-sign-bytes-{number}")
    if scheme == "signature file garbage":
        text = path.read_bytes()
        path.write_bytes(rng.choice((text[: rng.randrange(len(text))], bytes(rng.randrange(256) for _ in range(200)),
                                     b'{"payloadType": "application/vnd.in-toto+json", "payload": 7, "signatures": []}')))
    elif scheme in ("statement edited after signing", "signature bytes flipped"):
        document = json.loads(path.read_text())
        if scheme == "statement edited after signing":
            statement = json.loads(base64.b64decode(document["payload"]))
            statement["predicate"]["release"] = "99"
            document["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
        else:
            sig = bytearray(base64.b64decode(document["signatures"][0]["sig"]))
            sig[rng.randrange(len(sig))] ^= 1 << rng.randrange(8)
            document["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
        path.write_text(json.dumps(document))


def against_pins(scheme: str | None, outcome: str) -> bool:
    """Whether a case its pins refuse ended other than in PrecompileError."""
    return scheme is not None and not SCHEMES[scheme] and outcome != "PrecompileError"
