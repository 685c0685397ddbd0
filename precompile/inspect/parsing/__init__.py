"""python_code read as text, never run: cut into sections (`sections`) and into parts parsed one at a
time (`chunked_parse`); the rendered guards read from those parts (`rendered_guards`, `check_text`); the
pickles it carries as literals found and scanned (`opaque`); each part's readings kept for the next read
(`part_readings`).

Imports from inspect: `model` only. Beside it: the artifact room and precompile.errors.
"""
