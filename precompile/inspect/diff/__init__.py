"""The semantic diff of two opened artifacts (`diff`): keyed by identity, python_code compared line by
line (`code_lines`, `line_diff`) with the names Dynamo mints per process masked (`process_ids`), kernels
by their Inductor names (`kernels`) and compiled libraries by the code they map (`library_code`).

Imports from inspect: `model`, `parsing`, `verify` (the proofs diff reports as checks), `reading`.
Beside it: the artifact and signing rooms.
"""
