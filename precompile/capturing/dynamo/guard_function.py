"""A variant's collected checks written out as its guard function, `guards_F_V(L, G, explain=False)`.

The order is the order calls that miss fail in: global state, then tensors (one C++ call), then each
check as collected, aliasing, dimension markings. The kept guards that add no check of their own are
named in comments at the top, with the reason; where many guards of one kind share a reason (every
module's hook dicts, say), the comment says it once, with their count: the GUARDS literal lists each
of them (the comment does not name it, so that the bytecode may leave it out: artifact/bytecode.py).
A source the checks read more than once is read once into a local `sN` (see shared_sources). A
check Dynamo recorded the user's line for names it in a comment beside its label (guard_origin).
"""
from __future__ import annotations

from typing import Any

from precompile.capturing.dynamo.guard_accounting import slot_source
from precompile.capturing.dynamo.shared_sources import shared_sources

FOLDED_NOTES = 3
"""More guards than this of one kind with one reason are noted in one comment line."""


def folded_notes(notes: list[tuple[str, str]]) -> list[str]:
    """The comment lines for `notes` ((label, reason), label "KIND source"): one per guard, except
    that a kind and reason shared by more than FOLDED_NOTES guards is one line with their count, in
    the place of the first of them."""
    groups: dict[tuple[str, str], list[str]] = {}
    for label, reason in notes:
        groups.setdefault((label.split(" ", 1)[0], reason), []).append(label)
    lines = []
    for (kind, reason), labels in groups.items():
        if len(labels) > FOLDED_NOTES:
            lines.append(f"{kind} on {len(labels)} sources (the metadata's guard list names each): {reason}")
        else:
            lines += [f"{label}: {reason}" for label in labels]
    return lines


def guard_function(variant: Any, title: str) -> str:
    """The tables and guard function of `variant` (what guard_code collected of one variant: its
    prefix, checks, notes, tensors, aliasing and markings), as python_code's text titled `title`."""
    prefix = variant.prefix
    out = [f"# {title}"]
    body = []
    if variant.global_state is not None:
        out.append(f"_global_state_{prefix} = _GlobalState({variant.global_state!r})")
        body += ['    failing = "GLOBAL_STATE"',
                 f"    if not _global_state_{prefix}.check():",
                 f"        return _global_state_{prefix}.reason() if explain else failing"]
    checks: list[tuple[str, str, str]] = []  # (label, expression, how the function uses it)
    # Tensors first: the check most calls that miss fail on, in one C++ call.
    if variant.tensors:
        rows = "".join(f"\n    {row!r}," for row in variant.tensors)
        keywords = "".join(f", {name}={value!r}" for name, value in (("inference", tuple(variant.inference)),
                                                                      ("modes", variant.modes)) if value)
        out.append(f"_tensors_{prefix} = _TensorMatch(({rows}\n){keywords})")
        sources = ", ".join(variant.tensor_sources) + ("," if len(variant.tensor_sources) == 1 else "")
        checks.append(("TENSOR_MATCH", f"({sources})", "tensors"))
    checks += [(label, condition, "holds") for label, condition in dict.fromkeys(variant.lines)]
    if len(variant.aliasing) > 1:
        checks.append(('"NO_TENSOR_ALIASING: " + ' + repr(", ".join(slot_source(s) for s in variant.aliasing)),
                       f"len({{id(t) for t in ({', '.join(variant.aliasing)})}}) != {len(variant.aliasing)}", "fails"))
    checks += [(label, condition, "marking") for label, condition in variant.marking]
    origins = variant.origins
    for (label, _, use), (bindings, expression) in zip(checks, shared_sources([c for _, c, _ in checks])):
        made_at = f"  # {origins[label]}" if use == "holds" and label in origins else ""
        body.append(f"    failing = {label if use == 'fails' else repr(label)}{made_at}")
        body += [f"    {binding}" for binding in bindings]
        if use == "tensors":
            body += [f"    tensors = {expression}", f"    if not _tensors_{prefix}.check(tensors):",
                     f"        return _tensors_{prefix}.reason(tensors) if explain else failing"]
            continue
        if use == "marking":
            expression = expression.replace(" and ", " and\n            ")
        body += [f"    if {expression}:" if use == "fails" else f"    if not ({expression}):", "        return failing"]
    notes = "".join(f"\n    # {line}" for line in folded_notes(variant.notes))
    out += [
        "",
        "",
        f"def guards_{prefix}(L, G, explain=False):",
        f'    """{title}: the first kept guard that fails, or None when all hold (a source that is not',
        '    there fails its guard). L: the bound arguments, G: the globals of the frame\'s module;',
        '    explain: say why the tensor or global-state check failed (torch\'s own words), not only its name."""'
        + notes,
        '    failing = "(none yet)"',
        "    try:",
        *("    " + line for line in body),
        "    except Exception:  # noqa: BLE001 - a guard whose source is not there fails",
        "        return failing",
        "    return None",
    ]
    return "\n".join(out)
