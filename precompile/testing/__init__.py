"""precompile.testing: lock a model's artifact in its own test suite.

`plugin` is the pytest plugin installing precompile registers (entry point `pytest11`, name
`precompile`; `-p no:precompile` turns it off). Its fixture `precompile_snapshot` captures a
computation, serves the artifact in a fresh process under `no_compilation()` against eager, and
compares a readable, normalized form of it with the snapshots under `__snapshots__/` (syrupy:
`pytest --snapshot-update` writes them). docs/testing.md walks through it.

Rooms below this one are imported only when a test asks for a capture: importing the plugin
imports neither torch nor the capture side.
"""
