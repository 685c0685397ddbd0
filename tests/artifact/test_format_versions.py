"""Our own format versions with teeth: the committed JSON Schemas and what the templates render are
fingerprinted per FORMAT_VERSION in tests/artifact/format_fingerprints.json, and every layout ever written
keeps a fixture that show, verify and diff read.

When test_the_format_matches_a_fingerprint_of_its_version fails, you changed the artifact format:
- an incompatible change (a field removed, renamed, retyped or newly required; a section moved, or
  retitled so that an older reader no longer splits it or names it differently): bump FORMAT_VERSION in precompile/artifact/envelope.py, keep reading the old version,
  add fixtures/v<N>, and start a new list under "<N>" with the fingerprint the failure prints;
- a compatible change (new optional fields only, msgspec's rules): append the printed fingerprint
  to the current version's list with a "change" line saying what was added; the test checks that
  each entry only adds optional fields to the one before it.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from precompile.cli.main import main
from precompile.codegen import render as render_module
from precompile.codegen.models import GraphSection, MakeFxArtifact, SubgraphSection
from precompile.inspect.model import report
from precompile.artifact import jsonschema
from precompile.artifact.envelope import FORMAT_VERSION
from precompile.artifact.pycode import parse_metadata

ROOT = Path(__file__).parent.parent.parent
FINGERPRINTS = Path(__file__).parent / "format_fingerprints.json"
FIXTURES = ROOT / "fixtures"


def _schema_texts() -> dict[str, str]:
    texts = {name: jsonschema.render(struct) for name, struct in jsonschema.EXPORTED.items()}
    texts["report.schema.json"] = report.render_schema()
    return texts


def _fields(schema: dict) -> dict[str, dict[str, list[str]]]:
    """{definition: {"required": [...], "optional": [...]}} of a msgspec JSON Schema."""
    fields = {}
    for name, definition in sorted(schema.get("$defs", {}).items()):
        properties = sorted(definition.get("properties", {}))
        required = sorted(definition.get("required", []))
        fields[name] = {"required": required, "optional": [p for p in properties if p not in required]}
    return fields


def _rendering() -> str:
    """sha256 of python_code rendered from fixed inputs, drivers stubbed: the layout the templates
    write (banners, section order and titles, metadata literal order), not the drivers' code."""
    original = render_module.source_of
    render_module.source_of = lambda name: f"# <driver {name}>\n"
    try:
        makefx = parse_metadata((FIXTURES / "v1" / "mlp.py").read_text(encoding="utf-8"))
        dynamo = parse_metadata((FIXTURES / "v1" / "dynamo_break_eager.py").read_text(encoding="utf-8"))
        texts = [
            render_module.render_makefx(MakeFxArtifact(
                metadata=makefx,
                graph=GraphSection(title="Graph title", source="def captured_graph(*flat):\n    return flat", entry="captured_graph",
                                   runtime="inductor_runtime"),
            )),
            render_module.render_dynamo(
                dynamo, [SubgraphSection(title="Subgraph title", slug="g", name="g", source="def g():\n    pass", runs_in_place=True)],
                "c3RhdGU=", "0" * 64, 5,
            ),
        ]
    finally:
        render_module.source_of = original
    return hashlib.sha256("\n".join(texts).encode("utf-8")).hexdigest()


def current_fingerprint() -> dict:
    texts = _schema_texts()
    return {
        "schemas": {
            name: {"sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "fields": _fields(json.loads(text))}
            for name, text in sorted(texts.items())
        },
        "rendering": _rendering(),
    }


def _history() -> dict[str, list[dict]]:
    return json.loads(FINGERPRINTS.read_text(encoding="utf-8"))


def test_the_format_matches_a_fingerprint_of_its_version():
    current = current_fingerprint()
    entries = _history().get(str(FORMAT_VERSION), [])
    known = [{"schemas": e["schemas"], "rendering": e["rendering"]} for e in entries]
    assert current in known, (
        f"the committed JSON Schemas or the rendered layout changed, and FORMAT_VERSION is still {FORMAT_VERSION}: "
        "see this module's docstring. The new fingerprint:\n" + json.dumps(current, indent=2, sort_keys=True)
    )


def test_changes_within_a_version_only_add_optional_fields():
    for version, entries in _history().items():
        assert entries and all(e.get("change") for e in entries), f"format {version}: every entry says what it is"
        for before, after in zip(entries, entries[1:]):
            for name, schema in before["schemas"].items():
                new = after["schemas"][name]["fields"]
                for definition, fields in schema["fields"].items():
                    assert definition in new, (version, after["change"], f"{name}: {definition} removed")
                    assert new[definition]["required"] == fields["required"], (version, after["change"], definition)
                    assert set(fields["optional"]) <= set(new[definition]["optional"]), (version, after["change"], definition)


def _layouts() -> list[tuple[str, str]]:
    """(format version dir, pair name) of every fixture pair kept for a format version."""
    return sorted((d.name, p.stem) for d in FIXTURES.glob("v*") for p in d.glob("*.py"))


def test_every_format_version_written_keeps_fixtures():
    versions = {int(d.name[1:]) for d in FIXTURES.glob("v*")}
    assert versions == set(range(1, FORMAT_VERSION + 1))
    names = {name for _, name in _layouts()}
    # v1 holds three Dynamo layouts: subgraphs in the opaque state (dynamo_rows*), as readable source
    # (dynamo_break_eager), and lowered to output modules the kernel runtime serves (dynamo_lowered)
    assert {"mlp", "mlp_inductor", "dynamo_rows", "dynamo_rows_risky", "dynamo_break", "dynamo_break_eager",
            "dynamo_lowered"} <= names


@pytest.mark.parametrize(("version", "name"), _layouts())
def test_show_verify_and_diff_read_every_layout_ever_written(version, name, capsys):
    pair = str(FIXTURES / version / name)
    assert main(["show", pair]) == 0
    assert main(["verify", pair]) == 0
    assert main(["diff", pair, pair]) == 0
    out = capsys.readouterr().out
    assert name in out
