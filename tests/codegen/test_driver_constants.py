"""Drivers run standalone (only torch installed), so they keep their own copies of a few runtime
and inspect constants; these tests keep each copy equal to its source."""
from __future__ import annotations

import inspect as pyinspect
import re
from pathlib import Path

import pytest

from precompile.codegen import render
from precompile.codegen.drivers import dynamo_checks
from precompile.codegen.drivers import makefx as makefx_driver
from precompile.inspect.reading.guards import shape_text
from precompile.capturing.dynamo import guard_accounting

TEMPLATES = Path(render.__file__).parent / "templates"


def test_the_dynamo_driver_reads_guard_slots_with_the_runtime_slot_pattern():
    assert dynamo_checks._LOCAL == guard_accounting._LOCAL.pattern  # the driver keeps its patterns as text
    assert guard_accounting._LOCAL.flags == re.compile(dynamo_checks._LOCAL).flags


@pytest.mark.parametrize("shape", [(), (3,), (None,), (2, None, 4), (1, 1)])
def test_the_makefx_driver_renders_shapes_as_inspect_shows_them(shape):
    assert makefx_driver._shape_text(shape) == shape_text(shape)


def test_the_opaque_state_name_render_writes_is_the_one_the_dynamo_template_passes_to_the_driver():
    template = (TEMPLATES / "dynamo.py.j2").read_text(encoding="utf-8")
    assert "build_forward(globals(), _dynamo_state," in template
    assert '"_dynamo_state = "' in pyinspect.getsource(render.render_dynamo)
    standalone = pyinspect.getsource(render.render_dynamo_standalone)
    assert '"_dynamo_state = "' in standalone and '"_dynamo_state = None"' in standalone


@pytest.mark.parametrize(
    "ref", ["torch:", "torch.nn.functional:", "torch._dynamo.decorators:graph_break", "enum:Enum", "torch.nn:Linear.forward"],
)
def test_the_dynamo_driver_resolves_named_identity_references_as_capture_wrote_them(ref):
    from precompile.capturing.dynamo import named_identity

    assert dynamo_checks._resolve_reference(ref) is named_identity.resolve(ref)


@pytest.mark.parametrize(
    ("source", "walkable"),
    [("func", True), ("L['func']", True), ("G['torch']._dynamo", True), ("args[0].__class__", True),
     ("type(self)", True), ("self._modules['mlp'].forward", True), ("dict(type(x).__dict__)['f']", False),
     ("G['a'].b[x]", False)],
)
def test_the_dynamo_driver_walks_exactly_the_sources_capture_checks_by_name(source, walkable):
    from precompile.capturing.dynamo import named_identity

    assert bool(named_identity.SOURCE.fullmatch(source)) is walkable
    if walkable:  # the driver's root and steps cover the whole source
        inner = source[5:-1] if source.startswith("type(") else source
        root = re.match(dynamo_checks._SOURCE_ROOT, inner)
        rest = inner[root.end():]
        assert "".join(m.group(0) for m in re.finditer(dynamo_checks._SOURCE_STEP, rest)) == rest
