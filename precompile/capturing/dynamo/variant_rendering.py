"""One variant's kept guards rendered as the Python that checks them (guard_code.py renders each
guard, guard_function.py writes the function): for a standalone artifact, the checks that run; for an
installed one, the text readers and `precompile diff` read its values from (`readable=True`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from precompile.capturing.dynamo.guard_accounting import slot_source, slot_text
from precompile.capturing.dynamo.guard_code import Unrenderable, _Variant
from precompile.capturing.dynamo.guard_function import guard_function
from precompile.capturing.dynamo.key_lookups import KeyLookups


@dataclass
class RenderedVariant:
    function: str
    """Name of the rendered check function, e.g. `guards_0_1`."""
    source: str
    """Its text with the helper objects it uses (tensor and global-state checks)."""
    references: set = field(default_factory=set)
    """`module:qualname` references the checks compare against, resolved at load."""


def render_variant(frame: int, variant: int, title: str, state, policy: frozenset, by_name: tuple[str, ...],
                   renames: dict[str, str], seen: dict | None = None, module_globals: dict | None = None,
                   lookups: KeyLookups | None = None, readable: bool = False) -> RenderedVariant:
    """The rendered check of one variant (its guards state loaded, the policy's slots left out, its by-name
    identity lines; `module_globals`: its module's live globals), or Unrenderable naming the first guard
    it cannot render. `readable`: text for readers, never run, where a guard with no rendering is noted
    as such and the rest are rendered (an installed variant's: one setting that renders no literal
    hides no other's value from `precompile diff`)."""
    if state.output_graph._aotautograd_guards:
        raise Unrenderable("AOTAutograd guards: the variant carries guards AOTAutograd added, not rendered here")
    rendering = _Variant(frame, variant, state, renames, seen, module_globals, lookups)
    guards = sorted(state.output_graph.guards, key=lambda g: (g.create_fn_name(), g.name))
    checks = [(guard, lambda guard=guard: rendering.add(guard)) for guard in guards
              if not rendering.lookups.skipped(guard.create_fn_name(), guard.name)  # a dict read by key: dropped
              and slot_text(rendering.lookups.slot((guard.create_fn_name(), slot_source(guard.name)))) not in policy]
    checks += [(line, lambda line=line: rendering.identity_line(line)) for line in by_name]
    for what, add in checks:
        try:
            add()
        except Unrenderable as exc:
            if not readable:
                raise
            label = what if isinstance(what, str) else f"{what.create_fn_name()} {what.name}"
            rendering.notes.append((label, f"not rendered here ({exc})"))
    return RenderedVariant(function=f"guards_{rendering.prefix}", source=guard_function(rendering, title),
                           references=rendering.references)
