"""A module whose attribute fn reads as `module.SCALE` (tests/state_cases.py)."""
SCALE = 1.5
