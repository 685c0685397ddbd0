"""Opening an artifact pair into the typed model (`reader`: python_code, our cache, and the formats
of `formats/` told by content), and what is read from an opened one: its guards (`guards`), its frames'
names (`frames`), its kernel bundle's files (`bundle_payload`) and its parts written out for other tools
(`extract`).

Imports from inspect: `model`, `formats`, `parsing`, and `verify` for one thing: `reader` starts the
bytecode proof (`verify.start_proofs`) before it parses python_code, so the two overlap. Beside it: the
artifact room and precompile.errors.
"""
