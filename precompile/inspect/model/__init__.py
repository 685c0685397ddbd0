"""The typed vocabulary of inspect: the model of an artifact pair every verb reads into (`artifact`) and
the `--json` report each verb answers with (`report`, and its exported `report.schema.json`).

Imports from inspect: nothing (the bottom room). Beside it: the artifact room's schema Structs and
pickle model, and precompile.errors.
"""
