"""JSON Schemas of the artifact format, exported into the package and checked against the Structs.

Regenerate the committed files after a deliberate format change with
`python -m precompile.artifact.jsonschema`; a test fails while they drift.
"""
from __future__ import annotations

import json
from pathlib import Path

import msgspec

from precompile.artifact.envelope import CacheEnvelope
from precompile.artifact.metadata import ArtifactMetadata

SCHEMA_DIR = Path(__file__).parent

EXPORTED = {
    "cache-envelope.schema.json": CacheEnvelope,
    "python-code-metadata.schema.json": ArtifactMetadata,
}


def render(struct_type) -> str:
    """The schema of `struct_type` as stable, diff-friendly JSON text."""
    return json.dumps(msgspec.json.schema(struct_type), indent=2, sort_keys=True) + "\n"


def committed(name: str) -> str:
    return (SCHEMA_DIR / name).read_text(encoding="utf-8")


def main() -> None:
    for name, struct_type in EXPORTED.items():
        (SCHEMA_DIR / name).write_text(render(struct_type), encoding="utf-8")
        print(f"wrote {SCHEMA_DIR / name}")


if __name__ == "__main__":
    main()
