"""Readers of formats other than this project's own: upstream precompile pairs, the Mega-Cache, plain pickle values."""
