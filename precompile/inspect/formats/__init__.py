"""Readers of formats other than this project's own: upstream precompile pairs, the Mega-Cache, plain pickle values.

Imports from inspect: `model` only. Beside it: the artifact room (the static pickle machine, pycode).
"""
