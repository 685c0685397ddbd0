"""The checks of `precompile verify`: a pair's integrity and signature (`verify`), the proof in a
bounded child that a cache's bytecode is its python_code's (`bytecode_proof`), and `verify --host` of a
bare Mega-Cache (`mega_cache_host`).

Imports from inspect: `model`, `formats`, `parsing` (the proof compiles python_code a part at a time).
It reads the files it proves again itself, so it never imports `reading`. Beside it: the artifact and
signing rooms.
"""
